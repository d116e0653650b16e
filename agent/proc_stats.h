// Parsers for the kernel's counters the agent reports (pure functions on file text) and the
// readers that fetch that text. Kept apart from NodeMetricsCollector so tests can feed known
// text and compare with the kernel's own files.
//
// Sources: /proc/stat (aggregate "cpu" line, USER_HZ ticks), /proc/meminfo (kB), /proc/loadavg,
// /proc/net/dev (bytes per interface, loopback excluded), /proc/<pid>/stat (utime + stime of one
// process), and cgroup cpu.stat (v1: nr_throttled + throttled_time in ns; v2: nr_throttled +
// throttled_usec).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace pacer {

struct CpuTicks {
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  uint64_t Total() const { return user + nice + system + idle + iowait + irq + softirq + steal; }
  // Time spent running something (steal excluded: another guest ran, not us).
  uint64_t Busy() const { return user + nice + system + irq + softirq; }
};

struct MemInfo {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
};

struct NetBytes {
  uint64_t rx = 0, tx = 0;
};

struct CgroupThrottling {
  uint64_t nr_throttled = 0;
  uint64_t throttled_ns = 0;
};

absl::StatusOr<CpuTicks> ParseProcStat(absl::string_view text);
absl::StatusOr<MemInfo> ParseMemInfo(absl::string_view text);
absl::StatusOr<double> ParseLoadAvg1(absl::string_view text);
absl::StatusOr<NetBytes> ParseNetDev(absl::string_view text);
// `v2`: throttled_usec instead of throttled_time (ns).
absl::StatusOr<CgroupThrottling> ParseCgroupCpuStat(absl::string_view text, bool v2);
// utime + stime in clock ticks from /proc/<pid>/stat (the comm field may hold spaces).
absl::StatusOr<uint64_t> ParsePidStatCpuTicks(absl::string_view text);

// Reads a whole (small) file; NOT_FOUND when it cannot be opened.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

// CPU ticks (utime + stime) of a live process.
absl::StatusOr<uint64_t> ProcessCpuTicks(const std::string& proc_root, pid_t pid);

// The cgroup path (relative to the controller mount) of `pid` for the v1 controller `controller`
// (e.g. "cpu"), or of the v2 unified hierarchy when `controller` is empty.
absl::StatusOr<std::string> CgroupPathOf(const std::string& proc_root, pid_t pid,
                                         const std::string& controller);

// Kernel clock ticks per second (USER_HZ).
long TicksPerSecond();

}  // namespace pacer

namespace pacer {
// Number of "cpuN" lines in /proc/stat (online CPUs).
int CountCpus(absl::string_view proc_stat_text);
}  // namespace pacer
