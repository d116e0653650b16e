// ClusterViews made by hand for the controller's unit tests: N workers on their own nodes, equal
// speeds, a sync job with an even split of the global batch. (pacerd and the simulator build
// their views from the monitor with controller/view_builder.h; these skip the monitor.)
#pragma once

#include <string>

#include "common/clock.h"
#include "controller/burst_detector.h"
#include "controller/cluster_view.h"

namespace pacer::testing {

inline ClusterView SyncView(int n, int64_t global_batch, double speed = 100) {
  ClusterView v;
  v.job.mode = JobMode::kSync;
  v.job.global_batch = global_batch;
  v.job.current_step = 100;
  v.job.heartbeat_interval_s = 1;
  v.job.step_time_s = static_cast<double>(global_batch) / n / speed;
  v.job.throughput = speed * n;
  v.job.remaining_samples = 0;
  for (int i = 0; i < n; ++i) {
    WorkerView w;
    w.id = "w" + std::to_string(i);
    w.node = "n" + std::to_string(i);
    w.speed = w.last_window_speed = speed;
    w.local_batch = global_batch / n + (i < global_batch % n ? 1 : 0);
    w.confidence = 1;
    v.workers.push_back(w);
    v.nodes.push_back(NodeView{w.node});
  }
  return v;
}

// Marks worker i as a straggler at `relative` speed (speed scaled from the median `base`).
inline void MakeStraggler(ClusterView& v, int i, double relative, bool persistent,
                          bool contention = true, SlowLevel level = SlowLevel::kWorker,
                          double base = 100) {
  WorkerView& w = v.workers[i];
  w.speed = w.last_window_speed = base * relative;
  w.relative_speed = relative;
  w.straggler = true;
  w.persistent = persistent;
  w.contention = contention;
  w.level = level;
  w.confidence = 0.9;
}

// One step's timing as a worker's step report carries it (the burst rule's and the step
// statistics' input).
inline StepTiming Timing(const std::string& id, int64_t step, double compute_s, int64_t samples,
                         int64_t time_ms, bool probe = false) {
  StepTiming t;
  t.worker_id = id;
  t.step = step;
  t.compute_s = compute_s;
  t.samples = samples;
  t.time_ms = time_ms;
  t.probe = probe;
  return t;
}

}  // namespace pacer::testing
