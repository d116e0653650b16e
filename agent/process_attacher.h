// ProcessAttacher: the sidecar form of the agent's workers (`pacer-agent --attach PATTERN`).
// On Kubernetes the trainer runs in its own container and the agent in a native sidecar of the
// same pod with `shareProcessNamespace: true`: the agent cannot fork the trainer, so it finds
// it and acts on it by signal (docs/kubernetes.md, "What runs where").
//
// Owns one watched worker: its id and rank (from the agent's topology flags), the PATTERN, the
// process currently matched (pid + start time, so a reused pid is a new process), counters,
// and a poll timer on the agent's io_context.
//
// Finding the process: every poll_ms it scans <proc_root>/<pid>/cmdline (the arguments joined
// by single spaces) for PATTERN as a substring, skipping the agent itself; of the matches, the
// one whose parent does not match (a trainer's DataLoader children carry the same command
// line), the oldest if several.
//
// Life cycle (states are WorkerProcessState):
//   UNKNOWN --found--> RUNNING --gone--> BACKOFF --found again--> RUNNING (restarts + 1)
//   RUNNING --Restart()--> STOPPING (SIGTERM; SIGKILL after stop_grace_ms) --gone--> BACKOFF
//                      --found--> RUNNING: `done` OK; nothing within restart_timeout_ms:
//                      `done` DEADLINE_EXCEEDED (the container was not restarted)
// A process that goes away is reported as an exit: the agent is not its parent, so its status
// is unknown — exit_code -1 with signal 0, cause "gone" — except after the agent's own signal
// (signal SIGTERM/SIGKILL, cause "command"). BACKOFF here means "waiting for whoever starts the
// trainer (the kubelet) to start it again".
//
// What it cannot do, and says so: Stop() keeps nothing stopped (the kubelet would restart it):
// FAILED_PRECONDITION. StopAll() (the agent leaving) leaves the trainer alone: its container's
// life is the kubelet's. AllFinished() is never true: the agent ends when it is told to (SIGTERM
// from the kubelet when the pod ends).
//
// Thread-safety: none; runs on the agent's event-loop thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_set.h"
#include "common/clock.h"

namespace pacer {

struct AttachOptions {
  std::string worker_id;
  uint32_t rank = 0;
  std::string pattern;  // substring of the command line; must not be empty
  std::string proc_root = "/proc";
  int64_t poll_ms = 500;
  int64_t stop_grace_ms = 10'000;
  int64_t restart_timeout_ms = 120'000;
};

// A process seen in <proc_root>: what matching needs.
struct ProcessInfo {
  pid_t pid = 0;
  pid_t ppid = 0;
  uint64_t start_ticks = 0;  // /proc/<pid>/stat field 22: tells a reused pid from the old one
  std::string cmdline;       // arguments joined by ' '
};

// Every readable process of `proc_root` (those that vanish or cannot be read are skipped).
std::vector<ProcessInfo> ListProcesses(const std::string& proc_root);
// The worker among `procs` for `pattern` (rule above), skipping `self`; nullopt when none.
std::optional<ProcessInfo> FindWorkerProcess(const std::vector<ProcessInfo>& procs,
                                             const std::string& pattern, pid_t self);

class ProcessAttacher : public WorkerSet {
 public:
  struct Listener {
    std::function<void(const WorkerExit&)> on_exit;
    std::function<void(const std::string& worker_id, pid_t pid)> on_found;
  };
  ProcessAttacher(boost::asio::io_context& io, const Clock* clock, AttachOptions options,
                  Listener listener);
  ~ProcessAttacher() override;

  void StartAll() override;
  bool OnChildExit(pid_t, int) override { return false; }
  absl::Status Restart(const std::string& worker_id, Done done) override;
  absl::Status Stop(const std::string& worker_id, Done done) override;
  void StopAll(Done done) override;

  bool Has(const std::string& worker_id) const override { return worker_id == o_.worker_id; }
  pid_t Pid(const std::string& worker_id) const override;
  std::vector<std::string> WorkerIds() const override { return {o_.worker_id}; }
  bool AllFinished() const override { return false; }
  bool AnyFailed() const override { return false; }
  const std::string& FailureReason() const override { return failure_; }
  void SetCpuCores(const std::string& worker_id, double cores) override;
  void SetContentionFactor(const std::string& worker_id, double factor) override;
  std::vector<WorkerProcess> Snapshot() const override;

 private:
  void Poll();
  void SchedulePoll();
  void OnGone(const std::string& cause, int signal);
  void FinishRestart(absl::Status s);

  boost::asio::io_context& io_;
  const Clock* clock_;
  const AttachOptions o_;
  Listener listener_;
  boost::asio::steady_timer poll_timer_, grace_timer_, restart_timer_;
  std::optional<ProcessInfo> current_;
  WorkerProcessState state_ = WORKER_STATE_UNKNOWN;
  int64_t found_ns_ = 0;
  uint32_t restarts_ = 0;
  int32_t last_exit_code_ = 0, last_signal_ = 0;
  int sent_signal_ = 0;  // the agent's own signal to the current process (restart)
  std::vector<Done> restart_waiting_;
  uint64_t next_exit_seq_ = 1;
  double cpu_cores_ = 0, contention_ = 0;
  bool logged_waiting_ = false;
  bool stopped_ = false;
  std::string failure_;
};

}  // namespace pacer
