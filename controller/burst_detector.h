// BurstDetector: the step-granular burst rule for synchronous jobs.
//
// A short burst of contention (a 4× slowdown for ~20 s) holds every step of a sync job back,
// and it is over before a window-based detector (K of W windows of 10 s) has seen it. This rule
// decides on each worker's newest *step*: a worker whose last step, at the batch it trains on,
// took more than `step_factor` × the median worker's step is not waited for (EXCLUDE_WORKERS:
// weight 0 in the all-reduce, leases handed back); it is waited for again once a newer timing
// (its probe: an excluded trainer times half its batch every ~2 s) is back within
// `rejoin_factor` × the median. Workers are taken slowest first while dropping them raises the
// predicted throughput (1 − dropped share of the batch) / (slowest counted step), at most
// BurstExclusionCap (`max_workers`, or `max_fraction` of the fresh workers when that is more).
//
// Inputs are plain per-step timings, the same in pacerd and the simulator:
//   - Observe(timing) for every step a worker reports (with its heartbeat, ~1 s);
//   - Decide(excluded now, config, now) once per heartbeat interval: a pure function of the
//     newest timing per worker, the exclusion in force and the clock.
// A step still running at a heartbeat counts with the time it has taken so far, when that
// is longer than the newest finished step's (a per-step deadline).
// A worker whose newest timing is older than max(kMinFreshS, kFreshSteps × its own step) is not
// counted (it went quiet; an excluded one is waited for again). Steps are compared in seconds
// per sample × the worker's training batch, so a batch plan or a half-batch probe does not look
// like a burst. Per-step noise does not trigger it: a factor of 2 is beyond the tail of ordinary
// step-to-step variation (std ~12 % in production traces), and the rule needs no window.
//
// Memory: one small record per worker (the newest timing). Not thread-safe; the Controller
// owns one and calls it under the same lock as Reconcile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "controller/policy_config.h"
#include "controller/worker_slots.h"

namespace pacer {

// One step of one worker, as its trainer timed it.
struct StepTiming {
  std::string worker_id;
  int64_t step = 0;      // the job's step number the timing is for (newer steps replace older)
  // The worker's own seconds for the step: forward, backward (and accumulation) of its local
  // batch, up to the moment it enters the all-reduce — not the wait for others in the
  // collective (which every worker of a sync step shares). The SDK's StepReport.compute_s.
  double compute_s = 0;
  int64_t samples = 0;   // samples computed in that time (its local batch; a probe's half batch)
  int64_t time_ms = 0;   // when the step ended (pacerd: when the heartbeat carrying it arrived)
  bool probe = false;    // an excluded worker's probe step (gradient discarded)
  // The step is still running at the heartbeat (the trainer has not entered the all-reduce
  // yet): compute_s is the time so far, a lower bound. A per-step deadline: a worker in a burst
  // is seen before its first slow step ends. Replaced by the step's own timing when it ends.
  bool in_progress = false;
  // The step's wall seconds, when known (its start is time_ms − wall_s): pacerd tells a probe
  // by when the step started (WorkerSessions::ProbeStep). 0: unknown.
  double wall_s = 0;
  // A lookup hint, not identity: the caller's own dense index of worker_id + 1 (0: none; the
  // simulator gives its worker index, pacerd none). worker_slots.h.
  uint32_t worker_index = 0;
};

// What Decide() concludes. `excluded` is the whole new set (sorted); `added` and `rejoined` are
// the changes against the set in force. A change to make is an EXCLUDE_WORKERS action: the
// rejoin mandatory (waiting for everyone is the default), the addition with `predicted_gain`.
struct BurstDecision {
  std::vector<std::string> excluded;
  std::vector<std::string> added;
  std::vector<std::string> rejoined;
  double predicted_gain = 0;  // throughput with `excluded` dropped vs waiting for everyone − 1
  double median_step_s = 0;   // the median worker's step at its batch (0: too few workers)
  std::string add_reason, rejoin_reason;
};

class BurstDetector {
 public:
  // A timing is counted this long at least, and for kFreshSteps of the worker's own steps.
  static constexpr double kMinFreshS = 5;
  static constexpr double kFreshSteps = 3;

