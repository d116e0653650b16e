#include "monitor/monitor_options.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace pacer {
namespace {

absl::Status Bad(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("monitor options: ", field, " ", why));
}

bool Finite(double v) { return std::isfinite(v); }

}  // namespace

uint32_t MonitorOptions::HistoryWindows() const {
  int64_t n = window_ms > 0 ? history_ms / window_ms : 0;
  return static_cast<uint32_t>(std::clamp<int64_t>(n, persistent_w, 1'000'000));
}

absl::Status MonitorOptions::Validate() const {
  if (window_ms < 100 || window_ms > 3'600'000) return Bad("window_ms", "must be in [100, 3600000]");
  if (history_ms < window_ms) return Bad("history_ms", "must be >= window_ms");
  if (history_ms / window_ms > 100'000) return Bad("history_ms", "keeps more than 100000 windows");
  if (min_workers < 2) return Bad("min_workers", "must be >= 2");
  if (stale_after_windows < 1) return Bad("stale_after_windows", "must be >= 1");
  if (smoothed_windows < 1 || smoothed_windows > history_ms / window_ms)
    return Bad("smoothed_windows", "must be in [1, history windows]");
  if (stable_smoothed_windows < smoothed_windows || stable_smoothed_windows > 1024)
    return Bad("stable_smoothed_windows", "must be in [smoothed_windows, 1024]");
  if (!Finite(straggler_threshold) || straggler_threshold <= 0 || straggler_threshold >= 1)
    return Bad("straggler_threshold", "must be in (0, 1)");
  if (!Finite(leader_threshold) || leader_threshold <= 1)
    return Bad("leader_threshold", "must be > 1");
  if (!Finite(hysteresis) || hysteresis < 0 || straggler_threshold + hysteresis >= 1 ||
      leader_threshold - hysteresis <= 1)
    return Bad("hysteresis", "must be >= 0 and keep both thresholds on their side of 1");
  if (persistent_w < 1 || persistent_w > 64) return Bad("persistent_w", "must be in [1, 64]");
  if (persistent_k < 1 || persistent_k > persistent_w)
    return Bad("persistent_k", "must be in [1, persistent_w]");
  for (auto [name, v] : {std::pair{"steal_threshold", steal_threshold},
                         std::pair{"throttle_threshold", throttle_threshold},
                         std::pair{"other_cpu_threshold", other_cpu_threshold},
                         std::pair{"node_level_fraction", node_level_fraction}}) {
    if (!Finite(v) || v <= 0 || v > 1) return Bad(name, "must be in (0, 1]");
  }
  if (!Finite(load_per_cpu_threshold) || load_per_cpu_threshold <= 0)
    return Bad("load_per_cpu_threshold", "must be > 0");
  if (!Finite(deterministic_max_cv) || deterministic_max_cv <= 0)
    return Bad("deterministic_max_cv", "must be > 0");
  if (node_level_min_workers < 1) return Bad("node_level_min_workers", "must be >= 1");
  if (!Finite(hot_server_ratio) || hot_server_ratio <= 1) return Bad("hot_server_ratio", "must be > 1");
  if (!Finite(hot_server_min_latency_ms) || hot_server_min_latency_ms < 0)
    return Bad("hot_server_min_latency_ms", "must be >= 0");
  if (min_servers < 2) return Bad("min_servers", "must be >= 2");
  if (max_workers < 1 || max_servers < 1 || max_nodes < 1) return Bad("max_workers", "limits must be >= 1");
  if (max_servers_per_reporter < 1) return Bad("max_servers_per_reporter", "must be >= 1");
  if (max_local_batch < 1 || max_samples_per_step < 1) return Bad("max_local_batch", "must be >= 1");
  if (!Finite(max_step_s) || max_step_s <= 0) return Bad("max_step_s", "must be > 0");
  if (!Finite(max_speed) || max_speed <= 0) return Bad("max_speed", "must be > 0");
  if (max_report_age_ms < 0 || max_clock_skew_ms < 0) return Bad("max_report_age_ms", "must be >= 0");
  if (max_reports_per_worker_per_window < 1) return Bad("max_reports_per_worker_per_window", "must be >= 1");
  if (max_reports_per_request < 1) return Bad("max_reports_per_request", "must be >= 1");
  if (max_id_length < 1) return Bad("max_id_length", "must be >= 1");
  if (samples_kept_per_window < 1 || samples_kept_per_window > 1024)
    return Bad("samples_kept_per_window", "must be in [1, 1024]");
  if (!Finite(model_forgetting) || model_forgetting <= 0.5 || model_forgetting > 1)
    return Bad("model_forgetting", "must be in (0.5, 1]");
  if (events_kept < 1) return Bad("events_kept", "must be >= 1");
  return absl::OkStatus();
}

}  // namespace pacer
