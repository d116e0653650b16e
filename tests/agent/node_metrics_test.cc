// Node metrics: the parsers on known kernel text, the collector against fixture files with
// known counters, and the live collector against the kernel's own counters while a busy loop
// runs (it must show as CPU busy on the node and on the right process).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "agent/node_metrics_collector.h"
#include "monitor/report_validator.h"
#include "agent/proc_stats.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::TempDir;
using testing::WaitFor;

constexpr char kStat1[] =
    "cpu  100 10 50 800 20 5 5 10 0 0\n"
    "cpu0 50 5 25 400 10 2 3 5 0 0\n"
    "cpu1 50 5 25 400 10 3 2 5 0 0\n"
    "intr 1 2 3\n";
constexpr char kStat2[] =
    "cpu  300 10 150 1450 20 5 5 60 0 0\n"
    "cpu0 150 5 75 650 10 2 3 30 0 0\n"
    "cpu1 150 5 75 650 10 3 2 30 0 0\n";
constexpr char kNetDev1[] =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
    "    lo: 5000 10 0 0 0 0 0 0 5000 10 0 0 0 0 0 0\n"
    "  eth0: 1000 5 0 0 0 0 0 0 2000 6 0 0 0 0 0 0\n";
constexpr char kNetDev2[] =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
    "    lo: 9000 10 0 0 0 0 0 0 9000 10 0 0 0 0 0 0\n"
    "  eth0: 1500 5 0 0 0 0 0 0 2700 6 0 0 0 0 0 0\n";