  // Keeps the newest timing per worker (a higher step, or the same step later). Timings with
  // no samples or a non-positive / non-finite compute_s are ignored.
  void Observe(const StepTiming& t);
  // A worker that left the job (its timings are dropped).
  void Forget(const std::string& worker_id) { w_.Erase(worker_id); }
  void Clear() { w_.Clear(); }
  // Whether any worker's timing is fresh at `now_ms`: the rule has inputs (pacerd feeds them).
  bool HasFreshTimings(int64_t now_ms) const;
  size_t workers() const { return w_.size(); }
  // Samples per compute second of the worker's newest finished step (or probe), when fresh.
  std::optional<double> NewestSpeed(const std::string& worker_id, int64_t now_ms) const;

  // The rule (see above) with BurstExclusionCap(cfg, fresh workers), cfg.step_factor, cfg.rejoin_factor; needs at
  // least three fresh workers, else everyone is waited for.
  BurstDecision Decide(const std::vector<std::string>& excluded_now,
                       const BurstExclusionConfig& cfg, int64_t now_ms) const;
  // The worker's step as Decide() weighs it (seconds at its training batch, at its newest
  // timing's pace, a running step's time so far included), when it has a fresh timing.
  std::optional<double> StepSeconds(const std::string& worker_id, int64_t now_ms) const;

 private:
  struct Worker {
    int64_t step = -1;
    int64_t time_ms = 0;
    double per_sample_s = 0;  // newest timing's compute_s / samples
    int64_t batch = 0;        // samples of its newest training (non-probe) step
    bool probe = false;
    // The newest in-progress report of a later step than `step` (0: none): seconds per
    // sample so far.
    int64_t running_step = -1;
    double running_per_sample_s = 0;
  };
  // Whether the worker's newest timing still counts at `now_ms` (see kMinFreshS). Here, to
  // be inlined into Decide's pass over every worker.
  bool Fresh(const Worker& w, int64_t now_ms) const {
    const double step_s = w.per_sample_s * static_cast<double>(w.batch);
    const double fresh_s = std::max(kMinFreshS, kFreshSteps * step_s);
    return static_cast<double>(now_ms - w.time_ms) <= fresh_s * 1000;
  }
  // A fresh worker's step as Decide() weighs it (those it may exclude).
  struct Step {
    const std::string* id;
    const Worker* record;
    double s;      // seconds for a step at its training batch, at its newest timing's pace
    double batch;  // its training batch
    bool was;      // excluded now (set for the steps above the rejoin line only)
  };
  // Decide's one pass over the fresh workers (burst_detector.cc): their number and batch, the
  // steps in [lo, hi] (in select_) and the number below it, the steps above `line` (in steps_)
  // and the slowest of the others.
  struct Gathered {
    size_t n = 0, below = 0, in = 0;
    double batch_sum = 0, rest_slowest = 0;
  };
  Gathered Gather(int64_t now_ms, double lo, double hi, double line) const;
  // By worker id, dense (worker_slots.h: a heartbeat of a 4 096-worker job is 4 096 timings,
  // found by StepTiming::worker_index when the caller gives it). Nothing depends on the slots'
  // order: Decide sorts what it reads (ties by id) and sums integers.
  WorkerSlots<Worker> w_;
  // Decide()'s working buffers, kept for their capacity (at 4 096 workers a decision, one
  // every heartbeat and at every step line, allocated ~200 KB), and the last median, around
  // which the next one is looked for first (burst_detector.cc). Neither changes a decision:
  // Decide is a function of the timings, the exclusion in force and the clock.
  mutable std::vector<Step> steps_;
  mutable std::vector<double> select_;
  mutable double median_guess_ = 0;
};

}  // namespace pacer
