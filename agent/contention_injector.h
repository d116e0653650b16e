// ContentionInjector: the fault-injection switch that slows one worker with real CPU contention,
// so stragglers in tests and demos are real, never faked inside the trainer.
//
// `factor` f > 1 means the worker gets 1/f of the CPU it had. Two methods:
//  - cgroup (cgroup v1 cpu controller writable at <cgroup_root>/cpu): a child group
//    "pacer-agent-<agent pid>-<worker id>" under the worker's own cpu cgroup with
//    cpu.cfs_quota_us = period * baseline_cores / f, and the worker's pid moved into it
//    (children it starts later inherit it). The kernel throttles it; cpu.stat of the group shows
//    nr_throttled / throttled_time, which the node metrics add up. Clear() moves the processes
//    back to the original group and removes the group.
//  - cpu-hog (the fallback when the cgroup is not writable): the worker's threads are pinned to
//    the CPU it last ran on (sched_setaffinity) and ceil(f-1) busy processes are pinned to the
//    same CPU, at nice levels chosen so that CFS gives the worker 1/f of that core (weights from
//    the kernel's nice->weight table; assumes the worker itself runs at nice 0). The other
//    workers named in Apply() are kept off that CPU (when the node has another), so the hogs do
//    not slow them; they are not re-pinned if they are relaunched meanwhile. Clear() kills the
//    hogs and restores every CPU mask it changed. The nice levels are only the first guess:
//    other load on that CPU (a shared node) takes its own share, so Regulate() -- called with
//    every metrics sample -- steers the hogs' total weight until the worker's measured CPU
//    share is min(baseline_cores, 1) / f, the same target as the cgroup method's quota.
// Groups left by a previous agent that was SIGKILLed are removed by RemoveStaleGroups().
//
// Owns the groups it created and the hog processes (its children: the agent's SIGCHLD handler
// passes their exits to OnChildExit). Not thread-safe: the agent's event loop owns it.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pacer {

enum class ContentionMethod { kAuto, kCgroup, kCpuHog };
const char* ContentionMethodName(ContentionMethod m);
bool ParseContentionMethod(const std::string& s, ContentionMethod* out);

struct ContentionOptions {
  ContentionMethod method = ContentionMethod::kAuto;
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string proc_root = "/proc";
  // CFS bandwidth period of the cgroup method. Short periods spread the worker's share finely
  // (a throttled worker stalls at most one period), as a co-located busy job would: with the
  // kernel's 100 ms default a worker left 0.1 core sits throttled for ~90 ms at a stretch, and
  // every collective it takes part in stalls with it. Widened when the quota would fall below
  // the kernel's 1 ms minimum.
  int64_t cfs_period_us = 10'000;
  // > 0: every worker runs in its own cgroup with this many cores (CFS quota, same period), as
  // a container's CPU limit would give it -- its speed then depends on its own budget, not on
  // how much CPU its neighbours leave idle while they wait in a collective (the way one node
  // per worker behaves). Contention nests inside that group. 0: no limit.
  double worker_cpu_limit_cores = 0;
};

class ContentionInjector {
 public:
  explicit ContentionInjector(ContentionOptions options);
  ~ContentionInjector();  // clears every contention and CPU limit it set
  ContentionInjector(const ContentionInjector&) = delete;
  ContentionInjector& operator=(const ContentionInjector&) = delete;

  // Slows worker `worker_id` (process `pid`) by `factor` (> 1, <= 100). `baseline_cores` is
  // the CPU the worker used recently (cgroup method; <= 0: one core). Replaces any contention
  // already set on that worker. INVALID_ARGUMENT for a bad factor, NOT_FOUND for a dead pid,
  // UNAVAILABLE when no method works here.
  // `others`: the node's other worker processes (cpu-hog method: kept off the hog's CPU).
  absl::Status Apply(const std::string& worker_id, pid_t pid, double factor, double baseline_cores,
                     const std::vector<pid_t>& others = {});
  // Re-applies a worker's CPU limit and contention to its new process after a (re)launch
  // (no-op when neither is set).
  absl::Status Reapply(const std::string& worker_id, pid_t pid);
  // Removes the contention of one worker (OK when there is none).
  absl::Status Clear(const std::string& worker_id);
  void ClearAll();  // contention only; the CPU-limit groups go with the injector

  std::optional<double> FactorOf(const std::string& worker_id) const;
  // Method in force for a worker ("cgroup" / "cpu-hog"); empty when none.
  std::string MethodOf(const std::string& worker_id) const;
  // cpu.stat files of the groups in force (for the node's throttling metric).
  std::vector<std::string> CpuStatPaths() const;
  // True when `pid` was one of the hogs (an unexpected hog death is logged).
  bool OnChildExit(pid_t pid);
  // cpu-hog method: feedback from the CPU cores each worker used over the last metrics interval
  // (worker id -> cores). With CFS sharing the worker's CPU by weight, its share is
  // s = w / (w + H + F) (w its weight, H the hogs', F the foreign load's), so the hog weight
  // that gives the target t is H + w * (1/t - 1/s): applied with a gain of 0.6, inside a +-5 %
  // dead band, spread over the hogs as nice levels. The first sample after Apply() (it covers
  // time before the hogs) is skipped.
  void Regulate(const std::map<std::string, double>& worker_cores);

  // Removes "pacer-agent-<pid>-*" groups under the agent's cpu cgroup whose agent is gone.
  void RemoveStaleGroups();

 private:
  struct Entry {
    double factor = 0;
    double baseline_cores = 0;
    std::vector<pid_t> others;
    ContentionMethod method = ContentionMethod::kCgroup;
    pid_t pid = 0;
    std::string group_dir;      // cgroup method
    std::string original_dir;   // the worker's cgroup before
    std::vector<pid_t> hogs;    // cpu-hog method
    double hog_weight = 0;      // their total CFS weight now (Regulate() moves it)
    bool priority_refused = false;  // a hog's setpriority was refused (logged once)
    int samples_to_skip = 0;
    std::vector<int> original_cpus;
    std::vector<std::pair<pid_t, std::vector<int>>> moved_others;  // pid, original CPUs
  };

  absl::Status ApplyCgroup(const std::string& worker_id, Entry& e);
  absl::Status ApplyLimit(const std::string& worker_id, pid_t pid);
  void RemoveLimits();
  absl::Status ApplyCpuHog(Entry& e, const std::vector<pid_t>& others);
  void Remove(Entry& e);
  bool CgroupWritable() const;

  ContentionOptions options_;
  std::map<std::string, Entry> entries_;
  struct LimitGroup {
    std::string dir, original_dir;
  };
  std::map<std::string, LimitGroup> limits_;  // worker id -> its CPU-limit cgroup
};

}  // namespace pacer
