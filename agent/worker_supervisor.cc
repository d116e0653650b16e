#include "agent/worker_supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include "agent/child_process.h"
#include "common/log.h"

namespace pacer {

WorkerSupervisor::WorkerSupervisor(boost::asio::io_context& io, const Clock* clock,
                                   RestartPolicy policy, std::vector<WorkerSpec> specs,
                                   Listener listener, int stdout_fd, int stderr_fd)
    : io_(io), clock_(clock), policy_(policy), listener_(std::move(listener)),
      stdout_fd_(stdout_fd), stderr_fd_(stderr_fd) {
  for (auto& s : specs) {
    Worker w;
    w.spec = std::move(s);
    w.timer = std::make_unique<boost::asio::steady_timer>(io_);
    std::string id = w.spec.worker_id;
    workers_.emplace(std::move(id), std::move(w));
  }
}

WorkerSupervisor::~WorkerSupervisor() {
  for (auto& [id, w] : workers_) {
    if (w.pid > 0) kill(-w.pid, SIGKILL);
  }
}

void WorkerSupervisor::StartAll() {
  for (auto& [id, w] : workers_) Launch(w);
}

void WorkerSupervisor::Launch(Worker& w) {
  w.intent = Intent::kNone;
  auto child = SpawnWorkerProcess(w.spec.argv, w.spec.env);
  if (!child.ok()) {
    PACER_LOG(ERROR) << "worker " << w.spec.worker_id << ": " << child.status().message();
    w.pid = 0;
    w.started_ns = clock_->MonotonicNs();
    HandleExit(w, 0, 127, 0);
    return;
  }
  w.pid = child->pid;
  w.started_ns = clock_->MonotonicNs();
  w.state = WORKER_STATE_RUNNING;
  w.cpu_cores = 0;
  const std::string prefix = "[" + w.spec.worker_id + "] ";
  OutputForwarder::Start(io_, child->stdout_fd, stdout_fd_, prefix);
  OutputForwarder::Start(io_, child->stderr_fd, stderr_fd_, prefix);
  PACER_LOG(INFO) << "worker " << w.spec.worker_id << " started, pid " << w.pid;
  if (listener_.on_launch) listener_.on_launch(w.spec.worker_id, w.pid);
}

bool WorkerSupervisor::OnChildExit(pid_t pid, int wait_status) {
  for (auto& [id, w] : workers_) {
    if (w.pid != pid || pid <= 0) continue;
    int code = -1, sig = 0;
    if (WIFEXITED(wait_status)) code = WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status)) sig = WTERMSIG(wait_status);
    kill(-pid, SIGKILL);  // whatever it started in its group goes with it
    HandleExit(w, pid, code, sig);
    return true;
  }
  return false;
}

void WorkerSupervisor::HandleExit(Worker& w, pid_t pid, int exit_code, int signal) {
  w.timer->cancel();
  const int64_t ran_ns = clock_->MonotonicNs() - w.started_ns;
  w.pid = 0;
  w.last_exit_code = exit_code;
  w.last_signal = signal;
  w.cpu_cores = 0;
  const bool crashed = w.intent == Intent::kNone && !(signal == 0 && exit_code == 0);

  WorkerExit e;
  e.set_seq(next_exit_seq_++);
  e.set_worker_id(w.spec.worker_id);
  e.set_pid(pid);
  e.set_exit_code(exit_code);
  e.set_signal(signal);
  e.set_time_ms(clock_->NowMs());
  e.set_runtime_s(static_cast<double>(ran_ns) / 1e9);
  e.set_cause(w.intent != Intent::kNone ? "command" : crashed ? "crash" : "finished");
  PACER_LOG(INFO) << "worker " << w.spec.worker_id << " pid " << pid << " exited: "
                  << (signal ? "signal " + std::to_string(signal) : "code " + std::to_string(exit_code))
                  << " (" << e.cause() << ") after " << e.runtime_s() << " s";
  if (listener_.on_exit) listener_.on_exit(e);

  switch (w.intent) {
    case Intent::kStop:
      w.state = WORKER_STATE_STOPPED;
      Finish(w, absl::OkStatus());
      return;
    case Intent::kRestart:
      w.restarts++;
      Launch(w);
      Finish(w, w.state == WORKER_STATE_RUNNING
                    ? absl::OkStatus()
                    : absl::UnavailableError("relaunch of '" + w.spec.worker_id + "' failed"));
      return;
    case Intent::kNone:
      break;
  }
  if (!crashed) {
    w.state = WORKER_STATE_EXITED;
    return;
  }
  if (ran_ns >= policy_.reset_after_ms * 1'000'000) w.crash_streak = 0;
  w.crash_streak++;
  if (w.crash_restarts >= policy_.max_restarts) {
    w.state = WORKER_STATE_FAILED;
    PACER_LOG(ERROR) << "worker " << w.spec.worker_id << " failed: restart limit ("
                     << policy_.max_restarts << ") reached";
    return;
  }
  w.state = WORKER_STATE_BACKOFF;
  const int64_t delay_ms = policy_.BackoffMs(w.crash_streak);
  PACER_LOG(INFO) << "worker " << w.spec.worker_id << " restarts in " << delay_ms << " ms (crash "
                  << w.crash_streak << " in a row, restart " << w.crash_restarts + 1 << "/"
                  << policy_.max_restarts << ")";
  w.timer->expires_after(std::chrono::milliseconds(delay_ms));
  w.timer->async_wait([this, id = w.spec.worker_id](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled (a command took over)
    Worker& w = workers_.at(id);
    if (w.state != WORKER_STATE_BACKOFF) return;
    w.crash_restarts++;
    w.restarts++;
    Launch(w);
  });
}

