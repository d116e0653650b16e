#include "agent/process_attacher.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/proc_stats.h"
#include "common/log.h"

namespace pacer {

namespace {

// ppid (field 4) and starttime (field 22) of /proc/<pid>/stat; the comm field (2) is in
// parentheses and may hold spaces or ')' itself, so fields are counted after the last ')'.
bool ParseStat(const std::string& text, pid_t* ppid, uint64_t* start) {
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<absl::string_view> f = absl::StrSplit(absl::string_view(text).substr(close + 1), ' ',
                                                     absl::SkipEmpty());
  // f[0] is field 3 (state): field n is f[n - 3].
  if (f.size() < 20) return false;
  int64_t pp = 0;
  if (!absl::SimpleAtoi(f[1], &pp) || !absl::SimpleAtoi(f[19], start)) return false;
  *ppid = static_cast<pid_t>(pp);
  return true;
}

}  // namespace

std::vector<ProcessInfo> ListProcesses(const std::string& proc_root) {
  std::vector<ProcessInfo> out;
  DIR* d = opendir(proc_root.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    int64_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid <= 0) continue;
    const std::string base = proc_root + "/" + e->d_name;
    auto cmd = ReadSmallFile(base + "/cmdline");
    auto stat = ReadSmallFile(base + "/stat");
    if (!cmd.ok() || !stat.ok() || cmd->empty()) continue;  // gone, or a kernel thread
    ProcessInfo p;
    p.pid = static_cast<pid_t>(pid);
    if (!ParseStat(*stat, &p.ppid, &p.start_ticks)) continue;
    std::string c = *cmd;
    while (!c.empty() && c.back() == '\0') c.pop_back();
    for (char& ch : c) {
      if (ch == '\0') ch = ' ';
    }
    p.cmdline = std::move(c);
    out.push_back(std::move(p));
  }
  closedir(d);
  return out;
}

std::optional<ProcessInfo> FindWorkerProcess(const std::vector<ProcessInfo>& procs,
                                             const std::string& pattern, pid_t self) {
  if (pattern.empty()) return std::nullopt;
  std::map<pid_t, const ProcessInfo*> matches;
  for (const ProcessInfo& p : procs) {
    if (p.pid != self && p.cmdline.find(pattern) != std::string::npos) matches[p.pid] = &p;
  }
  const ProcessInfo* best = nullptr;
  for (const auto& [pid, p] : matches) {
    if (matches.count(p->ppid)) continue;  // a child of the trainer (a DataLoader worker)
    if (!best || p->start_ticks < best->start_ticks ||
        (p->start_ticks == best->start_ticks && p->pid < best->pid)) {
      best = p;
    }
  }
  if (!best) return std::nullopt;
  return *best;
}

ProcessAttacher::ProcessAttacher(boost::asio::io_context& io, const Clock* clock,
                                 AttachOptions options, Listener listener)
    : io_(io),
      clock_(clock),
      o_(std::move(options)),
      listener_(std::move(listener)),
      poll_timer_(io),
      grace_timer_(io),
      restart_timer_(io) {}

ProcessAttacher::~ProcessAttacher() {
  stopped_ = true;
  poll_timer_.cancel();
  grace_timer_.cancel();
  restart_timer_.cancel();
}

void ProcessAttacher::StartAll() {
  PACER_LOG(INFO) << "attach mode: worker " << o_.worker_id << " is the process whose command line "
                  << "contains '" << o_.pattern << "' (not started by the agent; polled every "
                  << o_.poll_ms << " ms)";
  Poll();
}

void ProcessAttacher::SchedulePoll() {
  if (stopped_) return;
  poll_timer_.expires_after(std::chrono::milliseconds(o_.poll_ms));
  poll_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Poll();
  });
}

void ProcessAttacher::Poll() {
  if (stopped_) return;
  const std::vector<ProcessInfo> procs = ListProcesses(o_.proc_root);
  if (current_) {
    bool alive = false;
    for (const ProcessInfo& p : procs) {
      if (p.pid == current_->pid && p.start_ticks == current_->start_ticks) alive = true;
    }
    if (!alive) {
      OnGone(sent_signal_ ? "command" : "gone", sent_signal_);
    }
  }
  if (!current_) {
    if (auto p = FindWorkerProcess(procs, o_.pattern, getpid())) {
      const bool again = state_ != WORKER_STATE_UNKNOWN;
      current_ = *p;
      if (again) ++restarts_;
      state_ = WORKER_STATE_RUNNING;
      found_ns_ = clock_->MonotonicNs();
      sent_signal_ = 0;
      logged_waiting_ = false;
      PACER_LOG(INFO) << "attach mode: worker " << o_.worker_id << (again ? " back" : " found") << ": pid "
                      << p->pid << " (" << p->cmdline.substr(0, 200) << ")";
      if (listener_.on_found) listener_.on_found(o_.worker_id, p->pid);
      FinishRestart(absl::OkStatus());
    } else if (!logged_waiting_) {
      logged_waiting_ = true;
      PACER_LOG(INFO) << "attach mode: no process matches '" << o_.pattern << "' yet; waiting"
                      << " (a sidecar needs shareProcessNamespace: true and the trainer's uid)";
    }
  }
  SchedulePoll();
}

