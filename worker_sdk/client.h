// Client: a worker's connection to its job's pacerd (docs/design.md §1, §6).
//
// Connect() registers the worker with the sharding service (a new incarnation; the reply lists
// the remembered leases its earlier incarnations held, with their final done prefix) and with the
// monitor, then starts one background *reporter* thread. Every heartbeat interval (from the
// registration reply unless overridden) the reporter sends, in this order:
//   1. one Sharding Heartbeat carrying every queued progress report (absolute done prefixes,
//      the newest per lease), the training step and the newest batch-plan version held; the
//      reply renews the worker's leases and carries cancelled leases and WorkerCommands;
//   2. a CompleteShard for every lease the trainer finished (queued, idempotent on retry);
//      one queued with EnqueueCompletionAndFetch also leases the next shard in the same
//      durable call, and hands the answer to the listener that asked for it (a ShardReader);
//   3. one Monitor ReportSteps with the queued StepTimer reports.
// Queued completions and Flush() wake it early. A report leaves the queue only when pacerd
// acknowledged it (the heartbeat returned OK and did not list the lease as cancelled), so a
// pacerd restart or a network outage loses nothing: the reporter retries with capped backoff
// and jitter (ShardingClient), and resending an absolute prefix is idempotent.
//
// The training thread only touches in-memory queues and atomics: EnqueueProgress,
// EnqueueCompletion, EnqueueStep (a short uncontended mutex each), stop_requested(),
// batch_plan().ForStep(). No RPC ever runs on it except the explicitly blocking calls
// (Flush, and sharding() used by ShardReader's own prefetch thread).
//
// Listeners (AddListener) hear acknowledgements and cancelled leases on the reporter thread,
// with the listener lock held: they must be quick and must not call Add/RemoveListener.
//
// Errors: Connect() returns INVALID_ARGUMENT (missing id/token), UNAUTHENTICATED (wrong token,
// at once, no retry) or UNAVAILABLE (pacerd unreachable for connect_budget_ms). Afterwards a
// permanent background failure (this incarnation was replaced or declared lost, the token was
// revoked) is latched in health(); transient ones are retried forever and counted in stats().
//
// Lost replies: the heartbeat lists the leases this worker holds (ShardingClient), so a lease
// whose fetch reply never arrived is released by pacerd instead of being renewed for ever.
//
// Thread-safe. Close() (or the destructor) flushes for a bounded time, then stops the thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>  // std::once_flag
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/sharding.pb.h"
#include "worker_sdk/batch_plan.h"
#include "worker_sdk/client_options.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {

class ReportListener {
 public:
  virtual ~ReportListener() = default;
  // pacerd counted the first `records_done` records of `lease_id` (durably).
  virtual void OnAcknowledged(uint64_t lease_id, uint64_t records_done) {}
  // The lease ended elsewhere (expired, fenced, restored): stop reading it; reports of its
  // records past the counted prefix were not counted.
  virtual void OnLeaseCancelled(uint64_t lease_id) {}
  // Only to the listener that queued a completion with EnqueueCompletionAndFetch, exactly once
  // per such completion: what leasing the next shard answered (OK: FetchShard's answer), or why
  // nothing was leased (the completion failed or will be retried plainly, the client stopped,
  // UNIMPLEMENTED from a pacerd without the combined call). Called with the listener lock held,
  // before the completion counts as acknowledged (so Flush() returns after it).
  virtual void OnNextLease(uint64_t completed_lease_id,
                           const absl::StatusOr<FetchShardResponse>& next) {}
};

struct ClientStats {
  uint64_t heartbeats_ok = 0;
  uint64_t heartbeat_failures = 0;  // attempts cycles that ended without an answer
  uint64_t progress_acked = 0;      // progress reports acknowledged
  uint64_t completions_acked = 0;
  uint64_t leases_cancelled = 0;
  uint64_t leases_released_unknown = 0;  // released by pacerd: their fetch reply was lost
  uint64_t steps_sent = 0;
  uint64_t steps_rejected = 0;      // by the monitor's validation
  uint64_t steps_dropped = 0;       // queue over its bound while the monitor was unreachable
  uint64_t monitor_reregistrations = 0;
  uint64_t plans_received = 0;
  uint64_t regroups_received = 0;  // RegroupCommands newer than the generation held
  uint64_t exclusions_received = 0;  // ExclusionCommands newer than the version held
  uint64_t step_line_reports = 0;    // heartbeats sent at once for a step past its line
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& worker_id() const { return options_.worker_id; }
  const ClientOptions& options() const { return options_; }
  const RegisterWorkerResponse& registration() const { return sharding_->registration(); }
  int64_t heartbeat_interval_ms() const { return interval_ms_; }

