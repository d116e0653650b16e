// The journals' metrics: one family per quantity, labelled `journal` ("sharding": the sharding
// core's, "controller": the controller's), so that both journals are observed alike -- the same
// series, the same alerts. JournalObserver follows one journal's totals (JournalStats) and
// health into them; pacerd's housekeeping calls it for each journal. docs/metrics.md is
// generated from the list.
// Thread-compatible: one observer per journal, called from one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "journal/durable_log.h"

#define PACER_JOURNAL_METRICS(X)                                                               \
  X(healthy, Gauge, "pacer_journal_healthy",                                                   \
    "1 while the journal accepts updates; 0 while they are refused after a failed write (a "  \
    "full disk) until it reopens",                                                             \
    "journal")                                                                                 \
  X(recoveries, Counter, "pacer_journal_recoveries_total",                                     \
    "Journal reopened after a failed write", "journal")                                       \
  X(fsyncs, Counter, "pacer_journal_fsyncs_total",                                             \
    "Journal write batches (one fsync each with sync on)", "journal")                         \
  X(bytes, Counter, "pacer_journal_bytes_total", "Bytes written to the journal", "journal")     \
  X(snapshots, Counter, "pacer_journal_snapshots_total", "Snapshots written", "journal")       \
  X(failed_writes, Counter, "pacer_journal_failed_writes_total",                               \
    "Journal write batches that failed (each makes the journal unhealthy)", "journal")        \
  X(fsync_seconds, Histogram, "pacer_journal_fsync_seconds",                                   \
    "Latency of one journal write batch, its fsync included (group commit)", "journal")       \
  X(durable_seq, Gauge, "pacer_journal_durable_seq",                                           \
    "The newest update known durable (it only grows while pacerd runs)", "journal")

namespace pacer {

PACER_DECLARE_METRICS(JournalMetrics, PACER_JOURNAL_METRICS);

class JournalObserver {
 public:
  // `journal`: the label value. Creates the series (healthy = 1).
  JournalObserver(JournalMetrics* metrics, std::string journal);
  // Follows the journal's own totals and its health. Counters never go down: a journal reopened
  // after a failure starts its totals again, and then only its new work is added.
  void Observe(const JournalStats& stats, const absl::Status& health);

 private:
  JournalMetrics* metrics_;
  std::string journal_;
  JournalStats seen_;
};

}  // namespace pacer
