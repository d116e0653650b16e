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
// hostile, moves it by at most one rank and cannot skew anyone else's r_i.
//
// Memory: windows, never raw reports, in two tiers per worker, allocated when it is added and
// independent of the report rate and of how long the job runs:
//   recent  the last R = min(H, max(persistent_w, smoothed_windows, stable_smoothed_windows))
//           closed windows at full resolution — everything the classifier and the smoothed
//           speed read (H = HistoryWindows(), history_ms / window_ms);
//   coarse  the rest of history_ms, older windows merged C = ceil((H − R) / kCoarseEntries)
//           at a time into K = ceil((H − R) / C) <= kCoarseEntries entries, plus the one
//           being filled (C = 1 while H − R <= kCoarseEntries: short histories are kept whole).
// So History() covers the last R + K x C (>= H) windows, plus up to C − 1 being merged.
// Per worker: (R + K) x sizeof(WindowSummary) + sizeof(Merge) + samples_kept_per_window x 4
// + sizeof(Open) + 2 x sizeof(Tier) bytes — about 3.3 KiB at the defaults (10 s windows, 1 h:
// R = 10, C = 6, K = 59; 1 s windows: C = 57, K = 63), where a ring of every window of the
// hour held 14 KiB (360 windows; 141 KiB with 1 s windows). MemoryBytes() counts them.
//
// Workers are dense indices handed out by AddWorker(); the caller (MonitorState) maps ids.
// Thread-compatible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "monitor/monitor_options.h"

namespace pacer {

// One worker in one closed window, or (History()'s coarse entries) `windows` consecutive
// closed windows merged: means of the speeds and times, reports summed, the class of the last.
// 40 bytes.
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
  uint16_t windows = 1;      // closed windows this entry stands for (> 1: a coarse entry)
};
static_assert(sizeof(WindowSummary) == 40);

class SpeedEstimator {
 public:
  explicit SpeedEstimator(const MonitorOptions& options);

  // Adds a worker; returns its index (0, 1, ...).
  uint32_t AddWorker();
  // Forgets the worker's open window and history, as if just added (a new run of the job).
  void Forget(uint32_t worker);
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
    // kLast: every estimate of the window was a running step's bound (a sync job's others wait
    // in the all-reduce and finish no step either); they are compared with the reference of
    // the last window that had one (CloseWindow's `last_reference`).
    enum class Rule { kNone, kPair, kMedian, kLast };
    double median_speed = 0;          // 0 when fewer than min_workers had an estimate
    double reference_speed = 0;       // r_i = v_i / this; 0 when nobody can be compared
    Rule rule = Rule::kNone;
    std::vector<uint32_t> estimated;  // workers with an estimate this window
  };
  // The step the worker is computing, as its newest heartbeat said (samples it computes,
  // compute seconds so far; and its progress when the heartbeat carried one: `samples_done` of
  // them in its first `done_compute_s`); the newest note of the open window counts. Its speed
  // estimate is the lower of the step's bound, samples / compute_s, and the speed measured so
  // far, samples_done / done_compute_s. The caller checks the values (MonitorState).
  void NoteRunning(uint32_t worker, uint64_t samples, double compute_s, uint64_t samples_done = 0,
                   double done_compute_s = 0) {
    double speed = static_cast<double>(samples) / compute_s;
    if (samples_done > 0 && done_compute_s > 0)
      speed = std::min(speed, static_cast<double>(samples_done) / done_compute_s);
    open_[worker].running_speed = speed;
    open_[worker].running_compute = compute_s;
  }
  // Summarises the open window as `window`, appends each estimated worker's summary to its
  // history and starts a new open window. Workers without an estimate get no history entry.
  // `bound_running` (MonitorOptions::running_step_bound): a worker that finished no step in
  // the window but was computing one gets that step's estimate (NoteRunning: its bound,
  // samples / compute so far, or the speed measured over its progress if lower) as the
  // window's speed (reports 0) when the estimate says something: it is below the worker's
  // newest window's speed (it slowed down further), or below `straggler_line` (the straggler
  // threshold × the last reference: it is still a straggler). The bound alone is an upper
  // bound on its speed, so it flags nobody who is not slow; the progress measures it.
  // A window whose only estimates are such bounds is compared with `last_reference` (the last
  // window's reference speed; 0: not compared).
  Closed CloseWindow(int64_t window, bool bound_running = false, double last_reference = 0,
                     double straggler_line = 0);

  // Latest closed summary of `worker` (window == -1 when none); mutable so the classifier's
  // verdict can be stored with it.
  WindowSummary* Last(uint32_t worker);
  const WindowSummary* Last(uint32_t worker) const;
  // Oldest first: the coarse entries (each `windows` long, the window of its first), then the
  // recent full windows; together they cover up to HistoryWindows() windows.
  std::vector<WindowSummary> History(uint32_t worker) const;
  // The tiers' geometry (see the header comment).
  static constexpr uint32_t kCoarseEntries = 64;
  uint32_t recent_windows() const { return recent_windows_; }
  uint32_t coarse_entries() const { return coarse_entries_; }
  uint32_t coarse_span() const { return coarse_span_; }
  // Median of the worker's last `n` window speeds (a steadier v_i for planners); 0 when none.
  double SmoothedSpeed(uint32_t worker, uint32_t n) const;
  // SmoothedSpeed of a persistent straggler, at most its newest window's speed when that window
  // is a running step's bound (CloseWindow's bound_running): the step it is computing has
  // already run longer than that speed allows, so a batch plan made now plans it no faster --
  // not at the median of its last windows, one of which may be from before its slowdown.
  double StragglerSpeed(uint32_t worker, uint32_t n) const;

  // Bytes held (capacity of every buffer), for the memory budget.
  size_t MemoryBytes() const;

 private:
  struct Open {
    uint32_t reports = 0;
    uint32_t next_slot = 0;
    uint32_t kept = 0;  // speeds held in the worker's slots of speeds_
    double samples = 0, compute = 0, comm = 0, data_wait = 0, wall = 0;
    double running_speed = 0, running_compute = 0;  // NoteRunning
  };
  // A ring over a fixed slice of one of the flat arrays below.
  struct Tier {
    uint32_t head = 0;  // next write position
    uint32_t size = 0;
  };
  struct Merge {  // the coarse entry being filled (sums over `windows` windows)
    WindowSummary first;
    double speed = 0, relative = 0, compute = 0, comm = 0, data_wait = 0, wall = 0;
    uint32_t reports = 0, windows = 0;
  };
  WindowSummary* RecentAt(uint32_t worker, uint32_t age);  // 0 = newest
  const WindowSummary* RecentAt(uint32_t worker, uint32_t age) const {
    return const_cast<SpeedEstimator*>(this)->RecentAt(worker, age);
  }
  void Demote(uint32_t worker, const WindowSummary& s);  // a window leaving the recent tier
  static WindowSummary Merged(const Merge& m);

  const MonitorOptions options_;
  const uint32_t history_windows_;
  const uint32_t recent_windows_, coarse_entries_, coarse_span_, kept_per_window_;
  std::vector<Open> open_;
  std::vector<float> speeds_;           // workers x samples_kept_per_window
  std::vector<Tier> recent_, coarse_;   // per worker
  std::vector<WindowSummary> recent_entries_;  // workers x R
  std::vector<WindowSummary> coarse_entries_v_;  // workers x K
  std::vector<Merge> merging_;          // per worker (when K > 0)
  std::vector<float> scratch_;
  std::vector<double> medians_scratch_;
};

}  // namespace pacer
