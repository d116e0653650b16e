#include "agent/contention_injector.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "agent/child_process.h"
#include "agent/proc_stats.h"
#include "common/log.h"

namespace pacer {

namespace {

// `root` and its descendants, from the parent pids in <proc>/<pid>/stat (root first).
std::vector<pid_t> ProcessTree(const std::string& proc_root, pid_t root) {
  std::multimap<pid_t, pid_t> children;
  if (DIR* d = opendir(proc_root.c_str())) {
    while (struct dirent* ent = readdir(d)) {
      pid_t pid = 0;
      if (!absl::SimpleAtoi(ent->d_name, &pid) || pid <= 0) continue;
      std::ifstream f(proc_root + "/" + ent->d_name + "/stat");
      std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses; parse after the last ')'.
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
      pid_t ppid = 0;
      if (fields.size() >= 2 && absl::SimpleAtoi(fields[1], &ppid)) children.emplace(ppid, pid);
    }
    closedir(d);
  }
  std::vector<pid_t> out = {root};
  for (size_t i = 0; i < out.size() && out.size() < 4096; ++i) {
    auto [b, e] = children.equal_range(out[i]);
    for (auto it = b; it != e; ++it) out.push_back(it->second);
  }
  return out;
}

}  // namespace
namespace {

// The kernel's sched_prio_to_weight[] (nice -20 .. 19).
constexpr int kNiceWeights[40] = {
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
    9548,  7620,  6100,  4904,  3906,  3121,  2501,  1991,  1586,  1277,
    1024,  820,   655,   526,   423,   335,   272,   215,   172,   137,
    110,   87,    70,    56,    45,    36,    29,    23,    18,    15};

constexpr double kWorkerWeight = 1024;  // nice 0

int NiceForWeight(double weight) {
  int best = 0;
  double best_err = 1e18;
  for (int i = 0; i < 40; ++i) {
    const double err = std::abs(std::log(kNiceWeights[i] / weight));
    if (err < best_err) best_err = err, best = i;
  }
  return best - 20;
}

absl::Status WriteFile(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  if (!out) return absl::UnavailableError("cannot open " + path);
  out << value;
  out.flush();
  if (!out) return absl::UnavailableError("cannot write '" + value + "' to " + path);
  return absl::OkStatus();
}

// Moves every process of `from` into `to` (best effort).
void MoveAllProcs(const std::string& from, const std::string& to) {
  auto text = ReadSmallFile(from + "/cgroup.procs");
  if (!text.ok()) return;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    (void)WriteFile(to + "/cgroup.procs", std::string(line));
  }
}

std::vector<pid_t> ThreadsOf(const std::string& proc_root, pid_t pid) {
  std::vector<pid_t> out;
  const std::string dir = proc_root + "/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      int tid = 0;
      if (absl::SimpleAtoi(e->d_name, &tid)) out.push_back(tid);
    }
    closedir(d);
  }
  return out;
}

// The CPU `pid` last ran on (/proc/<pid>/stat field 39).
int LastCpuOf(const std::string& proc_root, pid_t pid) {
  auto text = ReadSmallFile(proc_root + "/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return 0;
  const size_t close = text->rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<absl::string_view> f = absl::StrSplit(absl::string_view(*text).substr(close + 1), ' ',
                                                   absl::SkipWhitespace());
  int cpu = 0;
  if (f.size() > 36 && absl::SimpleAtoi(f[36], &cpu)) return cpu;
  return 0;
}

// Gives the cgroup `dir` `cores` CPUs of CFS bandwidth: period `period_us`, widened when the
// quota would fall below the kernel's 1 ms minimum.
absl::Status WriteCpuQuota(const std::string& dir, double cores, int64_t period_us) {
  constexpr int64_t kMinQuotaUs = 1000, kMaxPeriodUs = 1'000'000;  // the kernel's limits
  const int64_t period = std::clamp<int64_t>(
      std::max<int64_t>(period_us, std::llround(kMinQuotaUs / cores)), kMinQuotaUs, kMaxPeriodUs);
  const int64_t quota = std::max<int64_t>(kMinQuotaUs, std::llround(period * cores));
  // Quota first to -1 so a shorter period is never refused for being below a child's quota.
  (void)WriteFile(dir + "/cpu.cfs_quota_us", "-1");
  if (absl::Status s = WriteFile(dir + "/cpu.cfs_period_us", std::to_string(period)); !s.ok()) return s;
  return WriteFile(dir + "/cpu.cfs_quota_us", std::to_string(quota));
}

}  // namespace

