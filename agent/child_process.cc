#include "agent/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

extern char** environ;

namespace pacer {
namespace {

// Runs in the child between fork and exec: only async-signal-safe calls.
void BecomeGroupLeaderTiedToParent(pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before prctl: do not run orphaned
  // Undo the agent's signal setup: default dispositions, nothing blocked.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig : {SIGTERM, SIGINT, SIGCHLD, SIGPIPE, SIGHUP}) signal(sig, SIG_DFL);
}

}  // namespace

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

absl::StatusOr<SpawnedChild> SpawnWorkerProcess(const std::vector<std::string>& argv,
                                                const std::vector<std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("empty worker command");
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int out[2], err[2], exec_err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe: " + std::string(strerror(errno)));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]), close(out[1]);
    return absl::InternalError("pipe: " + std::string(strerror(errno)));
  }
  if (pipe2(exec_err, O_CLOEXEC) != 0) {
    close(out[0]), close(out[1]), close(err[0]), close(err[1]);
    return absl::InternalError("pipe: " + std::string(strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1], exec_err[0], exec_err[1]}) close(fd);
    return absl::UnavailableError("fork: " + std::string(strerror(errno)));
  }
  if (pid == 0) {
    BecomeGroupLeaderTiedToParent(parent);
    dup2(out[1], 1);  // dup2 clears O_CLOEXEC on the new descriptor
    dup2(err[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    execvpe(args[0], args.data(), envp.data());
    int e = errno;
    (void)!write(exec_err[1], &e, sizeof(e));
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so killpg works at once
  close(out[1]);
  close(err[1]);
  close(exec_err[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(exec_err[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(exec_err[0]);
  if (n == sizeof(child_errno)) {  // exec failed; the child exits 127
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(out[0]);
    close(err[0]);
    const std::string msg = "cannot run '" + argv[0] + "': " + strerror(child_errno);
    if (child_errno == ENOENT) return absl::NotFoundError(msg);
    if (child_errno == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  }
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  return SpawnedChild{pid, out[0], err[0]};
}

absl::StatusOr<pid_t> SpawnCpuHog(int cpu, int nice) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError("fork: " + std::string(strerror(errno)));
  if (pid == 0) {
    BecomeGroupLeaderTiedToParent(parent);
    sched_setaffinity(0, sizeof(set), &set);
    setpriority(PRIO_PROCESS, 0, nice);
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
  }
  setpgid(pid, pid);
  return pid;
}

}  // namespace pacer
