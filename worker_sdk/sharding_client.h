// ShardingClient: a worker's synchronous connection to the sharding service.
//
// Registers the worker (a new incarnation), then leases shards, reports progress, completes
// and releases them. Every call retries UNAVAILABLE / DEADLINE_EXCEEDED (pacerd restarting, a
// network blip) with capped exponential backoff and jitter until `retry_budget_ms` is spent;
// other errors return at once. Retries are safe: progress is an absolute prefix, and the server
// answers a retried report or completion of an already-ended lease with success when the
// records were counted (and FAILED_PRECONDITION when they were not).
//
// Thread-safe: the SDK's Client shares one ShardingClient (one registration, one incarnation)
// between its reporter thread and the ShardReader's prefetch thread. Cancel() makes every call
// in a retry loop return CANCELLED at its next attempt (used on shutdown).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/pacer/sharding.grpc.pb.h"

namespace pacer {

struct ShardingClientOptions {
  std::string address = "127.0.0.1:7070";
  std::string token;      // the job token
  std::string worker_id;
  std::string node;
  int64_t rpc_timeout_ms = 10'000;
  int64_t retry_budget_ms = 120'000;  // total time to keep retrying one call
  int64_t backoff_initial_ms = 20;
  int64_t backoff_max_ms = 1'000;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // default: insecure (loopback)
  // Fills unset fields from PACER_ADDR, PACER_TOKEN, PACER_WORKER_ID, PACER_NODE.
  void FillFromEnvironment();
};

class ShardingClient {
 public:
  // Connects and registers a new incarnation of options.worker_id.
  static absl::StatusOr<std::unique_ptr<ShardingClient>> Connect(ShardingClientOptions options);

  // Registers a new incarnation (after the service declared this worker lost, or to start
  // over): the previous incarnation's leases end, and registration() lists their final done
  // prefixes.
  absl::Status Reregister();
  // True for the FAILED_PRECONDITION a lost or replaced incarnation gets.
  static bool IsIncarnationGone(const absl::Status& status);

  const RegisterWorkerResponse& registration() const { return registration_; }
  uint64_t incarnation() const { return registration_.incarnation(); }
  const std::string& worker_id() const { return options_.worker_id; }

  // Registers (or re-registers identically) a dataset; true if this call created it.
  absl::StatusOr<bool> RegisterDataset(const DatasetSpec& spec);
  absl::StatusOr<FetchShardResponse> Fetch(const std::string& dataset);
  // Returns the lease's done prefix after the report.
  absl::StatusOr<uint64_t> ReportProgress(const Lease& lease, uint64_t records_done);
  absl::Status Complete(const Lease& lease);
  absl::Status Release(const Lease& lease, uint64_t records_done, bool failed,
                       const std::string& detail = "");
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  absl::Status SaveCheckpoint(const std::string& tag);
  absl::Status RestoreCheckpoint(const std::string& tag);
  absl::StatusOr<ListDatasetsResponse> ListDatasets();

  ShardingService::Stub* stub() { return stub_.get(); }
  const ShardingClientOptions& options() const { return options_; }

  // Stops retrying: calls in progress return CANCELLED at their next attempt, new calls at once.
  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  explicit ShardingClient(ShardingClientOptions options);
  // Runs `call` with a fresh context until it succeeds, fails permanently or the budget ends.
  absl::Status Retry(const char* what, const std::function<grpc::Status(grpc::ClientContext*)>& call);

  ShardingClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ShardingService::Stub> stub_;
  RegisterWorkerResponse registration_;
  std::mutex jitter_mu_;
  std::mt19937_64 jitter_;  // guarded by jitter_mu_
  std::atomic<bool> cancelled_{false};
};

}  // namespace pacer
