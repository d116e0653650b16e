// Waits on an absl::CondVar with a predicate and a steady-clock bound, as
// std::condition_variable's wait / wait_for / wait_until do. Every class that holds a mutex uses
// absl::Mutex, so its fields carry ABSL_GUARDED_BY and clang's thread-safety analysis checks them
// (tests/thread_safety_test.py); these keep the waits as readable as the standard ones.
//
// The caller holds `mu`. A predicate that reads guarded fields is a lambda annotated
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) (it runs with `mu` held). The bounded waits return the
// predicate's value when they return, so `false` means the bound passed first.
#pragma once

#include <algorithm>
#include <chrono>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pacer {

// The time from now to `deadline` (zero once it has passed).
inline absl::Duration TimeUntil(std::chrono::steady_clock::time_point deadline) {
  return absl::FromChrono(std::max(deadline - std::chrono::steady_clock::now(),
                                   std::chrono::steady_clock::duration::zero()));
}

// The predicates run with `mu` held, which the analysis cannot follow into them: their bodies are
// checked where they are written (annotated as above), these bodies not at all.
template <class Pred>
void CvWait(absl::CondVar& cv, absl::Mutex& mu, Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  while (!pred()) cv.Wait(&mu);
}

template <class Pred>
bool CvWaitUntil(absl::CondVar& cv, absl::Mutex& mu, std::chrono::steady_clock::time_point deadline,
                 Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    cv.WaitWithTimeout(&mu, TimeUntil(deadline));
  }
  return true;
}

template <class Rep, class Period, class Pred>
bool CvWaitFor(absl::CondVar& cv, absl::Mutex& mu, std::chrono::duration<Rep, Period> timeout, Pred pred)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  return CvWaitUntil(cv, mu,
                     std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout),
                     pred);
}

}  // namespace pacer
