// PsServer: one pacer-ps parameter server (proto/pacer/ps.proto) — a thin gRPC adapter over a
// ParameterStore. Each handler authenticates (the job token or a credential minted from it,
// common/auth.h), converts the request and forwards: ToGrpcStatus(store_.Method(...)).
//
// Security (docs/tls.md): a job token is required; only insecure_no_auth on a loopback address
// (pacer-ps --insecure-no-auth, development) serves without one. TLS / mTLS from `tls`
// (common/tls.h; the files are re-read, so a rotated certificate is served without a restart);
// plaintext off loopback is refused unless tls.allow_insecure. What a client can make the
// server hold is bounded by `limits` (ps_limits.h: RESOURCE_EXHAUSTED past one); at most
// max_threads calls run at once (gRPC's resource quota), and a request larger than the
// per-request limits allow is refused by gRPC before it is parsed.
//
// Owns the gRPC server and the store; Start() binds (port 0: the OS picks) and serves on gRPC's
// threads until Shutdown() or destruction. Thread-safe.
//
// Durable rows (options.state_dir set; without it nothing touches the disk):
//  1. Start() loads STATE_DIR/ps.snapshot (ps_snapshot.h) before serving; a corrupt file fails
//     Start with DATA_LOSS naming it (never loaded, never overwritten), a missing one starts empty.
//  2. A snapshot thread saves the store every snapshot_ms when it changed since the last save.
//  3. Shutdown() (pacer-ps on SIGTERM) stops serving, then saves once more: a graceful stop loses
//     nothing. A crash (SIGKILL) loses the pushes since the last periodic save -- asynchronous PS
//     training tolerates that like a late or dropped gradient; the rows stay consistent per table.
#pragma once

#include <atomic>
#include <thread>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/tls.h"
#include "proto/pacer/ps.grpc.pb.h"
#include "worker_sdk/ps/parameter_store.h"

namespace pacer {

struct PsServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string server_id = "ps0";
  std::string job_token;  // required unless insecure_no_auth
  bool insecure_no_auth = false;  // no token checked: only on a loopback address (development)
  TlsServerOptions tls;   // cert + key: TLS; + client CA: mTLS
  PsLimits limits;        // validated by Start (PsLimits::Resolve)
  int max_threads = 8;    // calls served at once (1..1024)
  std::string state_dir;  // empty: rows in memory only
  int64_t snapshot_ms = 5'000;
};

class PsServer final : public ParameterServer::Service {
 public:
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(PsServerOptions options);
  ~PsServer() override;
  const std::string& address() const { return address_; }
  const std::string& server_id() const { return options_.server_id; }
  ParameterStore& store() { return store_; }
  // Stops serving and the snapshot thread, then saves a last snapshot (with a state dir; a
  // failure is logged, and SaveSnapshot() afterwards retries it and returns the error).
  // Idempotent.
  void Shutdown();
  // Saves the store now when it changed since the last save (no-op without a state dir).
  absl::Status SaveSnapshot();
  std::string snapshot_path() const;

  grpc::Status CreateTable(grpc::ServerContext* ctx, const CreateTableRequest* req,
                           CreateTableResponse* resp) override;
  grpc::Status Pull(grpc::ServerContext* ctx, const PullRequest* req, PullResponse* resp) override;
  grpc::Status Push(grpc::ServerContext* ctx, const PushRequest* req, PushResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const PsStatsRequest* req, PsStatsResponse* resp) override;

 private:
  explicit PsServer(PsServerOptions options, const PsLimits& limits);
  absl::Status Authorize(grpc::ServerContext* ctx) const;
  absl::Status LoadSnapshot();
  void SnapshotLoop();

  const PsServerOptions options_;
  std::optional<Authenticator> auth_;
  ParameterStore store_;
  std::atomic<uint64_t> pulls_{0}, pushes_{0};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  absl::Mutex save_mu_;  // one save at a time
  uint64_t saved_changes_ ABSL_GUARDED_BY(save_mu_) = 0;  // store_.changes() at the last save
  absl::Mutex loop_mu_;
  bool stopping_ ABSL_GUARDED_BY(loop_mu_) = false;
  std::thread snapshot_thread_;
};

}  // namespace pacer
