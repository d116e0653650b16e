// The node agents' metrics as pacerd exports them (pacer_agent_*), declared once (common/
// metrics.h; docs/metrics.md is generated from this list). The counters are counted by the
// AgentRegistry as heartbeats arrive; the gauges are set from AgentRegistry::Agents() on
// pacerd's housekeeping tick (cmd/pacerd/pacerd_metrics.h), so an agent that goes silent shows as lost
// without a heartbeat to tell it.
#pragma once

#include "common/metrics.h"

#define PACER_AGENT_METRICS(X)                                                                   \
  X(heartbeats, Counter, "pacer_agent_heartbeats_total", "agent heartbeats accepted")            \
  X(rejected, Counter, "pacer_agent_heartbeats_rejected_total", "agent heartbeats refused")      \
  X(registrations, Counter, "pacer_agent_registrations_total", "agent incarnations (re)registered") \
  X(commands, Counter, "pacer_agent_commands_total", "agent commands by outcome", "outcome")    \
  X(exits, Counter, "pacer_agent_worker_exits_total", "worker process exits reported")          \
  X(agents, Gauge, "pacer_agent_agents",                                                         \
    "Node agents known to pacerd by state: connected, leaving (said so; gone or going), lost " \
    "(silent past the agent timeout without leaving)",                                       \
    "state")                \
  X(workers, Gauge, "pacer_agent_workers",                                                       \
    "Worker processes the connected agents supervise, by state (running, backoff, exited, "    \
    "failed, stopped, stopping, unknown)",                                                      \
    "state")                                                                                    \
  X(heartbeat_age, Gauge, "pacer_agent_oldest_heartbeat_age_seconds",                            \
    "Time since the least recently heard connected agent's heartbeat (0: none connected)")

namespace pacer {

PACER_DECLARE_METRICS(AgentMetrics, PACER_AGENT_METRICS);

}  // namespace pacer
