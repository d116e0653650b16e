// BatchPlan: the per-worker local batches of a synchronous job, as the controller sends them.
//
// A plan is a value. Invariants (BatchPlanner guarantees them, CheckBatchPlan verifies):
//  * Σ samples over workers == global_batch exactly;
//  * for every worker: 1 ≤ accumulation, micro_batch ≤ cap (when the worker has one), and the
//    worker trains on `accumulation` micro-batches of sizes differing by at most one that sum to
//    `samples` (so micro_batch == ceil(samples / accumulation));
//  * workers are sorted by id, ids unique;
//  * versions only grow; every worker switches to the plan at `effective_step`.
// Gradients are averaged weighted by `samples`, so one step equals a step on equal batches.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pacer {

struct WorkerBatch {
  std::string worker_id;
  int64_t samples = 0;       // b_i: samples this worker contributes to one global step
  int64_t micro_batch = 0;   // m_i: largest micro-batch (≤ memory cap)
  int64_t accumulation = 1;  // k_i: micro-batches per step
  double predicted_step_s = 0;
};

struct BatchPlan {
  uint64_t version = 0;
  int64_t effective_step = 0;
  int64_t global_batch = 0;
  std::vector<WorkerBatch> workers;
  double predicted_step_s = 0;  // slowest worker's predicted time under this plan
  // Each worker's speed share v_i / Σv when the plan was made: the hysteresis baseline.
  std::map<std::string, double> basis_share;

  const WorkerBatch* Find(const std::string& worker_id) const {
    for (const auto& w : workers)
      if (w.worker_id == worker_id) return &w;
    return nullptr;
  }
  int64_t TotalSamples() const {
    int64_t s = 0;
    for (const auto& w : workers) s += w.samples;
    return s;
  }
};

// FAILED_PRECONDITION (internal error text) when `plan` breaks an invariant above; caps are
// the per-worker micro-batch limits (0 = none).
absl::Status CheckBatchPlan(const BatchPlan& plan, const std::map<std::string, int64_t>& caps);

}  // namespace pacer
