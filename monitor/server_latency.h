// ServerLatencyTracker: per-window latency of each parameter server, as seen by the workers.
//
// Each worker reports, per interval, the mean request latency it saw to each server. Each
// reporter has one vote per server and window: its latest sample. At window close a server's
// latency is the median over its reporters' votes (one slow worker's network, or one worker
// that lies or floods, does not make a server look hot; a worker's own slow link shows up as
// that worker's comm time instead), and its relative speed is median(server latencies) / its
// latency, so a hot server, like a straggling worker, has r < 1. A server keeps at most 256
// votes per window (past that a new reporter replaces the oldest vote), so a flood costs
// bounded memory.
//
// Servers are dense indices handed out by AddServer(). Thread-compatible.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "monitor/monitor_options.h"

namespace pacer {

class ServerLatencyTracker {
 public:
  static constexpr uint32_t kMaxReportsPerWindow = 256;

  explicit ServerLatencyTracker(const MonitorOptions& options) : options_(options) {}

  uint32_t AddServer();
  size_t num_servers() const { return open_.size(); }
  // `reporter`: the reporting worker's index (MonitorState's); its earlier vote this window is
  // replaced.
  void Add(uint32_t server, uint32_t reporter, double mean_latency_ms);

  struct ServerWindow {
    uint32_t server = 0;
    double latency_ms = 0;
    double relative = 0;  // median latency / latency; 0 when too few servers reported
  };
  struct Closed {
    double median_latency_ms = 0;
    std::vector<ServerWindow> servers;  // servers with reports this window
  };
  Closed CloseWindow();

  // Latency of the server in the last window it had reports (0 when none).
  double LastLatency(uint32_t server) const { return last_[server]; }
  size_t MemoryBytes() const;

 private:
  struct Open {
    std::vector<std::pair<uint32_t, double>> votes;  // (reporter, latency ms)
    uint32_t next = 0;
  };
  const MonitorOptions options_;
  std::vector<Open> open_;
  std::vector<double> last_;
};

}  // namespace pacer