void WorkerSupervisor::Finish(Worker& w, absl::Status s) {
  std::vector<Done> waiting;
  waiting.swap(w.waiting);
  for (auto& d : waiting) {
    if (d) d(s);
  }
}

void WorkerSupervisor::BeginStop(Worker& w, Intent intent) {
  w.intent = intent;
  if (w.state == WORKER_STATE_STOPPING) return;  // already signalled; grace timer running
  w.state = WORKER_STATE_STOPPING;
  kill(-w.pid, SIGTERM);
  w.timer->expires_after(std::chrono::milliseconds(policy_.stop_grace_ms));
  w.timer->async_wait([this, id = w.spec.worker_id, pid = w.pid](const boost::system::error_code& ec) {
    if (ec) return;
    const Worker& w = workers_.at(id);
    if (w.pid == pid && w.state == WORKER_STATE_STOPPING) {
      PACER_LOG(WARNING) << "worker " << id << " ignored SIGTERM for " << policy_.stop_grace_ms
                         << " ms: SIGKILL";
      kill(-pid, SIGKILL);
    }
  });
}

absl::Status WorkerSupervisor::Restart(const std::string& worker_id, Done done) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::NotFoundError("unknown worker '" + worker_id + "'");
  Worker& w = it->second;
  if (w.pid > 0) {
    w.waiting.push_back(std::move(done));
    BeginStop(w, Intent::kRestart);
    return absl::OkStatus();
  }
  w.timer->cancel();  // a pending backoff relaunch
  w.crash_streak = 0;
  w.restarts++;
  Launch(w);
  if (done) {
    done(w.state == WORKER_STATE_RUNNING
             ? absl::OkStatus()
             : absl::UnavailableError("relaunch of '" + worker_id + "' failed"));
  }
  return absl::OkStatus();
}

absl::Status WorkerSupervisor::Stop(const std::string& worker_id, Done done) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::NotFoundError("unknown worker '" + worker_id + "'");
  Worker& w = it->second;
  if (w.pid > 0) {
    w.waiting.push_back(std::move(done));
    BeginStop(w, Intent::kStop);
    return absl::OkStatus();
  }
  w.timer->cancel();
  if (w.state == WORKER_STATE_BACKOFF || w.state == WORKER_STATE_UNKNOWN) {
    w.state = WORKER_STATE_STOPPED;
  }
  if (done) done(absl::OkStatus());
  return absl::OkStatus();
}

void WorkerSupervisor::StopAll(Done done) {
  auto remaining = std::make_shared<size_t>(workers_.size());
  auto first_error = std::make_shared<absl::Status>();
  auto one_done = [remaining, first_error, done](absl::Status s) {
    if (!s.ok() && first_error->ok()) *first_error = s;
    if (--*remaining == 0 && done) done(*first_error);
  };
  if (workers_.empty()) {
    if (done) done(absl::OkStatus());
    return;
  }
  for (auto& [id, w] : workers_) (void)Stop(id, one_done);
}

pid_t WorkerSupervisor::Pid(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? 0 : it->second.pid;
}

std::vector<std::string> WorkerSupervisor::WorkerIds() const {
  std::vector<std::string> ids;
  for (const auto& [id, w] : workers_) ids.push_back(id);
  return ids;
}

bool WorkerSupervisor::AllFinished() const {
  bool any_terminal = false;
  for (const auto& [id, w] : workers_) {
    if (w.state == WORKER_STATE_EXITED || w.state == WORKER_STATE_FAILED) {
      any_terminal = true;
    } else if (w.state != WORKER_STATE_STOPPED) {
      return false;
    }
  }
  return any_terminal;
}

bool WorkerSupervisor::AnyFailed() const {
  for (const auto& [id, w] : workers_) {
    if (w.state == WORKER_STATE_FAILED) return true;
  }
  return false;
}

void WorkerSupervisor::SetCpuCores(const std::string& worker_id, double cores) {
  if (auto it = workers_.find(worker_id); it != workers_.end()) it->second.cpu_cores = cores;
}

void WorkerSupervisor::SetContentionFactor(const std::string& worker_id, double factor) {
  if (auto it = workers_.find(worker_id); it != workers_.end()) it->second.contention = factor;
}

std::vector<WorkerProcess> WorkerSupervisor::Snapshot() const {
  std::vector<WorkerProcess> out;
  for (const auto& [id, w] : workers_) {
    WorkerProcess p;
    p.set_worker_id(id);
    p.set_pid(w.pid);
    p.set_state(w.state);
    p.set_restarts(w.restarts);
    p.set_crash_restarts(w.crash_restarts);
    p.set_last_exit_code(w.last_exit_code);
    p.set_last_signal(w.last_signal);
    p.set_rank(w.spec.rank);
    p.set_local_rank(w.spec.local_rank);
    p.set_cpu_cores(w.cpu_cores);
    p.set_contention_factor(w.contention);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace pacer
