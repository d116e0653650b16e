// LocalBatchPlan (the SDK's BatchPlan; the controller's BatchPlan is the job-wide plan it
// derives commands from): this worker's local batch for the current step (docs/design.md §4).
//
// The controller sends plans on heartbeat replies (BatchPlanCommand: version, effective_step,
// micro_batch, accumulation_steps, samples). A plan takes effect at its effective step: the
// training thread asks ForStep(step) at the start of every step, and a pending plan whose
// effective step has been reached replaces the current one. Plans only move forward: an offer
// with a version not above the newest held is ignored. A plan that arrives after its effective
// step applies at the next ForStep (gradient averaging weights by the samples each worker
// actually used, so a late switch changes speed, never correctness).
//
// Thread-safety: Offer() and newest_version() from any thread (the Client's reporter thread);
// ForStep() and current() from one thread only (the training thread). ForStep costs one
// atomic load when nothing is pending.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/pacer/sharding.pb.h"

namespace pacer {

struct LocalBatch {
  uint64_t version = 0;          // 0: the initial plan, not from the controller
  uint64_t effective_step = 0;
  uint32_t micro_batch = 1;      // samples per forward/backward pass
  uint32_t accumulation_steps = 1;
  uint64_t global_batch = 0;     // 0 when unknown
  uint64_t samples() const { return uint64_t{micro_batch} * accumulation_steps; }
};

class LocalBatchPlan {
 public:
  explicit LocalBatchPlan(LocalBatch initial);

  // Queues a plan; returns false (and ignores it) when it is not newer or is malformed
  // (micro_batch or accumulation_steps of 0).
  bool Offer(const BatchPlanCommand& command);
  // The plan in force at `step` (training thread).
  const LocalBatch& ForStep(uint64_t step);
  const LocalBatch& current() const { return current_; }
  uint64_t newest_version() const { return newest_version_.load(std::memory_order_acquire); }

 private:
  LocalBatch current_;  // training thread only
  std::atomic<bool> has_pending_{false};
  std::atomic<uint64_t> newest_version_{0};
  absl::Mutex mu_;
  std::vector<LocalBatch> pending_ ABSL_GUARDED_BY(mu_);  // ascending version
};

}  // namespace pacer
