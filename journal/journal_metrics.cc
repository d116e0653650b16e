#include "journal/journal_metrics.h"

#include <algorithm>
#include <utility>

namespace pacer {

JournalObserver::JournalObserver(JournalMetrics* metrics, std::string journal)
    : metrics_(metrics), journal_(std::move(journal)) {
  metrics_->healthy.With({journal_}).Set(1);
  for (auto* c : {&metrics_->recoveries, &metrics_->fsyncs, &metrics_->bytes, &metrics_->snapshots,
                  &metrics_->failed_writes}) {
    c->With({journal_});
  }
  metrics_->fsync_seconds.With({journal_});
}

void JournalObserver::Observe(const JournalStats& js, const absl::Status& health) {
  const std::string_view j = journal_;
  auto follow = [](prometheus::Counter& c, uint64_t now, uint64_t& seen) {
    c.Increment(static_cast<double>(now >= seen ? now - seen : now));
    seen = now;
  };
  const bool reopened = js.batches < seen_.batches;
  follow(metrics_->fsyncs.With({j}), js.batches, seen_.batches);
  follow(metrics_->bytes.With({j}), js.bytes, seen_.bytes);
  follow(metrics_->snapshots.With({j}), js.snapshots, seen_.snapshots);
  follow(metrics_->failed_writes.With({j}), js.failed_writes, seen_.failed_writes);
  follow(metrics_->recoveries.With({j}), js.recoveries, seen_.recoveries);
  metrics_->healthy.With({j}).Set(health.ok() ? 1 : 0);
  metrics_->durable_seq.With({j}).Set(static_cast<double>(js.durable_seq));
  if (js.write_latency_counts.empty()) return;
  std::vector<uint64_t>& seen = seen_.write_latency_counts;
  if (reopened || seen.size() != js.write_latency_counts.size()) {
    seen.assign(js.write_latency_counts.size(), 0);
    seen_.write_latency_sum_s = 0;
  }
  std::vector<double> increments(seen.size());
  bool any = false;
  for (size_t i = 0; i < seen.size(); ++i) {
    const uint64_t now_count = js.write_latency_counts[i];
    increments[i] = static_cast<double>(now_count >= seen[i] ? now_count - seen[i] : now_count);
    any = any || increments[i] > 0;
    seen[i] = now_count;
  }
  if (any) {
    metrics_->fsync_seconds.With({j}).ObserveMultiple(
        increments, std::max(0.0, js.write_latency_sum_s - seen_.write_latency_sum_s));
  }
  seen_.write_latency_sum_s = js.write_latency_sum_s;
}

}  // namespace pacer
