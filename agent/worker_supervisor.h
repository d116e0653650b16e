// WorkerSupervisor: the worker processes of one node agent, their life cycle and restarts.
//
// Owns one entry per worker (spec, state, current process, counters, timers) and the output
// forwarders of the live processes. It does not reap: the agent's SIGCHLD handler calls
// OnChildExit() for every reaped pid (the agent has other children, e.g. CPU hogs).
//
// Life cycle of a worker (states are WorkerProcessState):
//   RUNNING --crash--> BACKOFF --delay--> RUNNING        (RestartPolicy; FAILED past the limit)
//   RUNNING --exit 0--> EXITED                           (finished, not relaunched)
//   RUNNING --Stop()--> STOPPING --exit--> STOPPED       (SIGTERM to the group; SIGKILL after
//   RUNNING --Restart()--> STOPPING --exit--> RUNNING     the grace period)
// A process that exits is always followed by SIGKILL to its process group, so nothing it
// started survives it. Every exit is reported to the listener with a sequence number.
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

class WorkerSupervisor {
 public:
  using Done = std::function<void(absl::Status)>;
  struct Listener {
    std::function<void(const WorkerExit&)> on_exit;                    // every exit, in order
    std::function<void(const std::string& worker_id, pid_t pid)> on_launch;
  };

  // `io` and `clock` must outlive the supervisor. Worker output goes to `stdout_fd` /
  // `stderr_fd` prefixed with "[<worker id>] ".
  WorkerSupervisor(boost::asio::io_context& io, const Clock* clock, RestartPolicy policy,
                   std::vector<WorkerSpec> specs, Listener listener, int stdout_fd = 1,
                   int stderr_fd = 2);
  // SIGKILLs every live worker's process group (no orphans); does not wait.
  ~WorkerSupervisor();

  // Launches every worker. A worker that cannot be launched counts as a crash (exit code 127).
  void StartAll();

  // Returns true when `pid` was one of the workers (and handles its exit).
  bool OnChildExit(pid_t pid, int wait_status);

  // Restart: stop the process (if any) and launch it again at once; `done` runs after the
  // relaunch. Stop: stop it and keep it stopped; `done` runs once it has exited. Both answer
  // NOT_FOUND (and do nothing) for an unknown worker.
  absl::Status Restart(const std::string& worker_id, Done done);
  absl::Status Stop(const std::string& worker_id, Done done);
  void StopAll(Done done);

  bool Has(const std::string& worker_id) const { return workers_.count(worker_id) > 0; }
  pid_t Pid(const std::string& worker_id) const;  // 0 when not running
  std::vector<std::string> WorkerIds() const;
  // True when no worker runs or will run again by itself (every one EXITED, FAILED or STOPPED)
  // and at least one is EXITED or FAILED (a STOPPED-only agent waits for commands).
  bool AllFinished() const;
  bool AnyFailed() const;

  void SetCpuCores(const std::string& worker_id, double cores);
  void SetContentionFactor(const std::string& worker_id, double factor);
  std::vector<WorkerProcess> Snapshot() const;

 private:
  enum class Intent { kNone, kStop, kRestart };
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

  boost::asio::io_context& io_;
  const Clock* clock_;
  const RestartPolicy policy_;
  Listener listener_;
  int stdout_fd_, stderr_fd_;
  std::map<std::string, Worker> workers_;
  uint64_t next_exit_seq_ = 1;
};

}  // namespace pacer
