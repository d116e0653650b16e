// PsServer: one pacer-ps parameter server (proto/pacer/ps.proto) — a thin gRPC adapter over a
// ParameterStore. Each handler authenticates (the job token, when one is configured), converts
// the request and forwards: ToGrpcStatus(store_.Method(...)).
//
// Owns the gRPC server and the store; Start() binds (port 0: the OS picks) and serves on gRPC's
// threads until Shutdown() or destruction. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "proto/pacer/ps.grpc.pb.h"
#include "worker_sdk/ps/parameter_store.h"

namespace pacer {

struct PsServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string server_id = "ps0";
  std::string job_token;  // empty: no authentication (tests on loopback only)
};

class PsServer final : public ParameterServer::Service {
 public:
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(PsServerOptions options);
  ~PsServer() override;
  const std::string& address() const { return address_; }
  const std::string& server_id() const { return options_.server_id; }
  ParameterStore& store() { return store_; }
  void Shutdown();

  grpc::Status CreateTable(grpc::ServerContext* ctx, const CreateTableRequest* req,
                           CreateTableResponse* resp) override;
  grpc::Status Pull(grpc::ServerContext* ctx, const PullRequest* req, PullResponse* resp) override;
  grpc::Status Push(grpc::ServerContext* ctx, const PushRequest* req, PushResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const PsStatsRequest* req, PsStatsResponse* resp) override;

 private:
  explicit PsServer(PsServerOptions options);
  absl::Status Authorize(grpc::ServerContext* ctx) const;

  const PsServerOptions options_;
  std::optional<Authenticator> auth_;
  ParameterStore store_;
  std::atomic<uint64_t> pulls_{0}, pushes_{0};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace pacer
