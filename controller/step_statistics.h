// StepStatistics: how fast each worker of a synchronous job trains, step by step, and how sure
// that figure is — so that a batch plan moves a worker off the typical speed only when its
// steps show a difference their own per-step noise does not explain.
//
// Why: the monitor's window speeds are the right input for *how* slow a worker is, but a 10 s
// window of a job with ~6 s steps holds one or two steps, and with ~12 % step-to-step noise
// (production traces) every worker's windowed speed wanders by ±10 %: a planner that believes
// each of them shifts batches on noise, and a worker given a larger batch on a lucky window is
// the slowest on the next steps — each such plan costs the job 1–2 %. What tells a real
// difference from noise is the spread of the worker's own steps: its mean over n steps is known
// to within sd/√n.
//
// Inputs: the step timings the controller observes (Controller::ObserveSteps; pacerd: every
// step report its monitor accepts; the simulator: the newest step each worker finished by each
// 1 s heartbeat). Only finished training steps count: a probe (an excluded worker's half
// batch) and a step still running (a lower bound) do not, and a step is counted once.
//
// Per worker: an exponentially weighted mean and variance of its seconds per sample (weights
// kForgetting^age in steps, so about (1 + f)/(1 − f) ≈ 39 steps' worth; a real change of speed
// moves the mean at once and dominates it within ~15 steps), the effective number of steps
// behind it n = (Σw)² / Σw², and the time of the newest step. Summary() turns them into what
// the view carries (WorkerView::step_speed, step_speed_rel_se):
//   step_speed     1 / mean seconds per sample;
//   rel. std. err. sqrt(max(own relative variance, the job's) / n) — the job's relative
//                  variance is the median over its workers with 2 steps or more (a worker with
//                  one step, or whose spread was lowered by luck, is not judged surer than the
//                  job's noise allows; one slow outlier step raises its own spread as much as
//                  its mean, so it does not make a difference "shown"). Before any worker has
//                  2 steps: 1 (nothing is shown yet). A worker whose newest step is older than
//                  the caller's stale limit (and 3 of its own steps) is left out.
// A worker that turns slow (or fast) mid-run is shown after a few steps: at the change its own
// spread grows with its mean (a 30 % slowdown at 12 % step noise: ~6 steps; at 5 %: ~5).
//
// Memory: 72 bytes and the id per worker that ever reported; Forget() drops one. Not
// thread-safe; the Controller owns one and calls it under the same lock as Reconcile.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "controller/burst_detector.h"
#include "controller/worker_slots.h"

namespace pacer {

class StepStatistics {
 public:
  static constexpr double kForgetting = 0.95;

  // Counts a finished training step (newer than the worker's last counted one). A step number
  // below the last counted one starts the worker again (a new run counts from 0).
  void Observe(const StepTiming& t);
  void Forget(const std::string& worker_id) { w_.Erase(worker_id); }
  size_t workers() const { return w_.size(); }

  struct Summary {
    double speed = 0;   // samples per compute second over its recent steps
    double rel_se = 0;  // relative standard error of that mean
    double steps = 0;   // effective number of steps behind it
  };
  // Workers with a counted step, the newest at most max(`stale_ms`, 3 of its steps) before
  // `now_ms`, by id (hashed: the Controller looks up every worker of its view).
  using SummaryMap = absl::flat_hash_map<std::string, Summary>;
  SummaryMap Summaries(int64_t now_ms, int64_t stale_ms) const;

 private:
  struct Worker {
    int64_t step = -1;      // the newest counted step
    int64_t time_ms = 0;    // when it ended
    int64_t samples = 0;    // its batch
    uint32_t count = 0;     // steps counted (capped)
    double w = 0, w2 = 0;   // Σ weights, Σ weights²
    double mean = 0;        // weighted mean seconds per sample
    double m2 = 0;          // weighted Σ w (x − mean)²
  };
  // Dense, found by StepTiming::worker_index when the caller gives it: Observe runs for every
  // step of every worker (a 4 096-worker job: thousands a second). Nothing Summaries takes
  // depends on the slots' order (the job's variance is a median).
  WorkerSlots<Worker> w_;
};

}  // namespace pacer
