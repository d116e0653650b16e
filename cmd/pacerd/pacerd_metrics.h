// PacerdMetrics: pacerd's own series (process, accepted data loss), declared
// once in PACER_PACERD_METRICS, and the housekeeping step that refreshes the gauges no request
// updates: the agents' (agent/agent_metrics.h) and the controller's
// (controller/controller_metrics.h). docs/metrics.md is generated from these lists.
//
// The agent gauges share their list with the agent registry's counters: both instantiate
// AgentMetrics on the same registry, and prometheus-cpp merges a family registered twice under
// one name.
// Thread-compatible: Publish() runs on the housekeeping thread only.
#pragma once

#include <memory>

#include "agent/agent_metrics.h"
#include "agent/agent_registry.h"
#include "common/metrics.h"
#include "controller/controller_metrics.h"
#include "controller/reconciler.h"
#include "monitor/monitor_service.h"

#define PACER_PACERD_METRICS(X)                                                                \
  X(start_time, Gauge, "pacer_pacerd_start_time_seconds",                                      \
    "When this pacerd process started (Unix time): changes() of it counts restarts")          \
  X(build_info, Gauge, "pacer_build_info",                                                     \
    "Always 1; the version label is what --version prints", "version")                        \
  X(data_loss_accepted, Counter, "pacer_data_loss_accepted_total",                             \
    "Starts that accepted a data loss (--accept-data-loss)")

namespace pacer {

PACER_DECLARE_METRICS(PacerdMetricSeries, PACER_PACERD_METRICS);

class PacerdMetrics {
 public:
  // Sets the start time to now (`unix_s`) and creates every bounded series.
  PacerdMetrics(MetricsRegistry* registry, double unix_s);
  PacerdMetricSeries& own() { return own_; }
  // Refreshes the agents' and the controller's gauges (`now_ms` on the agents' clock).
  void Publish(const AgentRegistry& agents, const Reconciler& reconciler,
               MonitorServiceImpl& monitor, int64_t now_ms);

 private:
  PacerdMetricSeries own_;
  AgentMetrics agents_;
  ControllerMetrics controller_;
};

}  // namespace pacer
