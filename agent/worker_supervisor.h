// WorkerSupervisor: the worker processes of one node agent, their life cycle and restarts.
//
// Owns one entry per worker (spec, state, current process, counters, timers) and the output
// forwarders of the live processes. It does not reap: the agent's SIGCHLD handler calls
// OnChildExit() for every reaped pid (the agent has other children, e.g. CPU hogs).
//
// Life cycle of a worker (states are WorkerProcessState), RestartScope::kWorker:
//   RUNNING --crash--> BACKOFF --delay--> RUNNING        (RestartPolicy; FAILED past the limit)
//   RUNNING --exit 0--> EXITED                           (finished, not relaunched)
//   RUNNING --Stop()--> STOPPING --exit--> STOPPED       (SIGTERM to the group; SIGKILL after
//   RUNNING --Restart()--> STOPPING --exit--> RUNNING     the grace period)
// A process that exits is always followed by SIGKILL to its process group, so nothing it
// started survives it. Every exit is reported to the listener with a sequence number.
//
// RestartScope::kGroup (the default; torchrun's model): under synchronous all-reduce the
// survivors of a crash cannot go on, so the local workers live and restart together.
//  1. A crash of any worker (non-zero exit or a signal the agent did not send) starts a group
//     restart: the crashed worker goes to BACKOFF, every other live worker is stopped (SIGTERM,
//     SIGKILL after stop_grace_ms; its exit has cause "group-restart"), and every worker that
//     had already ended (EXITED) is taken back too. Workers STOPPED by command stay stopped.
//  2. Once none of them runs, the group waits BackoffMs(streak) (the streak counts group
//     restarts; a group that ran reset_after_ms starts a new one) and starts again: a new
//     restart count (TORCHELASTIC_RESTART_COUNT), and Listener::on_group_start is asked for the
//     environment of the new start (the agent picks a fresh MASTER_PORT).
//  3. A crash when max_restarts crash restarts of the group have happened ends it instead:
//     the crashed worker is FAILED, the others are stopped (STOPPED), FailureReason() says why.
//  4. Restart(worker) by command restarts the whole group at once (no backoff, not counted
//     against max_restarts, the restart count goes up all the same): one rank cannot rejoin a
//     running synchronous group.
//  5. A worker that exits 0 is EXITED and not relaunched, unless a later crash of another
//     worker restarts the group (1.); the group is done when every worker has exited 0.
//
// Thread-safety: none; every method runs on the agent's event-loop thread (the io_context is
// run by exactly one thread). Callbacks are invoked on that thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/output_forwarder.h"
#include "agent/restart_backoff.h"
#include "agent/worker_set.h"
#include "common/clock.h"
#include "proto/pacer/agent.pb.h"

namespace pacer {

struct WorkerSpec {
  std::string worker_id;
  uint32_t rank = 0;
  uint32_t local_rank = 0;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the whole environment, "K=V"
};

// Where an "K=V" entry of `overrides` names the same K as one of `env`, it replaces it; the
// others are appended. Order of `env` is kept.
std::vector<std::string> OverrideEnvironment(const std::vector<std::string>& env,
                                             const std::vector<std::string>& overrides);

class WorkerSupervisor : public WorkerSet {
 public:
  struct Listener {
    std::function<void(const WorkerExit&)> on_exit;                    // every exit, in order
    std::function<void(const std::string& worker_id, pid_t pid)> on_launch;
    // Asked before every start of the group (the first one included) with the restart count
    // of that start; "K=V" entries that override the specs' environment for it (e.g. a fresh
    // MASTER_PORT). Under kWorker scope asked once, at StartAll. May be empty.
    std::function<std::vector<std::string>(uint32_t restart_count)> on_group_start;
  };

  // `io` and `clock` must outlive the supervisor. Worker output goes to `stdout_fd` /
  // `stderr_fd` prefixed with "[<worker id>] ".
  WorkerSupervisor(boost::asio::io_context& io, const Clock* clock, RestartPolicy policy,
                   std::vector<WorkerSpec> specs, Listener listener, int stdout_fd = 1,
                   int stderr_fd = 2);
  // SIGKILLs every live worker's process group (no orphans); does not wait.
  ~WorkerSupervisor() override;

  // Launches every worker. A worker that cannot be launched counts as a crash (exit code 127).
  // Every process gets TORCHELASTIC_RESTART_COUNT: the group's restart count (kGroup) or the
  // worker's own number of relaunches (kWorker).
  void StartAll() override;

