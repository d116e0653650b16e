// Starting child processes for the agent: workers and CPU hogs, with POSIX fork/exec.
//
// Every child is the leader of its own process group (so a signal to -pid reaches whatever it
// starts) and has PR_SET_PDEATHSIG=SIGKILL, so it dies with the agent even on SIGKILL of the
// agent (the parent-death signal fires when the forking thread exits: call these from the
// agent's event-loop thread, which lives as long as the process). Everything the child needs
// is prepared before fork(); between fork and exec the child makes only async-signal-safe
// calls. The caller reaps (waitpid) the child.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pacer {

struct SpawnedChild {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends of the child's stdout / stderr pipes (O_CLOEXEC, non-blocking)
  int stderr_fd = -1;
};

// Starts argv (argv[0] looked up in PATH) with exactly `env` ("K=V") as its environment.
// Returns once the exec succeeded; an exec failure (no such file, not executable) comes back as
// NOT_FOUND / PERMISSION_DENIED and leaves no child behind.
absl::StatusOr<SpawnedChild> SpawnWorkerProcess(const std::vector<std::string>& argv,
                                                const std::vector<std::string>& env);

// Forks a process that spins on the CPU forever, pinned to `cpu`, at scheduler `nice`
// (negative needs CAP_SYS_NICE). It execs nothing: it loops in the forked copy.
absl::StatusOr<pid_t> SpawnCpuHog(int cpu, int nice);

// The environment of this process as "K=V" strings.
std::vector<std::string> CurrentEnvironment();

}  // namespace pacer
