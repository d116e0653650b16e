// ShardingClient: a worker's synchronous connection to the sharding service.
//
// Registers the worker (a new incarnation), then leases shards, reports progress, completes
// and releases them. Every call retries UNAVAILABLE / DEADLINE_EXCEEDED (pacerd restarting, a
// network blip) with capped exponential backoff and jitter until `retry_budget_ms` is spent;
// other errors return at once. Retries are safe: progress is an absolute prefix, and the server
// answers a retried report or completion of an already-ended lease with success when the
// records were counted (and FAILED_PRECONDITION when they were not).
//
// Lost replies (docs/design.md §2): a call that leases (FetchShard, or a CompleteShard /
// ReportProgress that also leases the next shard) carries a request id, increasing within this
// client and the same on every retry of that call, so a retry whose first reply was lost gets
// the same lease back. The client keeps the set of leases it holds (added when a reply grants
// one, removed when the lease is completed, released or reported ended) and the highest request
// id H such that every leasing call with an id <= H has ended (reply received, or given up);
// both are updated under one lock, so no heartbeat can see a lease's request id as ended while
// the lease is missing from the set. Every Heartbeat carries them (reports_held_leases), and
// pacerd releases, at its done prefix, a lease whose reply never arrived.
//
// Thread-safe: the SDK's Client shares one ShardingClient (one registration, one incarnation)
// between its reporter thread and the ShardReader's prefetch thread. Cancel() makes every call
// in a retry loop return CANCELLED at its next attempt (used on shutdown).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tls.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "worker_sdk/client_options.h"

namespace pacer {

struct ShardingClientOptions {
  std::string address = "127.0.0.1:7070";
  std::string token;      // the job token
  std::string worker_id;
  std::string node;
  std::string run_id;  // sent in RegisterWorker: which run of the job (docs/sharding.md, "Runs")
  int64_t rpc_timeout_ms = 10'000;
  int64_t retry_budget_ms = 120'000;  // total time to keep retrying one call
  int64_t backoff_initial_ms = 20;
  int64_t backoff_max_ms = 1'000;
  TlsClientOptions tls;  // common/tls.h; also the server name override with `credentials`
  // Default: made from `tls` by Connect (plaintext only to loopback without allow_insecure).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  LoseReplyHook test_lose_lease_reply;  // tests only: lose leasing replies (client_options.h)
  // Fills unset fields from PACER_ADDR, PACER_TOKEN, PACER_WORKER_ID, PACER_NODE and the TLS
  // fields from PACER_TLS_* / PACER_ALLOW_INSECURE.
  void FillFromEnvironment();
};

// What this client's leasing calls did (for tests and benchmarks).
struct LeasingStats {
  uint64_t fetch_calls = 0;        // FetchShard calls (each with its retries)
  uint64_t combined_calls = 0;     // CompleteShard / ReportProgress that also lease
  uint64_t leased_by_fetch = 0;    // of those, calls that ended with a lease
  uint64_t leased_by_combined = 0;
  uint64_t retried_attempts = 0;   // attempts after the first (a lost reply or an outage)
  uint64_t given_up = 0;           // calls that ended without an answer
};

class ShardingClient {
 public:
  // Connects and registers a new incarnation of options.worker_id.
  static absl::StatusOr<std::unique_ptr<ShardingClient>> Connect(ShardingClientOptions options);

  // Registers a new incarnation (after the service declared this worker lost, or to start
  // over): the previous incarnation's leases end, and registration() lists the final done
  // prefixes of every remembered lease of the earlier incarnations.
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
  // Reports progress and leases the next shard of `next_dataset` in the same durable call
  // (a worker near the end of its lease). The reply's `next` is what Fetch would have answered;
  // it is absent (has_next() false) from a pacerd that predates the combined call.
  absl::StatusOr<ProgressResponse> ReportProgressAndFetch(const Lease& lease, uint64_t records_done,
                                                          const std::string& next_dataset);
  absl::Status Complete(const Lease& lease);
  // Completes `lease` and leases the next shard of `next_dataset` in one durable call: one group
  // commit per shard instead of two. On an error nothing was leased for this call (a lease the
  // service granted anyway is released after the next heartbeat); the completion itself is
  // answered as Complete's. `next` is absent from a pacerd that predates the combined call.
  absl::StatusOr<CompleteShardResponse> CompleteAndFetch(const Lease& lease,
                                                         const std::string& next_dataset);
  absl::Status Release(const Lease& lease, uint64_t records_done, bool failed,
                       const std::string& detail = "");
  // Sends `request` (worker, incarnation and the held leases filled in here) and drops the
  // leases the reply says ended from the held set.
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);

  // The leases this client holds (granted, not known to have ended), ascending.
  std::vector<uint64_t> HeldLeases() const;
  // Stops listing `lease_id` as held (a reader dropped a lease it will never read): pacerd
  // releases it at its done prefix at the next heartbeat.
  void ForgetLease(uint64_t lease_id);
  // The highest request id H such that every leasing call with an id <= H has ended.
  uint64_t last_ended_request_id() const;
  LeasingStats leasing_stats() const;
  // Leasing calls now in flight (a test kills pacerd while one is).
  size_t leasing_calls_in_flight() const;
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
  // A request about `lease` from this worker's incarnation (worker, incarnation, lease, token).
  template <typename Req>
  Req AboutLease(const Lease& lease) const {
    Req req;
    req.set_worker_id(options_.worker_id);
    req.set_incarnation(incarnation());
    req.set_lease_id(lease.lease_id());
    req.set_fencing_token(lease.fencing_token());
    return req;
  }
  // Runs `call` with a fresh context until it succeeds, fails permanently or the budget ends.
  // `lease_request_id` (non-zero for a leasing call) is what the test hook is asked about.
  absl::Status Retry(const char* what, const std::function<grpc::Status(grpc::ClientContext*)>& call,
                     uint64_t lease_request_id = 0);
  // A leasing call begins: a fresh request id, counted in flight until EndLeasing.
  uint64_t BeginLeasing(bool combined);
  // It ended: `granted` (a reply that leased a shard, or null) joins the held set and the id
  // leaves the in-flight set, atomically.
  // `ended_lease` (non-zero) leaves the held set in the same step (a combined completion).
  void EndLeasing(uint64_t request_id, bool combined, const absl::Status& status,
                  const FetchShardResponse* granted, uint64_t ended_lease = 0);
  void Ended(uint64_t lease_id);  // the lease ended: no longer held
  void FillHeld(HeartbeatRequest* req) const;

  ShardingClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ShardingService::Stub> stub_;
  RegisterWorkerResponse registration_;
  absl::Mutex jitter_mu_;
  std::mt19937_64 jitter_ ABSL_GUARDED_BY(jitter_mu_);
  std::atomic<bool> cancelled_{false};

  mutable absl::Mutex held_mu_;
  uint64_t last_request_id_ ABSL_GUARDED_BY(held_mu_) = 0;          // the newest id handed out
  std::set<uint64_t> leasing_in_flight_ ABSL_GUARDED_BY(held_mu_);  // request ids not yet ended
  std::set<uint64_t> held_ ABSL_GUARDED_BY(held_mu_);               // lease ids
  LeasingStats leasing_stats_ ABSL_GUARDED_BY(held_mu_);
};

}  // namespace pacer
