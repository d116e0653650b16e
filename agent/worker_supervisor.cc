#include "agent/worker_supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <boost/asio/post.hpp>
#include <set>

#include "agent/child_process.h"
#include "common/log.h"

namespace pacer {

std::vector<std::string> OverrideEnvironment(const std::vector<std::string>& env,
                                             const std::vector<std::string>& overrides) {
  std::map<std::string, const std::string*> by_key;
  for (const std::string& kv : overrides) by_key[kv.substr(0, kv.find('='))] = &kv;
  std::vector<std::string> out;
  std::set<std::string> used;
  for (const std::string& kv : env) {
    const std::string key = kv.substr(0, kv.find('='));
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      out.push_back(kv);
    } else if (used.insert(key).second) {
      out.push_back(*it->second);
    }
  }
  for (const auto& [key, kv] : by_key) {
    if (!used.count(key)) out.push_back(*kv);
  }
  return out;
}

namespace {

std::string HowItEnded(int exit_code, int signal) {
  return signal ? "signal " + std::to_string(signal) : "code " + std::to_string(exit_code);
}

}  // namespace

WorkerSupervisor::WorkerSupervisor(boost::asio::io_context& io, const Clock* clock,
                                   RestartPolicy policy, std::vector<WorkerSpec> specs,
                                   Listener listener, int stdout_fd, int stderr_fd)
    : io_(io), clock_(clock), policy_(policy), listener_(std::move(listener)),
      stdout_fd_(stdout_fd), stderr_fd_(stderr_fd),
      group_timer_(std::make_unique<boost::asio::steady_timer>(io)) {
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
  if (GroupScope()) {
    for (auto& [id, w] : workers_) w.state = WORKER_STATE_BACKOFF;  // "to be launched"
    return StartGroup();
  }
  if (listener_.on_group_start) group_env_ = listener_.on_group_start(0);
  for (auto& [id, w] : workers_) Launch(w);
}

std::vector<std::string> WorkerSupervisor::LaunchEnvironment(const Worker& w) const {
  std::vector<std::string> overrides = group_env_;
  overrides.push_back("TORCHELASTIC_RESTART_COUNT=" +
                      std::to_string(GroupScope() ? group_restarts_ : w.restarts));
  return OverrideEnvironment(w.spec.env, overrides);
}

