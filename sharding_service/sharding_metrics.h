// The sharding service's metrics, declared once (common/metrics.h explains the scheme; the
// tables of docs/metrics.md are generated from this list). Per-dataset series carry the
// `dataset` label; a dataset deleted by an operator keeps its series, its gauges at 0.
#pragma once

#include "common/metrics.h"

#define PACER_SHARDING_METRICS(X)                                                              \
  X(leases_granted, Counter, "pacer_sharding_leases_granted_total", "Leases handed out",       \
    "dataset")                                                                                 \
  X(backups_granted, Counter, "pacer_sharding_backup_leases_total",                            \
    "Tail backup leases handed out (a second copy of a straggling lease's remainder)",        \
    "dataset")                                                                                 \
  X(records_done, Counter, "pacer_sharding_records_done_total",                                \
    "Records counted done (the job's goodput: rate() of it is records per second)",           \
    "dataset")                                                                                 \
  X(requeues, Counter, "pacer_sharding_requeues_total",                                        \
    "Unconsumed suffixes of ended leases put back in the queue", "dataset")                   \
  X(expired, Counter, "pacer_sharding_leases_expired_total",                                   \
    "Leases ended because their holder went silent")                                          \
  X(rejected, Counter, "pacer_sharding_rejected_reports_total",                                \
    "Reports refused (stale fencing token, ended lease, old incarnation)")                    \
  X(unknown_released, Counter, "pacer_sharding_unknown_leases_released_total",                 \
    "Leases released because their holder never received the fetch reply")                   \
  X(updates, Counter, "pacer_sharding_updates_total", "State updates applied and journaled")   \
  X(leases_active, Gauge, "pacer_sharding_leases_active", "Leases currently held", "dataset")  \
  X(oldest_lease_age, Gauge, "pacer_sharding_oldest_lease_age_seconds",                       \
    "Age of the oldest lease held (0 when none is held)", "dataset")                          \
  X(oldest_progress_age, Gauge, "pacer_sharding_oldest_lease_progress_age_seconds",           \
    "Longest time any held lease went without a progress report (0 when none is held)",      \
    "dataset")                                                                                 \
  X(epoch, Gauge, "pacer_sharding_dataset_epoch", "The dataset's current epoch (0-based)",      \
    "dataset")                                                                                 \
  X(epoch_progress, Gauge, "pacer_sharding_dataset_epoch_progress_ratio",                      \
    "Fraction of the current epoch's records done (streams: 0)", "dataset")                   \
  X(finished, Gauge, "pacer_sharding_dataset_finished",                                        \
    "1 once every epoch of the dataset is done", "dataset")                                   \
  X(quarantined_ranges, Gauge, "pacer_sharding_quarantined_ranges",                            \
    "Poison ranges quarantined", "dataset")                                                   \
  X(quarantined_records, Gauge, "pacer_sharding_quarantined_records",                          \
    "Records quarantined as poison (a hole in the data trained on)", "dataset")               \
  X(workers, Gauge, "pacer_sharding_workers",                                                  \
    "Registered workers by state: active (heard within the lease timeout), silent (not "    \
    "heard since, leases expiring), lost (silent past the worker timeout)",                  \
    "state")                                                                                   \
  X(recovery_seconds, Gauge, "pacer_sharding_recovery_seconds",                                \
    "Time the last start spent recovering state")

namespace pacer {
PACER_DECLARE_METRICS(ShardingMetrics, PACER_SHARDING_METRICS);
}  // namespace pacer
