// MonitorOptions: every threshold and window of the monitor, as plain data.
//
// A policy file (controller, docs/design.md §4) fills this struct; the defaults are the tuned values
// the bench (bench/monitor_bench.cc) measures against. Validate() checks ranges and
// relations and names the offending field; the monitor refuses options that fail it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace pacer {

struct MonitorOptions {
  // ---- windows ----
  int64_t window_ms = 10'000;        // one estimation/classification window
  int64_t history_ms = 3'600'000;    // per-worker window history kept (for the controller)
  uint32_t min_reports_per_window = 1;  // a worker with fewer reports has no estimate that window
  // How many workers a window needs, per rule (docs/design.md §3, "How many workers"):
  //  * median rule, >= min_workers with an estimate: r_i = v_i / median(v), robust to a
  //    hostile minority (one worker moves the median by at most one rank);
  //  * pair rule, exactly 2 with an estimate and pair_detection: r_i = v_i / v_faster (the
  //    faster has r = 1, so a pair has no leaders and the slower is flagged by the same
  //    straggler_threshold). With two workers the median is their mean, which halves the
  //    signal (a 3x straggler would read 0.5 and its partner 1.5); the faster is the reference.
  //    A pair cannot outvote a worker that lies about its speed (report validation bounds it);
  //  * fewer (one worker): nobody is classified — a job of one waits for nobody.
  uint32_t min_workers = 3;          // median rule from this many workers with an estimate
  bool pair_detection = true;        // exactly 2 workers with an estimate: the pair rule
  uint32_t stale_after_windows = 3;  // no report for this long: class UNKNOWN
  uint32_t smoothed_windows = 3;     // WorkerStatus.smoothed_speed: median of this many windows
  // ... and for a persistent straggler, growing by one window per window its classification
  // holds (class, persistence, cause, scope unchanged) up to this many: it is planned from a
  // long, steady history, and a change of class starts again from smoothed_windows (a new
  // regime is followed quickly). Other workers keep smoothed_windows, so a relaunch that cured
  // one or a burst below the threshold shows at once. Clamped to the history kept.
  uint32_t stable_smoothed_windows = 10;

  // ---- straggler / leader ----
  double straggler_threshold = 0.85;  // r_i below: straggler
  double leader_threshold = 1.20;     // r_i above: leader
  double hysteresis = 0.03;           // a flagged worker clears only past threshold +- this
  uint32_t persistent_k = 3;          // flagged in K ...
  uint32_t persistent_w = 5;          // ... of the last W windows: persistent
  // A window in which a worker finishes no step, while the step it is computing (its newest
  // heartbeat's running step, MonitorState::NoteRunningStep) has run longer than its last
  // window's speed allows -- or than the straggler line allows -- gets that step's bound,
  // samples / compute so far, as its speed: a worker that slowed down in the middle of a long
  // step is flagged before the step ends, and in every window of its slow steps after that.
  // Off by default (policy: detection.running_step_bound).
  bool running_step_bound = false;

  // ---- cause: deterministic (hardware) vs contention ----
  double steal_threshold = 0.05;          // CPU steal fraction
  double throttle_threshold = 0.05;       // cgroup throttled time / interval
  double other_cpu_threshold = 0.25;      // CPU of co-located processes, fraction of the node
  double load_per_cpu_threshold = 1.5;    // load1 / num_cpus
  double deterministic_max_cv = 0.08;     // speed variation (stddev/mean of r) over W windows
  int64_t node_metrics_max_age_ms = 30'000;  // older node metrics are ignored

  // ---- scope ----
  double node_level_fraction = 0.75;  // this share of a node's workers straggle: node-level
  uint32_t node_level_min_workers = 2;
  double hot_server_ratio = 2.0;         // server latency / median server latency
  double hot_server_min_latency_ms = 1.0;
  uint32_t min_servers = 3;

  // ---- input validation ----
  bool admit_unknown_workers = false;  // accept reports from undeclared workers (node "")
  uint32_t max_workers = 65'536;
  uint32_t max_servers = 4'096;
  // Server rows one reporter may add (the first worker to report a job's servers adds them all):
  // one worker cannot fill the server table and lock the job's real servers out.
  uint32_t max_servers_per_reporter = 256;
  uint32_t max_nodes = 65'536;
  uint32_t max_local_batch = 1u << 20;
  uint64_t max_samples_per_step = uint64_t{1} << 26;
  double max_step_s = 3'600;           // longer times are rejected
  double max_speed = 1e9;              // samples per compute second
  int64_t max_report_age_ms = 60'000;  // older time_ms: rejected as stale
  int64_t max_clock_skew_ms = 5'000;   // time_ms further in the future: rejected
  uint32_t max_reports_per_worker_per_window = 2'000;  // a flood beyond is dropped
  uint32_t max_reports_per_request = 16'384;
  uint32_t max_id_length = 256;
  uint32_t samples_kept_per_window = 32;  // per worker: the window median uses these

  // ---- step-time model ----
  double model_forgetting = 0.98;  // per report; effective memory ~ 1/(1-f) reports

  // ---- events ----
  uint32_t events_kept = 4'096;

  // History windows kept per worker (history_ms / window_ms, at least persistent_w).
  uint32_t HistoryWindows() const;
  absl::Status Validate() const;
};

}  // namespace pacer
