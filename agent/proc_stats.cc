#include "agent/proc_stats.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pacer {
namespace {

std::vector<absl::string_view> Fields(absl::string_view line) {
  return absl::StrSplit(line, ' ', absl::SkipWhitespace());
}

}  // namespace

absl::StatusOr<CpuTicks> ParseProcStat(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    auto f = Fields(line);
    if (f.empty() || f[0] != "cpu") continue;
    if (f.size() < 9) return absl::InvalidArgumentError("/proc/stat: short cpu line");
    uint64_t v[8];
    for (int i = 0; i < 8; ++i) {
      if (!absl::SimpleAtoi(f[i + 1], &v[i])) {
        return absl::InvalidArgumentError("/proc/stat: bad number in cpu line");
      }
    }
    return CpuTicks{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
  }
  return absl::InvalidArgumentError("/proc/stat: no aggregate cpu line");
}

absl::StatusOr<MemInfo> ParseMemInfo(absl::string_view text) {
  MemInfo m;
  bool total = false, avail = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    auto f = Fields(line);
    if (f.size() < 2) continue;
    uint64_t kb = 0;
    if (!absl::SimpleAtoi(f[1], &kb)) continue;
    if (f[0] == "MemTotal:") m.total_bytes = kb * 1024, total = true;
    if (f[0] == "MemAvailable:") m.available_bytes = kb * 1024, avail = true;
  }
  if (!total || !avail) return absl::InvalidArgumentError("/proc/meminfo: MemTotal/MemAvailable missing");
  return m;
}

absl::StatusOr<double> ParseLoadAvg1(absl::string_view text) {
  auto f = Fields(text);
  double v = 0;
  if (f.empty() || !absl::SimpleAtod(f[0], &v)) return absl::InvalidArgumentError("/proc/loadavg: bad");
  return v;
}

absl::StatusOr<NetBytes> ParseNetDev(absl::string_view text) {
  NetBytes n;
  int interfaces = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;  // the two header lines
    absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
    auto f = Fields(line.substr(colon + 1));
    if (f.size() < 16) return absl::InvalidArgumentError("/proc/net/dev: short line");
    uint64_t rx = 0, tx = 0;
    if (!absl::SimpleAtoi(f[0], &rx) || !absl::SimpleAtoi(f[8], &tx)) {
      return absl::InvalidArgumentError("/proc/net/dev: bad number");
    }
    ++interfaces;
    if (name == "lo") continue;
    n.rx += rx;
    n.tx += tx;
  }
  if (interfaces == 0) return absl::InvalidArgumentError("/proc/net/dev: no interfaces");
  return n;
}

absl::StatusOr<CgroupThrottling> ParseCgroupCpuStat(absl::string_view text, bool v2) {
  CgroupThrottling t;
  bool nr = false, time = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    auto f = Fields(line);
    if (f.size() < 2) continue;
    uint64_t v = 0;
    if (!absl::SimpleAtoi(f[1], &v)) continue;
    if (f[0] == "nr_throttled") t.nr_throttled = v, nr = true;
    if (!v2 && f[0] == "throttled_time") t.throttled_ns = v, time = true;
    if (v2 && f[0] == "throttled_usec") t.throttled_ns = v * 1000, time = true;
  }
  if (!nr || !time) return absl::InvalidArgumentError("cpu.stat: throttling counters missing");
  return t;
}

absl::StatusOr<uint64_t> ParsePidStatCpuTicks(absl::string_view text) {
  const size_t close = text.rfind(')');
  if (close == absl::string_view::npos) return absl::InvalidArgumentError("pid stat: no comm");
  // After "pid (comm) ": state(3) ppid(4) ... utime(14) stime(15), 1-based over the whole line.
  auto f = Fields(text.substr(close + 1));
  if (f.size() < 13) return absl::InvalidArgumentError("pid stat: short");
  uint64_t utime = 0, stime = 0;
  if (!absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
    return absl::InvalidArgumentError("pid stat: bad utime/stime");
  }
  return utime + stime;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<uint64_t> ProcessCpuTicks(const std::string& proc_root, pid_t pid) {
  auto text = ReadSmallFile(proc_root + "/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return text.status();
  return ParsePidStatCpuTicks(*text);
}

absl::StatusOr<std::string> CgroupPathOf(const std::string& proc_root, pid_t pid,
                                         const std::string& controller) {
  auto text = ReadSmallFile(proc_root + "/" + std::to_string(pid) + "/cgroup");
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    // "hierarchy-id:controller-list:path"
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (controller.empty()) {
      if (parts[0] == "0" && parts[1].empty()) return std::string(parts[2]);
      continue;
    }
    for (absl::string_view c : absl::StrSplit(parts[1], ',')) {
      if (c == controller) return std::string(parts[2]);
    }
  }
  return absl::NotFoundError("no cgroup '" + controller + "' for pid " + std::to_string(pid));
}

long TicksPerSecond() {
  static const long hz = sysconf(_SC_CLK_TCK);
  return hz > 0 ? hz : 100;
}

}  // namespace pacer

namespace pacer {
int CountCpus(absl::string_view text) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.size() > 3 && line.substr(0, 3) == "cpu" && line[3] >= '0' && line[3] <= '9') ++n;
  }
  return n;
}
}  // namespace pacer
