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
#include "controller/sources.h"

#define PACER_PACERD_METRICS(X)                                                                \
  X(start_time, Gauge, "pacer_pacerd_start_time_seconds",                                      \
    "When this pacerd process started (Unix time): changes() of it counts restarts")          \
  X(build_info, Gauge, "pacer_build_info",                                                     \
    "Always 1; the version label is what --version prints", "version")                        \
  X(data_loss_accepted, Counter, "pacer_data_loss_accepted_total",                             \
    "Starts that accepted a data loss (--accept-data-loss)")                                  \
  X(ha_leader, Gauge, "pacer_ha_leader",                                                       \
    "1 while this pacerd leads its job in etcd (--journal etcd://: a standby serves nothing, "  \
    "metrics included); 0 with the RocksDB journal")                                           \
  X(ha_lease_remaining, Gauge, "pacer_ha_lease_remaining_seconds",                             \
    "How long this leader's leadership holds without another acknowledged keepalive; it "      \
    "steps down (exits) at 0")                                                                 \
  X(ha_fencing_revision, Gauge, "pacer_ha_fencing_revision",                                   \
    "The leader's fencing token (its election key's create revision in etcd): changes() of "   \
    "it counts leader changes")                                                                \
  X(ha_takeover, Gauge, "pacer_ha_takeover_seconds",                                           \
    "From winning the election to serving: the rest of the journals read from etcd")           \
  X(ha_standby_applied, Gauge, "pacer_ha_standby_applied_seq",                                 \
    "On a hot standby: the newest sharding update it applied from etcd")                       \
  X(ha_standby_behind, Gauge, "pacer_ha_standby_behind_updates",                               \
    "On a hot standby: how many updates its last catch-up applied (how far behind it was; a " \
    "watch on the journal wakes it)")

namespace pacer {

PACER_DECLARE_METRICS(PacerdMetricSeries, PACER_PACERD_METRICS);

class PacerdMetrics {
 public:
  // Sets the start time to now (`unix_s`) and creates every bounded series.
  PacerdMetrics(MetricsRegistry* registry, double unix_s);
  PacerdMetricSeries& own() { return own_; }
  // Refreshes the agents' and the controller's gauges (`now_ms` on the agents' clock).
  void Publish(const AgentRegistry& agents, const Reconciler& reconciler,
               SpeedSource& speeds, int64_t now_ms);

 private:
  PacerdMetricSeries own_;
  AgentMetrics agents_;
  ControllerMetrics controller_;
};

}  // namespace pacer
