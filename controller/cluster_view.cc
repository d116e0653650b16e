#include "controller/cluster_view.h"

#include <cmath>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace pacer {
namespace {

bool Bad(double v) { return !std::isfinite(v) || v < 0; }

}  // namespace

const char* JobModeName(JobMode mode) { return mode == JobMode::kSync ? "sync" : "async"; }

const char* SlowLevelName(SlowLevel level) {
  switch (level) {
    case SlowLevel::kNone: return "none";
    case SlowLevel::kWorker: return "worker";
    case SlowLevel::kNode: return "node";
    case SlowLevel::kServer: return "server";
  }
  return "?";
}

absl::Status ValidateClusterView(const ClusterView& view) {
  const JobView& j = view.job;
  if (j.global_batch < 0 || j.current_step < 0 || j.remaining_samples < 0)
    return absl::InvalidArgumentError("view: job.global_batch/current_step/remaining_samples < 0");
  for (double v : {j.step_time_s, j.heartbeat_interval_s, j.throughput, j.restart_cost_s,
                   j.migrate_cost_s, j.lost_work_s, j.typical_shard_time_s, j.epoch_progress})
    if (Bad(v)) return absl::InvalidArgumentError("view: a job time/rate is negative or not finite");
  // Views of the ids, hashed: a tree of copies was most of this check at 4 096 workers.
  absl::flat_hash_set<std::string_view> ids;
  ids.reserve(view.workers.size());
  for (const auto& w : view.workers) {
    if (w.id.empty()) return absl::InvalidArgumentError("view: a worker has an empty id");
    if (!ids.insert(w.id).second)
      return absl::InvalidArgumentError(absl::StrCat("view: worker '", w.id, "' appears twice"));
    for (double v : {w.speed, w.last_window_speed, w.relative_speed, w.confidence, w.step_fixed_s,
                     w.step_per_sample_s, w.shard_elapsed_s, w.step_speed, w.step_speed_rel_se, w.step_noise})
      if (Bad(v))
        return absl::InvalidArgumentError(
            absl::StrCat("view: worker '", w.id, "' has a negative or non-finite number"));
    if (w.local_batch < 0 || w.max_local_batch < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("view: worker '", w.id, "' has a negative batch or cap"));
  }
  for (const auto& s : view.servers)
    if (Bad(s.latency_ms) || Bad(s.relative_latency))
      return absl::InvalidArgumentError(
          absl::StrCat("view: server '", s.id, "' has a negative or non-finite latency"));
  return absl::OkStatus();
}

}  // namespace pacer
