// NodeMetricsCollector: the node's signals for the monitor (pacer.NodeMetrics), measured as
// differences of the kernel's counters between two Sample() calls.
//
// CPU busy / steal are fractions of the node's CPU time in /proc/stat ticks over the interval
// (busy = user+nice+system+irq+softirq; steal apart), so they equal what the kernel's own
// counters say for the same interval. Throttled time sums cgroup cpu.stat over the agent's own
// cpu cgroup (v1 at <cgroup_root>/cpu, else v2 at <cgroup_root>) plus any extra cpu.stat files
// the caller names (the contention injector's groups). Worker CPU comes from /proc/<pid>/stat
// (utime+stime) and `other_cpu_frac` is busy minus the workers' share. GPU utilisation comes
// from NVML when present (NvmlProbe), else the field is empty.
//
// Owns its previous sample and the NVML probe. Not thread-safe (the agent's event loop owns it).
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/nvml_probe.h"
#include "agent/proc_stats.h"
#include "common/clock.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

struct NodeMetricsSources {
  std::string proc_root = "/proc";
  std::string cgroup_root = "/sys/fs/cgroup";
  bool use_nvml = true;
};

struct NodeSample {
  NodeMetrics metrics;                           // over the interval since the previous sample
  std::map<std::string, double> worker_cores;    // CPU cores used per worker over that interval
};

class NodeMetricsCollector {
 public:
  NodeMetricsCollector(std::string node, const Clock* clock, NodeMetricsSources sources = {});

  // Reads the counters now. Returns nullopt on the first call (no interval yet), else the
  // metrics since the previous call. `workers` maps worker id -> pid (0 = not running);
  // `extra_cpu_stat` are cgroup cpu.stat files whose throttling to add.
  absl::StatusOr<std::optional<NodeSample>> Sample(const std::map<std::string, pid_t>& workers,
                                                   const std::vector<std::string>& extra_cpu_stat = {});

  // The cpu.stat this collector reads for the node's own cgroup ("" when there is none) and
  // whether it is cgroup v2.
  const std::string& cpu_stat_path() const { return cpu_stat_path_; }
  bool cgroup_v2() const { return cgroup_v2_; }
  bool nvml_available() const { return nvml_ && nvml_->available(); }

 private:
  struct Counters {
    int64_t mono_ns = 0;
    CpuTicks cpu;
    std::optional<NetBytes> net;
    std::map<std::string, uint64_t> throttled_ns;  // by cpu.stat path
    std::map<pid_t, uint64_t> pid_ticks;
  };

  std::string node_;
  const Clock* clock_;
  NodeMetricsSources src_;
  std::string cpu_stat_path_;
  bool cgroup_v2_ = false;
  std::string memory_limit_path_;
  std::unique_ptr<NvmlProbe> nvml_;
  std::optional<Counters> prev_;
};

}  // namespace pacer