  // ---- training thread: never blocks on the network ----
  // Queues `records_done` (absolute prefix) for `lease`; a newer prefix replaces an older one.
  void EnqueueProgress(const Lease& lease, uint64_t records_done);
  // Queues the completion of `lease` (all its records done); supersedes its progress.
  void EnqueueCompletion(const Lease& lease);
  // The same, and the completion also leases the next shard of `next_dataset` (one durable call
  // per shard); `listener` (registered with AddListener) hears the answer in OnNextLease.
  void EnqueueCompletionAndFetch(const Lease& lease, const std::string& next_dataset,
                                 ReportListener* listener);
  void EnqueueStep(const StepReport& report);
  // The step in progress, for the heartbeat's per-step deadline (HeartbeatRequest.step_timings:
  // pacerd's burst rule sees a worker in a burst before its slow step ends, and can exclude it
  // in the reply to that heartbeat). StepTimer calls these: a step began at `begin_ns` (on
  // `clock`'s monotonic scale) computing `samples` (0: not said; the running step is then not
  // reported, only finished ones); a data-wait / communication phase opened at `open_ns` (0:
  // none open) with `phase_ns` spent in such phases before; the step ended. Sent only with
  // options().honors_exclusion (the rule excludes nobody otherwise).
  void NoteStepBegun(const Clock* clock, uint64_t step, int64_t begin_ns, uint64_t samples);
  void NoteStepPhase(int64_t phase_ns, int64_t open_ns);
  void NoteStepEnded();
  // The running step's progress (StepTimer::NoteProgress): `samples_done` of its samples were
  // computed in its first `compute_ns` of compute (HeartbeatStepTiming.samples_done).
  void NoteStepProgress(uint64_t samples_done, int64_t compute_ns);
  void SetStep(uint64_t step) { step_.store(step, std::memory_order_relaxed); }
  LocalBatchPlan& batch_plan() { return plan_; }
  // A stop command arrived (finish the current step and exit).
  bool stop_requested() const { return stop_requested_.load(std::memory_order_acquire); }
  // The newest collective generation pacerd announced (RegroupCommand; 0: none) or the
  // collective noted as held (NoteRegroupGeneration), whichever is newer. A collective built
  // under an older generation must be rebuilt (ElasticGlooCollective::Regroup) at the next
  // step boundary. The heartbeat reports it, so pacerd stops resending the command.
  uint64_t regroup_generation() const { return regroup_generation_.load(std::memory_order_acquire); }
  // The collective now holds `generation` (monotonic: an older one is ignored).
  void NoteRegroupGeneration(uint64_t generation);
  std::string stop_reason() const;
  // EXCLUDE_WORKERS (options().honors_exclusion): the job's steps do not wait for this worker
  // now. While excluded, a trainer joins each all-reduce with weight 0, hands its leases back
  // (ShardReader::ReleaseAll) and trains on nothing, but still times a small probe batch of
  // data it already holds and reports it (StepTimer), so the controller sees it recover and
  // re-includes it. Flips only at heartbeat replies; read it once per step.
  bool excluded() const { return (exclusion_.load(std::memory_order_acquire) & 1) != 0; }
  // The step line (HeartbeatResponse.step_line_s; options().honors_exclusion only): compute
  // seconds past which this worker's running step is a burst's under pacerd's burst rule, from
  // the newest heartbeat reply; 0: none now. StepTimer::PastStepLine compares the running step
  // with it.
  double step_line_s() const { return step_line_s_.load(std::memory_order_acquire); }
  // The running step passed the step line: sends a heartbeat now -- it carries the running
  // step's compute so far, and pacerd's burst rule decides inside it -- and blocks until its
  // reply arrives or `timeout_ms` passes (DEADLINE_EXCEEDED; the heartbeat goes on). Returns
  // excluded() after that reply: true, the trainer abandons the step (weight 0 in the
  // all-reduce, its records handed back uncounted: ShardReader::ReleaseAll's `trained_through`);
  // false, it finishes the step. A worker past the line whom the rule leaves in (its cap is
  // full) would otherwise send a heartbeat every step: within one heartbeat interval of a
  // report that did not exclude it, this returns excluded() at once without sending one.
  // Training thread; the one blocking call of a step, about one round trip to pacerd.
  absl::StatusOr<bool> ReportStepPastLine(int64_t timeout_ms);
  // The version (audit id) of the newest ExclusionCommand held; 0: none.
  uint64_t exclusion_version() const { return exclusion_.load(std::memory_order_acquire) >> 1; }