  // Returns true when `pid` was one of the workers (and handles its exit).
  bool OnChildExit(pid_t pid, int wait_status) override;

  // Restart: stop the process (if any) and launch it again at once; `done` runs after the
  // relaunch (kGroup: the whole group, see 4. above). Stop: stop it and keep it stopped;
  // `done` runs once it has exited. Both answer NOT_FOUND (and do nothing) for an unknown
  // worker.
  absl::Status Restart(const std::string& worker_id, Done done) override;
  absl::Status Stop(const std::string& worker_id, Done done) override;
  void StopAll(Done done) override;

  bool Has(const std::string& worker_id) const override { return workers_.count(worker_id) > 0; }
  pid_t Pid(const std::string& worker_id) const override;  // 0 when not running
  std::vector<std::string> WorkerIds() const override;
  // True when no worker runs or will run again by itself (every one EXITED, FAILED or STOPPED)
  // and at least one is EXITED or FAILED (a STOPPED-only agent waits for commands).
  bool AllFinished() const override;
  bool AnyFailed() const override;
  // Why the last worker was marked FAILED (which worker, how it ended, which limit); empty
  // when none was.
  const std::string& FailureReason() const override { return failure_; }
  // Restarts of the group so far (kGroup; its current TORCHELASTIC_RESTART_COUNT).
  uint32_t GroupRestarts() const { return group_restarts_; }

  void SetCpuCores(const std::string& worker_id, double cores) override;
  void SetContentionFactor(const std::string& worker_id, double factor) override;
  std::vector<WorkerProcess> Snapshot() const override;

 private:
  // kGroupRestart: stopped by the supervisor itself for a restart of the group.
  enum class Intent { kNone, kStop, kRestart, kGroupRestart };
  // kRunning: the group runs (or has ended); kStopping: a group restart waits for its
  // workers to exit; kBackoff: all stopped, the relaunch timer runs.
  enum class GroupPhase { kRunning, kStopping, kBackoff };
  struct Worker {
    WorkerSpec spec;
    WorkerProcessState state = WORKER_STATE_UNKNOWN;
    pid_t pid = 0;
    int64_t started_ns = 0;
    uint32_t restarts = 0, crash_restarts = 0, crash_streak = 0;
    int32_t last_exit_code = 0, last_signal = 0;
    Intent intent = Intent::kNone;
    std::vector<Done> waiting;  // run when the current stop / restart completes
    std::unique_ptr<boost::asio::steady_timer> timer;  // backoff delay or grace period
    double cpu_cores = 0, contention = 0;
  };

  void Launch(Worker& w);
  void HandleExit(Worker& w, pid_t pid, int exit_code, int signal);
  void BeginStop(Worker& w, Intent intent);
  void Finish(Worker& w, absl::Status s);
  std::vector<std::string> LaunchEnvironment(const Worker& w) const;
  // kGroup scope (steps 1.-4. above).
  void StartGroup();
  void BeginGroupRestart(Worker* crashed, const std::string& why);
  void FailGroup(Worker& crashed, const std::string& why);
  void MaybeRelaunchGroup();
  void RelaunchGroup();
  bool GroupScope() const { return policy_.scope == RestartScope::kGroup; }

  boost::asio::io_context& io_;
  const Clock* clock_;
  const RestartPolicy policy_;
  Listener listener_;
  int stdout_fd_, stderr_fd_;
  std::map<std::string, Worker> workers_;
  uint64_t next_exit_seq_ = 1;
  std::string failure_;
  std::vector<std::string> group_env_;  // on_group_start's overrides for the current start

  // kGroup scope.
  GroupPhase phase_ = GroupPhase::kRunning;
  bool restart_after_crash_ = false;  // the restart under way was caused by a crash
  uint32_t group_restarts_ = 0, group_crash_restarts_ = 0, group_crash_streak_ = 0;
  int64_t group_started_ns_ = 0;
  bool launching_group_ = false;  // inside RelaunchGroup's / StartGroup's launch loop
  std::vector<Worker*> failed_launches_;  // during that loop
  std::vector<Done> group_waiting_;  // Restart() commands waiting for the relaunch
  std::unique_ptr<boost::asio::steady_timer> group_timer_;
};

}  // namespace pacer
