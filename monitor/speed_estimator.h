// SpeedEstimator: per-worker training speed v_i (samples per *compute* second) over fixed,
// clock-aligned windows, the job median and relative speeds r_i = v_i / reference, where the
// reference is median(v) from min_workers workers with an estimate up (the median rule) and,
// for exactly two (pair_detection), the faster worker's speed (the pair rule: the median of
// two is their mean, under which neither reads as what it is). See MonitorOptions::min_workers.
//
// Why compute time: in synchronous all-reduce every worker's wall step time equals the slowest
// one's, so only the compute part tells who is slow (docs/design.md §3). The compute time of a
// report is the step's wall time minus the time blocked waiting for the others (so it includes
// data loading); the batch planner's step-time predictions use the same quantity (the
// per-worker StepTimeModel is fitted on it), so a predicted gain and the speeds measured after
// a plan speak of the same seconds.
//
// Per window each worker keeps its last `samples_kept_per_window` per-step speeds; at close the
// window speed is their median (robust to outlier steps), and with fewer than 3 steps the ratio
// of sums. The job median is the median of the workers' window speeds, so one worker, however
// hostile, moves it by at most one rank and cannot skew anyone else's r_i. Closed windows go to
// a fixed-size ring per worker (HistoryWindows() entries), so memory is
// O(workers x history windows), independent of the report rate.
//
// Workers are dense indices handed out by AddWorker(); the caller (MonitorState) maps ids.
// Thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "monitor/monitor_options.h"

namespace pacer {

// One worker in one closed window (36 bytes; an hour of 10 s windows is ~13 KiB per worker).
struct WindowSummary {
  int64_t window = -1;      // window index (time_ms / window_ms)
  float speed = 0;          // samples per compute second
  float relative = 0;       // speed / job median; 0 when the window had too few workers
  float compute_s = 0;      // mean per step
  float comm_s = 0;
  float data_wait_s = 0;
  float wall_s = 0;
  uint16_t reports = 0;
  uint8_t worker_class = 0;  // WorkerClass of the worker after this window (set by the caller)
  uint8_t persistence = 0;   // Persistence after this window (set by the caller)
};

class SpeedEstimator {
 public:
  explicit SpeedEstimator(const MonitorOptions& options);

  // Adds a worker; returns its index (0, 1, ...).
  uint32_t AddWorker();
  size_t num_workers() const { return open_.size(); }

  // Whether the worker's open window can take another report (fewer than
  // max_reports_per_worker_per_window so far; beyond that it is a flood).
  bool HasRoom(uint32_t worker) const {
    return open_[worker].reports < options_.max_reports_per_worker_per_window;
  }
  // Counts one accepted step in the open window. Returns false (nothing counted) when the
  // worker has no room left.
  bool Add(uint32_t worker, uint64_t samples, double compute_s, double comm_s, double data_wait_s,
           double wall_s);

  // Result of closing one window.
  struct Closed {
    int64_t window = -1;
    enum class Rule { kNone, kPair, kMedian };
    double median_speed = 0;          // 0 when fewer than min_workers had an estimate
    double reference_speed = 0;       // r_i = v_i / this; 0 when nobody can be compared
    Rule rule = Rule::kNone;
    std::vector<uint32_t> estimated;  // workers with an estimate this window
  };
  // Summarises the open window as `window`, appends each estimated worker's summary to its
  // history and starts a new open window. Workers without an estimate get no history entry.
  Closed CloseWindow(int64_t window);

  // Latest closed summary of `worker` (window == -1 when none); mutable so the classifier's
  // verdict can be stored with it.
  WindowSummary* Last(uint32_t worker);
  const WindowSummary* Last(uint32_t worker) const;
  // Oldest first; at most HistoryWindows() entries.
  std::vector<WindowSummary> History(uint32_t worker) const;
  // Median of the worker's last `n` window speeds (a steadier v_i for planners); 0 when none.
  double SmoothedSpeed(uint32_t worker, uint32_t n) const;

  // Bytes held (capacity of every buffer), for the memory budget.
  size_t MemoryBytes() const;

 private:
  struct Open {
    uint32_t reports = 0;
    uint32_t next_slot = 0;
    double samples = 0, compute = 0, comm = 0, data_wait = 0, wall = 0;
    std::vector<float> speeds;  // last samples_kept_per_window per-step speeds
  };
  struct Ring {
    std::vector<WindowSummary> entries;  // capacity HistoryWindows()
    uint32_t head = 0;                   // next write position
    uint32_t size = 0;
  };

  const MonitorOptions options_;
  const uint32_t history_windows_;
  std::vector<Open> open_;
  std::vector<Ring> history_;
  std::vector<float> scratch_;
  std::vector<double> medians_scratch_;
};

}  // namespace pacer
