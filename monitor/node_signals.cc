#include "monitor/node_signals.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace pacer {

uint32_t NodeSignals::AddNode() {
  nodes_.emplace_back();
  return static_cast<uint32_t>(nodes_.size() - 1);
}

void NodeSignals::Update(uint32_t node, const NodeMetrics& metrics, int64_t now_ms) {
  nodes_[node].metrics = metrics;
  nodes_[node].received_ms = now_ms;
}

Contention NodeSignals::Assess(uint32_t node, int64_t now_ms, bool with_evidence) const {
  Contention c;
  const Node& n = nodes_[node];
  if (n.received_ms < 0 || now_ms - n.received_ms > options_.node_metrics_max_age_ms) return c;
  const NodeMetrics& m = n.metrics;
  const double cpus = std::max<uint32_t>(m.num_cpus(), 1);
  const double throttled = m.interval_s() > 0 ? m.cpu_throttled_s() / (m.interval_s() * cpus) : 0;
  const double load = m.load1() / cpus;
  c.score = std::max({m.cpu_steal_frac() / options_.steal_threshold,
                      throttled / options_.throttle_threshold,
                      m.other_cpu_frac() / options_.other_cpu_threshold,
                      m.num_cpus() > 0 ? load / options_.load_per_cpu_threshold : 0.0});
  if (!with_evidence) return c;
  c.evidence = absl::StrFormat(
      "steal %.1f%% (>%.1f%%), throttled %.1f%% (>%.1f%%), co-located cpu %.1f%% (>%.1f%%), "
      "load/cpu %.2f (>%.2f)",
      100 * m.cpu_steal_frac(), 100 * options_.steal_threshold, 100 * throttled,
      100 * options_.throttle_threshold, 100 * m.other_cpu_frac(),
      100 * options_.other_cpu_threshold, load, options_.load_per_cpu_threshold);
  return c;
}

size_t NodeSignals::MemoryBytes() const {
  size_t bytes = nodes_.capacity() * sizeof(Node);
  for (const Node& n : nodes_) bytes += n.metrics.SpaceUsedLong() - sizeof(NodeMetrics);
  return bytes;
}

}  // namespace pacer