void WorkerSupervisor::Launch(Worker& w) {
  w.intent = Intent::kNone;
  auto child = SpawnWorkerProcess(w.spec.argv, LaunchEnvironment(w));
  if (!child.ok()) {
    PACER_LOG(ERROR) << "worker " << w.spec.worker_id << ": " << child.status().message();
    w.pid = 0;
    w.started_ns = clock_->MonotonicNs();
    if (launching_group_) {  // handled once the whole group is launched (RelaunchGroup)
      w.state = WORKER_STATE_RUNNING;
      failed_launches_.push_back(&w);
      return;
    }
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
  const char* cause = "finished";
  if (crashed) cause = "crash";
  if (w.intent == Intent::kStop || w.intent == Intent::kRestart) cause = "command";
  if (w.intent == Intent::kGroupRestart) cause = restart_after_crash_ ? "group-restart" : "command";
  e.set_cause(cause);
  PACER_LOG(INFO) << "worker " << w.spec.worker_id << " pid " << pid << " exited: "
                  << HowItEnded(exit_code, signal) << " (" << e.cause() << ") after "
                  << e.runtime_s() << " s";
  if (listener_.on_exit) listener_.on_exit(e);

  switch (w.intent) {
    case Intent::kStop:
      w.state = WORKER_STATE_STOPPED;
      Finish(w, absl::OkStatus());
      if (phase_ == GroupPhase::kStopping) MaybeRelaunchGroup();
      return;
    case Intent::kRestart:
      w.restarts++;
      Launch(w);
      Finish(w, w.state == WORKER_STATE_RUNNING
                    ? absl::OkStatus()
                    : absl::UnavailableError("relaunch of '" + w.spec.worker_id + "' failed"));
      return;
    case Intent::kGroupRestart:
      w.state = WORKER_STATE_BACKOFF;  // relaunched with the group
      MaybeRelaunchGroup();
      return;
    case Intent::kNone:
      break;
  }
  if (!crashed) {
    w.state = WORKER_STATE_EXITED;
    return;
  }
  const std::string how = "worker " + w.spec.worker_id + " crashed (" + HowItEnded(exit_code, signal) + ")";
  if (GroupScope()) {
    if (phase_ != GroupPhase::kRunning) {  // a restart is under way already: part of it
      w.state = WORKER_STATE_BACKOFF;
      MaybeRelaunchGroup();
      return;
    }
    if (group_crash_restarts_ >= policy_.max_restarts) {
      return FailGroup(w, how + " after " + std::to_string(group_crash_restarts_) +
                              " restart(s) of the group: restart limit (--max-restarts " +
                              std::to_string(policy_.max_restarts) + ") reached");
    }
    if (clock_->MonotonicNs() - group_started_ns_ >= policy_.reset_after_ms * 1'000'000) {
      group_crash_streak_ = 0;
    }
    group_crash_streak_++;
    restart_after_crash_ = true;
    w.state = WORKER_STATE_BACKOFF;
    return BeginGroupRestart(&w, how);
  }
  if (ran_ns >= policy_.reset_after_ms * 1'000'000) w.crash_streak = 0;
  w.crash_streak++;
  if (w.crash_restarts >= policy_.max_restarts) {
    w.state = WORKER_STATE_FAILED;
    failure_ = how + ": restart limit (--max-restarts " + std::to_string(policy_.max_restarts) +
               ") reached";
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

void WorkerSupervisor::StartGroup() {
  if (listener_.on_group_start) group_env_ = listener_.on_group_start(group_restarts_);
  group_started_ns_ = clock_->MonotonicNs();
  launching_group_ = true;
  failed_launches_.clear();
  for (auto& [id, w] : workers_) {
    if (w.state == WORKER_STATE_BACKOFF) Launch(w);
  }
  launching_group_ = false;
  std::vector<Worker*> failed;
  failed.swap(failed_launches_);
  // A worker that could not be launched is a crash of the group (exit code 127), handled now
  // that every launch of this start is done.
  for (Worker* w : failed) {
    if (w->state == WORKER_STATE_RUNNING && w->pid == 0) HandleExit(*w, 0, 127, 0);
  }
}

void WorkerSupervisor::BeginGroupRestart(Worker* crashed, const std::string& why) {
  phase_ = GroupPhase::kStopping;
  size_t live = 0, restarting = 0;
  for (auto& [id, w] : workers_) {
    if (&w == crashed) {
      ++restarting;
      continue;
    }
    if (w.pid > 0) {
      ++live;
      ++restarting;
      BeginStop(w, Intent::kGroupRestart);
    } else if (w.state != WORKER_STATE_STOPPED) {
      w.timer->cancel();
      w.state = WORKER_STATE_BACKOFF;
      ++restarting;
    }
  }
  if (restart_after_crash_) {
    PACER_LOG(WARNING) << why << ": restarting the group of " << restarting << " worker(s), "
                       << "restart " << group_crash_restarts_ + 1 << "/" << policy_.max_restarts
                       << " (stopping " << live << " live worker(s) first)";
  } else {
    PACER_LOG(INFO) << why << ": restarting the group of " << restarting << " worker(s) (stopping "
                    << live << " live worker(s) first)";
  }
  MaybeRelaunchGroup();
}

void WorkerSupervisor::FailGroup(Worker& crashed, const std::string& why) {
  crashed.state = WORKER_STATE_FAILED;
  failure_ = why;
  PACER_LOG(ERROR) << why << "; stopping the rest of the group";
  for (auto& [id, w] : workers_) {
    if (&w == &crashed) continue;
    if (w.pid > 0) {
      BeginStop(w, Intent::kStop);
    } else if (w.state == WORKER_STATE_BACKOFF || w.state == WORKER_STATE_UNKNOWN) {
      w.timer->cancel();
      w.state = WORKER_STATE_STOPPED;
    }
  }
}

void WorkerSupervisor::MaybeRelaunchGroup() {
  if (phase_ != GroupPhase::kStopping) return;
  for (const auto& [id, w] : workers_) {
    if (w.pid > 0) return;  // still stopping
  }
  phase_ = GroupPhase::kBackoff;
  const int64_t delay_ms = restart_after_crash_ ? policy_.BackoffMs(group_crash_streak_) : 0;
  if (restart_after_crash_) {
    PACER_LOG(INFO) << "group stopped; starting it again in " << delay_ms << " ms (crash "
                    << group_crash_streak_ << " in a row)";
  }
  group_timer_->expires_after(std::chrono::milliseconds(delay_ms));
  group_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    RelaunchGroup();
  });
}

void WorkerSupervisor::RelaunchGroup() {
  if (phase_ != GroupPhase::kBackoff) return;
  group_timer_->cancel();
  phase_ = GroupPhase::kRunning;
  const bool after_crash = restart_after_crash_;
  restart_after_crash_ = false;
  size_t n = 0;
  for (auto& [id, w] : workers_) {
    if (w.state != WORKER_STATE_BACKOFF) continue;
    ++n;
    w.restarts++;
    if (after_crash) w.crash_restarts++;
  }
  std::vector<Done> waiting;
  waiting.swap(group_waiting_);
  if (n == 0) {  // everyone was stopped meanwhile (the agent is leaving)
    for (auto& d : waiting) {
      if (d) d(absl::UnavailableError("the group was stopped before it could restart"));
    }
    return;
  }
  group_restarts_++;
  if (after_crash) group_crash_restarts_++;
  PACER_LOG(INFO) << "starting the group again: " << n << " worker(s), TORCHELASTIC_RESTART_COUNT="
                  << group_restarts_ << (after_crash ? " (after a crash, " : " (by command, ")
                  << group_crash_restarts_ << "/" << policy_.max_restarts << " crash restarts used)";
  StartGroup();
  bool all_running = true;
  for (const auto& [id, w] : workers_) {
    if (w.state == WORKER_STATE_BACKOFF || (w.state == WORKER_STATE_RUNNING && w.pid == 0)) {
      all_running = false;
    }
  }
  for (auto& d : waiting) {
    if (d) d(all_running ? absl::OkStatus() : absl::UnavailableError("relaunch of the group failed"));
  }
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
  if (GroupScope()) {
    group_waiting_.push_back(std::move(done));
    switch (phase_) {
      case GroupPhase::kRunning:
        BeginGroupRestart(nullptr, "restart of " + worker_id + " by command");
        break;
      case GroupPhase::kStopping:  // joins the restart under way
        break;
      case GroupPhase::kBackoff:   // a crash restart waits for its delay: now instead
        RelaunchGroup();
        break;
    }
    return absl::OkStatus();
  }
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