TEST(ProcStatsTest, ParsesKernelText) {
  auto cpu = ParseProcStat(kStat1);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->user, 100u);
  EXPECT_EQ(cpu->steal, 10u);
  EXPECT_EQ(cpu->Total(), 1000u);
  EXPECT_EQ(cpu->Busy(), 170u);
  EXPECT_EQ(CountCpus(kStat1), 2);
  auto mem = ParseMemInfo("MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:  400 kB\n");
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ(mem->total_bytes, 1024000u);
  EXPECT_EQ(mem->available_bytes, 409600u);
  EXPECT_DOUBLE_EQ(*ParseLoadAvg1("1.25 0.50 0.10 2/300 1234\n"), 1.25);
  auto net = ParseNetDev(kNetDev1);
  ASSERT_TRUE(net.ok());
  EXPECT_EQ(net->rx, 1000u);  // loopback excluded
  EXPECT_EQ(net->tx, 2000u);
  auto v1 = ParseCgroupCpuStat("nr_periods 10\nnr_throttled 3\nthrottled_time 5000000\n", false);
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(v1->nr_throttled, 3u);
  EXPECT_EQ(v1->throttled_ns, 5000000u);
  auto v2 = ParseCgroupCpuStat("usage_usec 1\nnr_throttled 4\nthrottled_usec 7\n", true);
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(v2->throttled_ns, 7000u);
  // comm with spaces and parentheses; utime=14th, stime=15th field.
  auto ticks = ParsePidStatCpuTicks("42 (a b) c) S 1 42 42 0 -1 0 0 0 0 0 120 30 0 0 20 0 1 0");
  ASSERT_TRUE(ticks.ok());
  EXPECT_EQ(*ticks, 150u);
  EXPECT_FALSE(ParseProcStat("intr 1\n").ok());
  EXPECT_FALSE(ParseMemInfo("MemTotal: 5 kB\n").ok());
  EXPECT_FALSE(ParseCgroupCpuStat("nr_periods 1\n", false).ok());
}

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(NodeMetricsCollectorTest, FixtureCountersGiveExactFractions) {
  TempDir dir;
  const std::string proc = dir.Sub("proc"), cg = dir.Sub("cgroup");
  Write(proc + "/stat", kStat1);
  Write(proc + "/net/dev", kNetDev1);
  Write(proc + "/loadavg", "0.75 0.5 0.25 1/100 7\n");
  Write(proc + "/meminfo", "MemTotal: 1000 kB\nMemAvailable: 250 kB\n");
  Write(proc + "/" + std::to_string(getpid()) + "/cgroup", "1:cpu:/job\n2:memory:/job\n");
  Write(proc + "/77/stat", "77 (w) S 1 77 77 0 -1 0 0 0 0 0 100 0 0 0 20 0 1 0");
  Write(cg + "/cpu/cpu.stat", "nr_throttled 0\nthrottled_time 0\n");
  Write(cg + "/cpu/job/cpu.stat", "nr_throttled 1\nthrottled_time 1000000000\n");
  Write(cg + "/memory/job/memory.limit_in_bytes", "512000\n");
  SimulatedClock clock;
  NodeMetricsSources src{proc, cg, /*use_nvml=*/false};
  NodeMetricsCollector c("n1", &clock, src);
  EXPECT_EQ(c.cpu_stat_path(), cg + "/cpu/job/cpu.stat");
  EXPECT_FALSE(c.cgroup_v2());
  auto first = c.Sample({{"w0", 77}});
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->has_value());

  clock.AdvanceMs(2000);
  Write(proc + "/stat", kStat2);
  Write(proc + "/net/dev", kNetDev2);
  Write(proc + "/77/stat", "77 (w) S 1 77 77 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0");
  Write(cg + "/cpu/job/cpu.stat", "nr_throttled 5\nthrottled_time 1500000000\n");
  auto second = c.Sample({{"w0", 77}});
  ASSERT_TRUE(second.ok() && second->has_value());
  const NodeMetrics& m = (*second)->metrics;
  // Deltas: total 1000 ticks, busy 200+100 = 300, steal 50.
  EXPECT_DOUBLE_EQ(m.cpu_busy_frac(), 0.3);
  EXPECT_DOUBLE_EQ(m.cpu_steal_frac(), 0.05);
  EXPECT_DOUBLE_EQ(m.cpu_throttled_s(), 0.5);
  EXPECT_DOUBLE_EQ(m.interval_s(), 2.0);
  EXPECT_EQ(m.num_cpus(), 2u);
  EXPECT_DOUBLE_EQ(m.load1(), 0.75);
  EXPECT_EQ(m.memory_used_bytes(), 750u * 1024);
  EXPECT_EQ(m.memory_limit_bytes(), 512000u);
  EXPECT_EQ(m.net_rx_bytes(), 500u);
  EXPECT_EQ(m.net_tx_bytes(), 700u);
  // Worker: 200 ticks in 2 s at USER_HZ.
  const double cores = 200.0 / TicksPerSecond() / 2.0;
  EXPECT_DOUBLE_EQ((*second)->worker_cores.at("w0"), cores);
  EXPECT_NEAR(m.other_cpu_frac(), std::max(0.0, 0.3 - cores / 2), 1e-12);
  EXPECT_EQ(m.gpu_util_size(), 0);
}

// A worker capped under --worker-cpu-limit and slowed by a contention group nested in it: both
// groups are throttled over the same interval, and each can count up to interval x CPUs. Their
// sum went past that bound and pacerd refused every sample as bad_node_metrics for as long as
// the contention lasted. The node reports its most throttled group.
TEST(NodeMetricsCollectorTest, NestedThrottledGroupsStayWithinTheIntervalsBound) {
  TempDir dir;
  const std::string proc = dir.Sub("proc"), cg = dir.Sub("cgroup");
  Write(proc + "/stat", kStat1);
  Write(proc + "/" + std::to_string(getpid()) + "/cgroup", "1:cpu:/job\n");
  Write(cg + "/cpu/job/cpu.stat", "nr_throttled 0\nthrottled_time 0\n");
  const std::string limit = cg + "/cpu/job/pacer-w0/cpu.stat";
  const std::string contention = cg + "/cpu/job/pacer-w0/contention/cpu.stat";
  Write(limit, "nr_throttled 0\nthrottled_time 0\n");
  Write(contention, "nr_throttled 0\nthrottled_time 0\n");
  SimulatedClock clock;
  NodeMetricsCollector c("n1", &clock, NodeMetricsSources{proc, cg, /*use_nvml=*/false});
  ASSERT_TRUE(c.Sample({}, {limit, contention}).ok());
  clock.AdvanceMs(2000);
  Write(proc + "/stat", kStat2);
  // 2 CPUs, 2 s: each group throttled 3.9 s of the 4 CPU-seconds.
  Write(limit, "nr_throttled 20\nthrottled_time 3900000000\n");
  Write(contention, "nr_throttled 20\nthrottled_time 3900000000\n");
  auto s = c.Sample({}, {limit, contention});
  ASSERT_TRUE(s.ok() && s->has_value());
  const NodeMetrics& m = (*s)->metrics;
  EXPECT_DOUBLE_EQ(m.cpu_throttled_s(), 3.9);
  MonitorOptions o;
  EXPECT_EQ(CheckNodeMetrics(o, m.time_ms(), m), ReportIssue::kNone)
      << "throttled " << m.cpu_throttled_s() << " s in " << m.interval_s() << " s on " << m.num_cpus()
      << " CPUs";
}

