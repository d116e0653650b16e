// RestartPolicy: when and how often the agent relaunches a crashed worker. Pure (no clock).
//
// A crash is any exit that the agent did not ask for, other than exit code 0. The n-th
// consecutive crash (n from 1) is relaunched after min(initial * multiplier^(n-1), max); a
// process that ran for at least reset_after_ms before crashing starts a new streak. At most
// max_restarts crash relaunches happen; the next crash marks it FAILED. Relaunches by command
// do not count.
//
// `scope` says what a crash relaunches (worker_supervisor.h):
//   kGroup  (default, torchrun's model, for synchronous training) every local worker: the
//           survivors are stopped and the whole group starts again; the streak, the backoff
//           and max_restarts count restarts of the group.
//   kWorker only the crashed worker, with its own streak and limit (asynchronous workers,
//           parameter servers).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pacer {

enum class RestartScope { kGroup, kWorker };

struct RestartPolicy {
  RestartScope scope = RestartScope::kGroup;
  uint32_t max_restarts = 3;
  int64_t backoff_initial_ms = 1000;
  int64_t backoff_max_ms = 30'000;
  double backoff_multiplier = 2.0;
  int64_t reset_after_ms = 60'000;
  int64_t stop_grace_ms = 10'000;  // SIGTERM, then SIGKILL after this

  // Delay before relaunching after the `streak`-th consecutive crash (streak >= 1).
  int64_t BackoffMs(uint32_t streak) const {
    const double d = static_cast<double>(backoff_initial_ms) *
                     std::pow(backoff_multiplier, static_cast<double>(std::max<uint32_t>(streak, 1) - 1));
    return static_cast<int64_t>(std::min(d, static_cast<double>(backoff_max_ms)));
  }
};

}  // namespace pacer