const char* ContentionMethodName(ContentionMethod m) {
  switch (m) {
    case ContentionMethod::kAuto: return "auto";
    case ContentionMethod::kCgroup: return "cgroup";
    case ContentionMethod::kCpuHog: return "cpu-hog";
  }
  return "?";
}

bool ParseContentionMethod(const std::string& s, ContentionMethod* out) {
  for (auto m : {ContentionMethod::kAuto, ContentionMethod::kCgroup, ContentionMethod::kCpuHog}) {
    if (s == ContentionMethodName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

ContentionInjector::ContentionInjector(ContentionOptions options) : options_(std::move(options)) {}

ContentionInjector::~ContentionInjector() {
  ClearAll();
  RemoveLimits();
}

bool ContentionInjector::CgroupWritable() const {
  const std::string root = options_.cgroup_root + "/cpu";
  return access((root + "/cpu.cfs_quota_us").c_str(), F_OK) == 0 &&
         access(root.c_str(), W_OK) == 0;
}

absl::Status ContentionInjector::Apply(const std::string& worker_id, pid_t pid, double factor,
                                       double baseline_cores, const std::vector<pid_t>& others) {
  if (!(factor > 1.0 && factor <= 100.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("factor must be in (1, 100], not %g", factor));
  }
  if (pid <= 0 || kill(pid, 0) != 0) {
    return absl::NotFoundError("worker '" + worker_id + "' has no live process");
  }
  (void)Clear(worker_id);
  Entry e;
  e.factor = factor;
  e.baseline_cores = baseline_cores > 0.05 ? baseline_cores : 1.0;
  e.pid = pid;
  e.others = others;
  const bool try_cgroup = options_.method == ContentionMethod::kCgroup ||
                          (options_.method == ContentionMethod::kAuto && CgroupWritable());
  absl::Status s = absl::UnavailableError("cgroup not tried");
  if (try_cgroup) {
    e.method = ContentionMethod::kCgroup;
    s = ApplyCgroup(worker_id, e);
    if (!s.ok() && options_.method == ContentionMethod::kAuto) {
      PACER_LOG(WARNING) << "cgroup contention failed (" << s.message() << "); using a CPU hog";
      Remove(e);
    }
  }
  if (!s.ok() && options_.method != ContentionMethod::kCgroup) {
    e.method = ContentionMethod::kCpuHog;
    s = ApplyCpuHog(e, others);
  }
  if (!s.ok()) {
    Remove(e);
    return s;
  }
  PACER_LOG(INFO) << "contention on worker " << worker_id << " (pid " << pid << "): factor "
                  << factor << " by " << ContentionMethodName(e.method)
                  << (e.method == ContentionMethod::kCgroup
                          ? absl::StrFormat(" (quota %.3f cores of %.3f)", e.baseline_cores / factor,
                                            e.baseline_cores)
                          : absl::StrFormat(" (%d hog(s))", e.hogs.size()));
  entries_[worker_id] = std::move(e);
  return absl::OkStatus();
}

absl::Status ContentionInjector::ApplyCgroup(const std::string& worker_id, Entry& e) {
  auto rel = CgroupPathOf(options_.proc_root, e.pid, "cpu");
  if (!rel.ok()) return absl::UnavailableError(std::string(rel.status().message()));
  std::string base = options_.cgroup_root + "/cpu" + *rel;
  if (!base.empty() && base.back() == '/') base.pop_back();
  e.original_dir = base;
  e.group_dir = absl::StrFormat("%s/pacer-agent-%d-%s", base, getpid(), worker_id);
  if (mkdir(e.group_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    const std::string why = strerror(errno);
    e.group_dir.clear();
    return absl::UnavailableError("mkdir cgroup: " + why);
  }
  double cores = e.baseline_cores / e.factor;
  // Nested in a CPU-limit group: never above the limit (cgroup v1 refuses a child quota above
  // its parent's; a noisy usage sample can exceed the limit a little).
  if (options_.worker_cpu_limit_cores > 0) cores = std::min(cores, options_.worker_cpu_limit_cores / e.factor);
  if (absl::Status s = WriteCpuQuota(e.group_dir, cores, options_.cfs_period_us); !s.ok()) {
    return s;
  }
  // The worker and every process it started already (a PyTorch trainer's DataLoader worker
  // processes do its decoding): the whole worker is slowed, not only its main process.
  for (pid_t p : ProcessTree(options_.proc_root, e.pid)) {
    absl::Status s = WriteFile(e.group_dir + "/cgroup.procs", std::to_string(p));
    if (!s.ok() && p == e.pid) return s;  // a child that exited meanwhile is not an error
  }
  return absl::OkStatus();
}

absl::Status ContentionInjector::ApplyLimit(const std::string& worker_id, pid_t pid) {
  const double cores = options_.worker_cpu_limit_cores;
  if (!(cores > 0)) return absl::OkStatus();
  auto it = limits_.find(worker_id);
  if (it == limits_.end()) {
    auto rel = CgroupPathOf(options_.proc_root, pid, "cpu");
    if (!rel.ok()) return absl::UnavailableError(std::string(rel.status().message()));
    LimitGroup g;
    g.original_dir = options_.cgroup_root + "/cpu" + *rel;
    if (!g.original_dir.empty() && g.original_dir.back() == '/') g.original_dir.pop_back();
    g.dir = absl::StrFormat("%s/pacer-agent-%d-limit-%s", g.original_dir, getpid(), worker_id);
    if (mkdir(g.dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::UnavailableError("mkdir cgroup " + g.dir + ": " + strerror(errno));
    }
    if (absl::Status s = WriteCpuQuota(g.dir, cores, options_.cfs_period_us); !s.ok()) {
      rmdir(g.dir.c_str());
      return s;
    }
    PACER_LOG(INFO) << "worker " << worker_id << " limited to " << cores << " core(s) (" << g.dir << ")";
    it = limits_.emplace(worker_id, std::move(g)).first;
  }
  return WriteFile(it->second.dir + "/cgroup.procs", std::to_string(pid));
}

void ContentionInjector::RemoveLimits() {
  for (auto& [id, g] : limits_) {
    MoveAllProcs(g.dir, g.original_dir);
    if (rmdir(g.dir.c_str()) != 0 && errno != ENOENT) {
      PACER_LOG(WARNING) << "cannot remove cgroup " << g.dir << ": " << strerror(errno);
    }
  }
  limits_.clear();
}

std::vector<int> CpusOf(pid_t pid) {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(pid, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) out.push_back(c);
    }
  }
  return out;
}

void PinThreads(const std::string& proc_root, pid_t pid, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  for (pid_t tid : ThreadsOf(proc_root, pid)) sched_setaffinity(tid, sizeof(set), &set);
}

absl::Status ContentionInjector::ApplyCpuHog(Entry& e, const std::vector<pid_t>& others) {
  const int cpu = LastCpuOf(options_.proc_root, e.pid);
  cpu_set_t old_set;
  CPU_ZERO(&old_set);
  if (sched_getaffinity(e.pid, sizeof(old_set), &old_set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &old_set)) e.original_cpus.push_back(c);
    }
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  for (pid_t tid : ThreadsOf(options_.proc_root, e.pid)) {
    if (sched_setaffinity(tid, sizeof(one), &one) != 0) {
      return absl::UnavailableError("sched_setaffinity: " + std::string(strerror(errno)));
    }
  }
  // First guess, for an otherwise idle CPU: worker weight 1024 (nice 0), the hogs together
  // 1024 * (f / baseline - 1); Regulate() corrects for the load that is there.
  const double target = std::min(e.baseline_cores, 1.0) / e.factor;
  // As many hogs as nice 0 needs on an idle CPU (no privilege needed then); more weight, when
  // the load or a baseline under one core asks for it, comes from lower nice levels.
  const int hogs = std::max(1, static_cast<int>(std::ceil(e.factor - 1.0 - 1e-9)));
  e.hog_weight = kWorkerWeight * (1.0 / target - 1.0);
  const int nice = NiceForWeight(e.hog_weight / hogs);
  for (int i = 0; i < hogs; ++i) {
    auto hog = SpawnCpuHog(cpu, nice);
    if (!hog.ok()) return hog.status();
    e.hogs.push_back(*hog);
  }
  e.samples_to_skip = 1;
  for (pid_t other : others) {  // keep the node's other workers off the contended CPU
    std::vector<int> cpus = CpusOf(other), rest;
    for (int c : cpus) {
      if (c != cpu) rest.push_back(c);
    }
    if (other <= 0 || other == e.pid || rest.empty() || rest.size() == cpus.size()) continue;
    PinThreads(options_.proc_root, other, rest);
    e.moved_others.push_back({other, cpus});
  }
  return absl::OkStatus();
}

void ContentionInjector::Remove(Entry& e) {
  if (!e.group_dir.empty()) {
    MoveAllProcs(e.group_dir, e.original_dir);
    if (rmdir(e.group_dir.c_str()) != 0 && errno != ENOENT) {
      PACER_LOG(WARNING) << "cannot remove cgroup " << e.group_dir << ": " << strerror(errno);
    }
    e.group_dir.clear();
  }
  for (pid_t h : e.hogs) kill(h, SIGKILL);  // reaped by the agent's SIGCHLD handler
  e.hogs.clear();
  if (!e.original_cpus.empty() && e.pid > 0) {
    PinThreads(options_.proc_root, e.pid, e.original_cpus);
    e.original_cpus.clear();
  }
  for (const auto& [pid, cpus] : e.moved_others) PinThreads(options_.proc_root, pid, cpus);
  e.moved_others.clear();
}

absl::Status ContentionInjector::Reapply(const std::string& worker_id, pid_t pid) {
  if (absl::Status s = ApplyLimit(worker_id, pid); !s.ok()) {
    PACER_LOG(WARNING) << "CPU limit of worker " << worker_id << " not applied: " << s.message();
  }
  auto it = entries_.find(worker_id);
  if (it == entries_.end()) return absl::OkStatus();
  const double factor = it->second.factor, baseline = it->second.baseline_cores;
  const std::vector<pid_t> others = it->second.others;
  return Apply(worker_id, pid, factor, baseline, others);
}

absl::Status ContentionInjector::Clear(const std::string& worker_id) {
  auto it = entries_.find(worker_id);
  if (it == entries_.end()) return absl::OkStatus();
  Remove(it->second);
  // Log before erasing: `worker_id` may be the entry's own key (ClearAll), freed by the erase.
  PACER_LOG(INFO) << "contention on worker " << worker_id << " cleared";
  entries_.erase(it);
  return absl::OkStatus();
}

void ContentionInjector::ClearAll() {
  while (!entries_.empty()) {
    const std::string id = entries_.begin()->first;  // a copy: Clear() erases the key
    (void)Clear(id);
  }
}

std::optional<double> ContentionInjector::FactorOf(const std::string& worker_id) const {
  auto it = entries_.find(worker_id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.factor;
}

std::string ContentionInjector::MethodOf(const std::string& worker_id) const {
  auto it = entries_.find(worker_id);
  return it == entries_.end() ? "" : ContentionMethodName(it->second.method);
}

std::vector<std::string> ContentionInjector::CpuStatPaths() const {
  std::vector<std::string> out;
  for (const auto& [id, e] : entries_) {
    if (!e.group_dir.empty()) out.push_back(e.group_dir + "/cpu.stat");
  }
  return out;
}

bool ContentionInjector::OnChildExit(pid_t pid) {
  for (auto& [id, e] : entries_) {
    auto it = std::find(e.hogs.begin(), e.hogs.end(), pid);
    if (it == e.hogs.end()) continue;
    e.hogs.erase(it);
    PACER_LOG(WARNING) << "CPU hog " << pid << " of worker " << id << " died";
    return true;
  }
  return false;
}

void ContentionInjector::Regulate(const std::map<std::string, double>& worker_cores) {
  constexpr double kGain = 0.6, kDeadBand = 0.05;
  for (auto& [id, e] : entries_) {
    if (e.method != ContentionMethod::kCpuHog || e.hogs.empty()) continue;
    auto it = worker_cores.find(id);
    if (it == worker_cores.end()) continue;
    if (e.samples_to_skip > 0) {
      --e.samples_to_skip;
      continue;
    }
    const double target = std::min(e.baseline_cores, 1.0) / e.factor;
    const double share = std::max(it->second, 0.01);
    if (std::abs(share / target - 1.0) <= kDeadBand) continue;
    const double n = static_cast<double>(e.hogs.size());
    const double weight = std::clamp(e.hog_weight + kGain * kWorkerWeight * (1.0 / target - 1.0 / share),
                                     n * kNiceWeights[39], n * kNiceWeights[0]);
    // Spread the weight over the hogs, each at the nice level nearest to what is left per hog.
    double left = weight;
    for (size_t i = 0; i < e.hogs.size(); ++i) {
      int nice = NiceForWeight(left / static_cast<double>(e.hogs.size() - i));
      if (setpriority(PRIO_PROCESS, static_cast<id_t>(e.hogs[i]), nice) != 0) {
        // Without CAP_SYS_NICE (an unprivileged container) a nice level can only go up: the
        // hog keeps the level it has, and that is the weight it gives.
        if (!e.priority_refused) {
          PACER_LOG(WARNING) << "setpriority(hog " << e.hogs[i] << ", " << nice << "): " << strerror(errno)
                             << ": without CAP_SYS_NICE the hogs of " << id
                             << " cannot gain priority; the slow-down may stay under the factor";
          e.priority_refused = true;
        }
        errno = 0;
        const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(e.hogs[i]));
        if (errno == 0) nice = std::clamp(now, -20, 19);
      }
      left -= kNiceWeights[nice + 20];
    }
    PACER_LOG(DEBUG) << "cpu-hog " << id << ": share " << share << " cores, target " << target
                     << ": hog weight " << e.hog_weight << " -> " << weight - left;
    e.hog_weight = weight - left;  // what the nice levels really give
  }
}

void ContentionInjector::RemoveStaleGroups() {
  auto rel = CgroupPathOf(options_.proc_root, getpid(), "cpu");
  if (!rel.ok()) return;
  std::string base = options_.cgroup_root + "/cpu" + *rel;
  if (!base.empty() && base.back() == '/') base.pop_back();
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    int owner = 0;
    absl::string_view name = e->d_name;
    if (name.rfind("pacer-agent-", 0) != 0) continue;
    absl::string_view rest = name.substr(12);
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &owner)) continue;
    if (owner == getpid() || kill(owner, 0) == 0) continue;  // its agent is alive
    stale.push_back(base + "/" + std::string(name));
  }
  closedir(d);
  for (const std::string& g : stale) {
    // A dead agent's CPU-limit group may still hold its contention group.
    if (DIR* sub = opendir(g.c_str())) {
      std::vector<std::string> children;
      while (dirent* e = readdir(sub)) {
        if (absl::string_view(e->d_name).rfind("pacer-agent-", 0) == 0) children.push_back(g + "/" + e->d_name);
      }
      closedir(sub);
      for (const std::string& c : children) {
        MoveAllProcs(c, base);
        rmdir(c.c_str());
      }
    }
    MoveAllProcs(g, base);
    if (rmdir(g.c_str()) == 0) {
      PACER_LOG(INFO) << "removed stale contention cgroup " << g;
    }
  }
}

}  // namespace pacer
