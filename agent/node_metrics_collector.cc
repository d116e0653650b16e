#include "agent/node_metrics_collector.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status.h"

namespace pacer {

NodeMetricsCollector::NodeMetricsCollector(std::string node, const Clock* clock,
                                           NodeMetricsSources sources)
    : node_(std::move(node)), clock_(clock), src_(std::move(sources)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const pid_t self = getpid();
  if (fs::exists(src_.cgroup_root + "/cpu/cpu.stat", ec)) {
    auto path = CgroupPathOf(src_.proc_root, self, "cpu");
    std::string p = src_.cgroup_root + "/cpu" + (path.ok() ? *path : "/") + "/cpu.stat";
    cpu_stat_path_ = fs::exists(p, ec) ? p : src_.cgroup_root + "/cpu/cpu.stat";
    auto mem = CgroupPathOf(src_.proc_root, self, "memory");
    memory_limit_path_ = src_.cgroup_root + "/memory" + (mem.ok() ? *mem : "/") + "/memory.limit_in_bytes";
  } else if (fs::exists(src_.cgroup_root + "/cgroup.controllers", ec)) {
    cgroup_v2_ = true;
    auto path = CgroupPathOf(src_.proc_root, self, "");
    std::string p = src_.cgroup_root + (path.ok() ? *path : "/") + "/cpu.stat";
    cpu_stat_path_ = fs::exists(p, ec) ? p : src_.cgroup_root + "/cpu.stat";
    memory_limit_path_ = src_.cgroup_root + (path.ok() ? *path : "/") + "/memory.max";
  }
  if (src_.use_nvml) {
    nvml_ = std::make_unique<NvmlProbe>();
    if (!nvml_->available()) {
      PACER_LOG(INFO) << "no GPU metrics: " << nvml_->why_unavailable();
    }
  }
}

absl::StatusOr<std::optional<NodeSample>> NodeMetricsCollector::Sample(
    const std::map<std::string, pid_t>& workers, const std::vector<std::string>& extra_cpu_stat) {
  Counters now;
  now.mono_ns = clock_->MonotonicNs();
  ASSIGN_OR_RETURN(std::string stat_text, ReadSmallFile(src_.proc_root + "/stat"));
  ASSIGN_OR_RETURN(now.cpu, ParseProcStat(stat_text));
  if (auto net_text = ReadSmallFile(src_.proc_root + "/net/dev"); net_text.ok()) {
    if (auto net = ParseNetDev(*net_text); net.ok()) now.net = *net;
  }
  std::vector<std::string> stat_paths = extra_cpu_stat;
  if (!cpu_stat_path_.empty()) stat_paths.push_back(cpu_stat_path_);
  for (const std::string& p : stat_paths) {
    auto text = ReadSmallFile(p);
    if (!text.ok()) continue;  // a contention group removed meanwhile
    if (auto t = ParseCgroupCpuStat(*text, cgroup_v2_); t.ok()) now.throttled_ns[p] = t->throttled_ns;
  }
  for (const auto& [id, pid] : workers) {
    if (pid <= 0) continue;
    if (auto ticks = ProcessCpuTicks(src_.proc_root, pid); ticks.ok()) now.pid_ticks[pid] = *ticks;
  }

  std::optional<Counters> prev = std::move(prev_);
  prev_ = now;
  if (!prev) return std::optional<NodeSample>();

  NodeSample s;
  NodeMetrics& m = s.metrics;
  const double interval_s = static_cast<double>(now.mono_ns - prev->mono_ns) / 1e9;
  m.set_node(node_);
  m.set_time_ms(clock_->NowMs());
  m.set_interval_s(interval_s);
  const int ncpu = std::max(1, CountCpus(stat_text));
  m.set_num_cpus(ncpu);
  const double total = static_cast<double>(now.cpu.Total() - prev->cpu.Total());
  double busy_frac = 0;
  if (total > 0) {
    busy_frac = static_cast<double>(now.cpu.Busy() - prev->cpu.Busy()) / total;
    m.set_cpu_busy_frac(busy_frac);
    m.set_cpu_steal_frac(static_cast<double>(now.cpu.steal - prev->cpu.steal) / total);
  }
  // The most throttled group, not the sum: the groups read nest (the agent's group, a worker's
  // CPU limit, a contention group inside it), so one throttled process counts in each, and each
  // group's figure alone reaches interval x CPUs. Clamped to that bound (the kernel's and this
  // clock's intervals differ slightly).
  uint64_t throttled = 0;
  for (const auto& [p, ns] : now.throttled_ns) {
    auto it = prev->throttled_ns.find(p);
    if (it != prev->throttled_ns.end() && ns >= it->second) throttled = std::max(throttled, ns - it->second);
  }
  m.set_cpu_throttled_s(std::min(static_cast<double>(throttled) / 1e9, interval_s * ncpu));

  const double hz = static_cast<double>(TicksPerSecond());
  double workers_cores = 0;
  for (const auto& [id, pid] : workers) {
    auto a = now.pid_ticks.find(pid), b = prev->pid_ticks.find(pid);
    double cores = 0;
    if (pid > 0 && a != now.pid_ticks.end() && b != prev->pid_ticks.end() && interval_s > 0 &&
        a->second >= b->second) {
      cores = static_cast<double>(a->second - b->second) / hz / interval_s;
    }
    s.worker_cores[id] = cores;
    workers_cores += cores;
  }
  m.set_other_cpu_frac(std::max(0.0, busy_frac - workers_cores / ncpu));

  if (auto text = ReadSmallFile(src_.proc_root + "/loadavg"); text.ok()) {
    if (auto l = ParseLoadAvg1(*text); l.ok()) m.set_load1(*l);
  }
  if (auto text = ReadSmallFile(src_.proc_root + "/meminfo"); text.ok()) {
    if (auto mem = ParseMemInfo(*text); mem.ok()) {
      m.set_memory_used_bytes(mem->total_bytes - std::min(mem->total_bytes, mem->available_bytes));
      uint64_t limit = mem->total_bytes;
      if (auto lt = ReadSmallFile(memory_limit_path_); lt.ok()) {
        uint64_t v = 0;
        if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*lt), &v) && v > 0 && v < limit) limit = v;
      }
      m.set_memory_limit_bytes(limit);
    }
  }
  if (now.net && prev->net) {
    m.set_net_rx_bytes(now.net->rx >= prev->net->rx ? now.net->rx - prev->net->rx : 0);
    m.set_net_tx_bytes(now.net->tx >= prev->net->tx ? now.net->tx - prev->net->tx : 0);
  }
  if (nvml_ && nvml_->available()) {
    for (double u : nvml_->Sample()) m.add_gpu_util(u);
  }
  return std::optional<NodeSample>(std::move(s));
}

}  // namespace pacer
