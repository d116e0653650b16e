// RunTracker: which training run of the job the workers belong to, and the job's step in it.
//
// A *run* is one launch of the job's training script: its workers count steps from where the
// run began (0, or a checkpoint's step). Batch plans name the step at which every worker
// switches, so a plan only makes sense within the run it was made for: pacerd's reconciler
// withdraws the plan in force when a new run begins and counts the job's step anew.
//
// A registration (a new worker process) begins a new run when
//  1. it carries a run id (PACER_RUN_ID / TORCHELASTIC_RUN_ID) and the current run has another
//     one: ids decide, and a process of the same id rejoins the run (a restarted rank);
//  2. without ids to compare, no worker of the current run is present: none was heard
//     (registration or heartbeat) within `gone_after_ms`;
// and a heartbeat begins one when, without ids,
//  3. the steps went backwards for every present worker: each was replaced by a new process
//     that reported a step below the last one its predecessor reported (a job relaunched
//     within `gone_after_ms` of the previous run's end, when rule 2 cannot see the gap).
// One restarted worker among live ones is a restart within the run, not a new run.
//
// Until then a new process of a worker the run knew is *unconfirmed* (InRun false): without run
// ids, the first rank of a job relaunched at once registers while its peers' last processes
// still count as present, and whether it restarts within the run or starts a new one shows only
// later. It is confirmed when the run goes on around it — a peer of the run (not replaced since)
// reports a step after the registration, or its own steps do not go back below its
// predecessor's — and every process is confirmed when a new run begins. pacerd holds the run's
// batch plan back from an unconfirmed process: a plan of the old run applied by the first rank
// of the new one alone would give the ranks different batches for the whole run when no new
// plan comes (policy none).
//
// The job's step (CurrentStep) is the newest step reported by the workers present in the
// current run — never a maximum kept from an earlier run.
//
// Pure: time comes from the caller. Thread-compatible (the reconciler guards it).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace pacer {

class RunTracker {
 public:
  explicit RunTracker(int64_t gone_after_ms) : gone_after_ms_(gone_after_ms) {}

  // A worker process registered. Returns why a new run begins, or nullopt (same run).
  std::optional<std::string> OnRegister(const std::string& worker, const std::string& run_id,
                                        int64_t now_ms);
  // A heartbeat reported `step`. Returns why a new run begins, or nullopt.
  std::optional<std::string> OnStep(const std::string& worker, int64_t step, int64_t now_ms);

  // Whether the worker's current process is known to belong to the current run (above); true
  // for a worker the tracker never saw.
  bool InRun(const std::string& worker) const;
  // The newest step of the workers present in the current run (0 before any report).
  int64_t CurrentStep(int64_t now_ms) const;
  uint64_t generation() const { return generation_; }  // 0: no run seen yet
  const std::string& run_id() const { return run_id_; }
  int64_t started_ms() const { return started_ms_; }

 private:
  struct Worker {
    int64_t last_heard_ms = 0;
    std::optional<int64_t> step;           // newest step of this process in this run
    std::optional<int64_t> previous_step;  // of the process it replaced (same run)
    bool went_back = false;                // reported below previous_step
    bool unconfirmed = false;              // a new process not yet known to be of this run
    int64_t registered_ms = 0;             // when the current process registered
  };
  bool Present(const Worker& w, int64_t now_ms) const {
    return now_ms - w.last_heard_ms <= gone_after_ms_;
  }
  void Begin(const std::string& run_id, int64_t now_ms);
  void SetUnconfirmed(Worker& w, bool unconfirmed);  // keeps unconfirmed_
  void Heard(Worker& w, int64_t now_ms);             // keeps newest_heard_ms_

  const int64_t gone_after_ms_;
  uint64_t generation_ = 0;
  std::string run_id_;
  int64_t started_ms_ = 0;
  int64_t last_step_ = 0;  // CurrentStep when no worker is present
  std::optional<int64_t> newest_heard_ms_;  // the latest last_heard_ms of workers_; none: empty
  std::map<std::string, Worker> workers_;
  size_t unconfirmed_ = 0;  // workers_ with unconfirmed set: a step looks at the others only then
};

}  // namespace pacer