void ProcessAttacher::OnGone(const std::string& cause, int signal) {
  WorkerExit e;
  e.set_seq(next_exit_seq_++);
  e.set_worker_id(o_.worker_id);
  e.set_pid(current_->pid);
  e.set_exit_code(-1);  // unknown: not our child (the kubelet has it)
  e.set_signal(signal);
  e.set_time_ms(clock_->NowMs());
  e.set_runtime_s(static_cast<double>(clock_->MonotonicNs() - found_ns_) / 1e9);
  e.set_cause(cause);
  PACER_LOG(INFO) << "attach mode: worker " << o_.worker_id << " pid " << current_->pid << " is gone ("
                  << (signal ? absl::StrCat("after the agent's signal ", signal)
                             : std::string("status unknown: the agent is not its parent"))
                  << "); waiting for it to be started again";
  last_exit_code_ = -1;
  last_signal_ = signal;
  current_.reset();
  sent_signal_ = 0;
  grace_timer_.cancel();
  state_ = WORKER_STATE_BACKOFF;
  if (listener_.on_exit) listener_.on_exit(e);
}

absl::Status ProcessAttacher::Restart(const std::string& worker_id, Done done) {
  if (!Has(worker_id)) {
    absl::Status s = absl::NotFoundError("unknown worker '" + worker_id + "'");
    done(s);
    return s;
  }
  restart_waiting_.push_back(std::move(done));
  if (restart_waiting_.size() > 1) return absl::OkStatus();  // joins the restart under way
  restart_timer_.expires_after(std::chrono::milliseconds(o_.restart_timeout_ms));
  restart_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || restart_waiting_.empty()) return;
    FinishRestart(absl::DeadlineExceededError(absl::StrCat(
        "attach mode: no new process matching '", o_.pattern, "' within ", o_.restart_timeout_ms,
        " ms after the signal: is the trainer's container restarted (restartPolicy)?")));
  });
  if (!current_) return absl::OkStatus();  // not running: the next one found completes it
  const pid_t pid = current_->pid;
  if (kill(pid, SIGTERM) != 0) {
    const std::string err = strerror(errno);
    FinishRestart(absl::PermissionDeniedError(absl::StrCat(
        "attach mode: cannot signal pid ", pid, ": ", err, " (the agent needs the trainer's uid)")));
    return absl::OkStatus();
  }
  PACER_LOG(INFO) << "attach mode: restart of " << o_.worker_id << ": SIGTERM to pid " << pid;
  sent_signal_ = SIGTERM;
  state_ = WORKER_STATE_STOPPING;
  const uint64_t start = current_->start_ticks;
  grace_timer_.expires_after(std::chrono::milliseconds(o_.stop_grace_ms));
  grace_timer_.async_wait([this, pid, start](const boost::system::error_code& ec) {
    if (ec || !current_ || current_->pid != pid || current_->start_ticks != start) return;
    PACER_LOG(WARNING) << "attach mode: pid " << pid << " outlived the grace period: SIGKILL";
    sent_signal_ = SIGKILL;
    kill(pid, SIGKILL);
  });
  return absl::OkStatus();
}

void ProcessAttacher::FinishRestart(absl::Status s) {
  if (restart_waiting_.empty()) return;
  restart_timer_.cancel();
  if (!s.ok() && current_ && state_ == WORKER_STATE_STOPPING) state_ = WORKER_STATE_RUNNING;
  std::vector<Done> waiting = std::move(restart_waiting_);
  restart_waiting_.clear();
  for (Done& d : waiting) d(s);
}

absl::Status ProcessAttacher::Stop(const std::string& worker_id, Done done) {
  absl::Status s = Has(worker_id)
                       ? absl::FailedPreconditionError(
                             "attach mode: the agent did not start '" + worker_id +
                             "' and cannot keep it stopped (its container would be restarted); "
                             "use restart, or migrate")
                       : absl::NotFoundError("unknown worker '" + worker_id + "'");
  done(s);
  return s;
}

void ProcessAttacher::StopAll(Done done) {
  // The agent is leaving; the trainer's container is the kubelet's to end.
  stopped_ = true;
  poll_timer_.cancel();
  grace_timer_.cancel();
  FinishRestart(absl::CancelledError("the agent is leaving"));
  done(absl::OkStatus());
}

pid_t ProcessAttacher::Pid(const std::string& worker_id) const {
  return Has(worker_id) && current_ ? current_->pid : 0;
}

void ProcessAttacher::SetCpuCores(const std::string& worker_id, double cores) {
  if (Has(worker_id)) cpu_cores_ = cores;
}

void ProcessAttacher::SetContentionFactor(const std::string& worker_id, double factor) {
  if (Has(worker_id)) contention_ = factor;
}

std::vector<WorkerProcess> ProcessAttacher::Snapshot() const {
  WorkerProcess p;
  p.set_worker_id(o_.worker_id);
  p.set_pid(current_ ? current_->pid : 0);
  p.set_state(state_);
  p.set_restarts(restarts_);
  p.set_last_exit_code(last_exit_code_);
  p.set_last_signal(last_signal_);
  p.set_rank(o_.rank);
  p.set_local_rank(0);
  p.set_cpu_cores(cpu_cores_);
  p.set_contention_factor(contention_);
  return {p};
}

}  // namespace pacer
