// The rendezvous store's metrics (pacer_rendezvous_*), declared once (common/metrics.h;
// docs/metrics.md is generated from this list).
#pragma once

#include "common/metrics.h"

#define PACER_RENDEZVOUS_METRICS(X)                                                            \
  X(generation, Gauge, "pacer_rendezvous_generation",                                          \
    "Current generation of the job's collective group")                                       \
  X(regroups, Counter, "pacer_rendezvous_regroups_total",                                      \
    "Generation changes after the first (a worker restarted or a collective failed)")         \
  X(keys, Gauge, "pacer_rendezvous_keys", "Keys in the current generation's store")            \
  X(waiting, Gauge, "pacer_rendezvous_waiting_gets", "Get calls waiting for keys")

namespace pacer {
PACER_DECLARE_METRICS(RendezvousMetrics, PACER_RENDEZVOUS_METRICS);
}  // namespace pacer