  // ---- any thread ----
  // Blocks until everything queued before the call is acknowledged, or `timeout_ms` passes
  // (DEADLINE_EXCEEDED), or health() fails.
  absl::Status Flush(int64_t timeout_ms);
  // OK, or the first permanent failure of the reporter.
  absl::Status health() const;
  ClientStats stats() const;
  void AddListener(ReportListener* listener);
  void RemoveListener(ReportListener* listener);
  // The shared synchronous client (thread-safe); for fetches and checkpoints off the
  // training path.
  ShardingClient& sharding() { return *sharding_; }
  // Flushes for up to `flush_timeout_ms`, then stops the reporter. Idempotent.
  void Close(int64_t flush_timeout_ms = 5'000);

 private:
  struct PendingProgress {
    ProgressRequest request;  // records_done is the newest queued prefix
  };
  struct PendingCompletion {
    Lease lease;
    std::string next_dataset;           // non-empty: lease the next shard in the same call
    ReportListener* next_for = nullptr;  // who hears the next lease
  };

  Client(ClientOptions options, std::unique_ptr<ShardingClient> sharding);
  absl::Status RegisterWithMonitor();
  void ReporterLoop();
  // One round: heartbeat + completions + step reports. Returns false when the client stops.
  void ReportOnce();
  void SendHeartbeat();
  void SendCompletions();
  void SendSteps();
  void Acknowledge(uint64_t lease_id, uint64_t records_done);
  void Cancelled(uint64_t lease_id);
  // Hands `next` to `listener` if it is still registered; a lease nobody will read is forgotten
  // (pacerd releases it at the next heartbeat).
  void DeliverNext(ReportListener* listener, uint64_t completed_lease_id,
                   const absl::StatusOr<FetchShardResponse>& next);
  // Every queued completion that asked for a next lease gets `why` instead and stays a plain
  // completion.
  void AbandonNextLeases(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  void LatchPermanent(const absl::Status& s);
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientOptions options_;
  std::unique_ptr<ShardingClient> sharding_;
  std::shared_ptr<grpc::Channel> monitor_channel_;
  std::unique_ptr<Monitor::Stub> monitor_;
  int64_t interval_ms_ = 1'000;
  LocalBatchPlan plan_;
  std::atomic<uint64_t> step_{0};
  std::atomic<bool> stop_requested_{false};
  std::atomic<uint64_t> regroup_generation_{0};
  std::atomic<uint64_t> exclusion_{0};  // version << 1 | excluded (reporter thread writes)
  std::atomic<bool> monitor_enabled_{true};
  std::atomic<double> step_line_s_{0};

  // Guards everything below until listeners_mu_. The reporter and Flush wait on it
  // (absl::Mutex::Await: conditions are re-evaluated whenever it is released).
  mutable absl::Mutex mu_;
  std::map<uint64_t, PendingProgress> progress_ ABSL_GUARDED_BY(mu_);  // by lease id
  std::map<uint64_t, PendingCompletion> completions_ ABSL_GUARDED_BY(mu_);
  std::vector<StepReport> steps_ ABSL_GUARDED_BY(mu_);
  // For the heartbeat's step timings: the newest step ended (not yet carried by a heartbeat)
  // and the one running.
  struct RunningStep {
    const Clock* clock = nullptr;
    bool running = false;
    uint64_t step = 0;
    int64_t begin_ns = 0;
    int64_t phase_ns = 0;  // data wait + communication so far
    int64_t open_ns = 0;   // a phase is open since (0: none)
    uint64_t samples = 0;
    uint64_t samples_done = 0;   // NoteStepProgress (0: none yet)
    int64_t done_compute_ns = 0;
  };
  RunningStep running_ ABSL_GUARDED_BY(mu_);
  StepReport newest_step_ ABSL_GUARDED_BY(mu_);
  bool newest_step_sent_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // reports taken by the reporter, not yet answered
  bool urgent_ ABSL_GUARDED_BY(mu_) = false;
  // Heartbeats built (their request taken) and ended (answered or failed): a heartbeat built
  // after a call is the next one begun (ReportStepPastLine).
  uint64_t heartbeats_begun_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t heartbeats_ended_ ABSL_GUARDED_BY(mu_) = 0;
  // When the last ReportStepPastLine's heartbeat ended without excluding this worker.
  std::chrono::steady_clock::time_point line_report_kept_in_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  ClientStats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex listeners_mu_;
  std::vector<ReportListener*> listeners_ ABSL_GUARDED_BY(listeners_mu_);

  std::thread reporter_;
  std::once_flag closed_;
};

}  // namespace pacer