// The live kernel: a busy child process must show as busy on the node, and as ~one core on its
// own pid, consistent with /proc read independently by the test over the same interval.
TEST(NodeMetricsCollectorTest, BusyLoopShowsAsCpuBusyAgainstKernelCounters) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
  }
  NodeMetricsCollector c("live", RealClock::Get(), NodeMetricsSources{"/proc", "/sys/fs/cgroup", false});
  auto stat0 = ReadSmallFile("/proc/stat");
  ASSERT_TRUE(c.Sample({{"busy", child}, {"self", getpid()}}).ok());
  auto t0 = ProcessCpuTicks("/proc", child);
  const auto w0 = std::chrono::steady_clock::now();
  // Measurement window (not synchronisation): the counters need time to move.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto stat1 = ReadSmallFile("/proc/stat");
  auto t1 = ProcessCpuTicks("/proc", child);
  const double window_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  auto s = c.Sample({{"busy", child}, {"self", getpid()}});
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(s.ok() && s->has_value()) << s.status();
  ASSERT_TRUE(stat0.ok() && stat1.ok() && t0.ok() && t1.ok());
  const NodeMetrics& m = (*s)->metrics;
  const CpuTicks a = *ParseProcStat(*stat0), b = *ParseProcStat(*stat1);
  const double kernel_busy = static_cast<double>(b.Busy() - a.Busy()) / (b.Total() - a.Total());
  // Over the window actually slept (a loaded machine oversleeps), as the collector does.
  const double kernel_child_cores = static_cast<double>(*t1 - *t0) / TicksPerSecond() / window_s;
  const double ncpu = m.num_cpus();
  std::cout << "collector busy " << m.cpu_busy_frac() << ", kernel busy " << kernel_busy
            << ", busy child " << (*s)->worker_cores.at("busy") << " cores (kernel "
            << kernel_child_cores << "), self " << (*s)->worker_cores.at("self") << " cores, "
            << ncpu << " cpus" << std::endl;
  // Same counters, same window (to within the few ms between the reads).
  EXPECT_NEAR(m.cpu_busy_frac(), kernel_busy, 0.05);
  // Relative, not absolute: the busy loop's share is whatever the machine's load leaves it
  // (0.07..0.1 of a core was measured on the shared 2-core machine under load), so a fixed
  // tolerance of 0.1 could not tell a right figure from 0. Three ticks (USER_HZ) of slack.
  const double busy = (*s)->worker_cores.at("busy");
  EXPECT_NEAR(busy, kernel_child_cores,
              std::max(3.0 / TicksPerSecond() / window_s, 0.1 * kernel_child_cores));
  // The busy loop runs: it shows on the node and on the right process (a fixed floor of 0.2,
  // then 0.1, of a core was not reached under load; the kernel's own count is the reference).
  EXPECT_GT(kernel_child_cores, 0.0);
  EXPECT_GT(busy, 2 * (*s)->worker_cores.at("self"));
  EXPECT_GE(m.cpu_busy_frac(), 0.8 * (*s)->worker_cores.at("busy") / ncpu);
  EXPECT_LT((*s)->worker_cores.at("self"), 0.2);  // the test itself mostly sleeps
  EXPECT_GT(m.memory_used_bytes(), 0u);
  EXPECT_GT(m.memory_limit_bytes(), 0u);
}

}  // namespace
}  // namespace pacer
