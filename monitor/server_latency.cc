#include "monitor/server_latency.h"

#include "monitor/robust_stats.h"

namespace pacer {

uint32_t ServerLatencyTracker::AddServer() {
  open_.emplace_back();
  last_.push_back(0);
  return static_cast<uint32_t>(open_.size() - 1);
}

void ServerLatencyTracker::Add(uint32_t server, uint32_t reporter, double mean_latency_ms) {
  Open& o = open_[server];
  for (auto& [who, latency] : o.votes) {
    if (who == reporter) {
      latency = mean_latency_ms;
      return;
    }
  }
  if (o.votes.size() < kMaxReportsPerWindow) {
    o.votes.emplace_back(reporter, mean_latency_ms);
  } else {
    o.votes[o.next] = {reporter, mean_latency_ms};
  }
  o.next = (o.next + 1) % kMaxReportsPerWindow;
}

ServerLatencyTracker::Closed ServerLatencyTracker::CloseWindow() {
  Closed closed;
  std::vector<double> medians;
  for (uint32_t s = 0; s < open_.size(); ++s) {
    Open& o = open_[s];
    if (o.votes.empty()) continue;
    std::vector<double> latencies;
    latencies.reserve(o.votes.size());
    for (const auto& [who, ms] : o.votes) latencies.push_back(ms);
    const double latency = MedianInPlace(latencies);
    closed.servers.push_back({s, latency, 0});
    medians.push_back(latency);
    last_[s] = latency;
    o.votes.clear();
    o.next = 0;
  }
  if (closed.servers.size() >= options_.min_servers) {
    closed.median_latency_ms = MedianInPlace(medians);
    for (ServerWindow& sw : closed.servers) {
      // A server faster than 1 us is "as fast as the median"; avoids dividing by zero.
      sw.relative = sw.latency_ms > 1e-3 ? closed.median_latency_ms / sw.latency_ms : 1.0;
    }
  }
  return closed;
}

size_t ServerLatencyTracker::MemoryBytes() const {
  size_t bytes = open_.capacity() * sizeof(Open) + last_.capacity() * sizeof(double);
  for (const Open& o : open_) bytes += o.votes.capacity() * sizeof(o.votes[0]);
  return bytes;
}

}  // namespace pacer
