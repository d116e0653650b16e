// The largest training step number pacerd takes from a worker (a step report, a heartbeat).
//
// Steps are uint64 on the wire and int64 in the controller (its run tracker, the plan's effective
// step), so a step of 2^63 would read as negative there. 2^40 is a step a millisecond for 34
// years; a larger one is a bug or an attack, refused with INVALID_ARGUMENT naming the limit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pacer {

inline constexpr uint64_t kMaxStepNumber = uint64_t{1} << 40;

// OK, or INVALID_ARGUMENT naming the worker, the step and the limit; `what` names the call.
inline absl::Status CheckStepNumber(uint64_t step, std::string_view worker_id, std::string_view what) {
  if (step <= kMaxStepNumber) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(absl::string_view(what.data(), what.size()), ": step ", step,
                                                 " of worker '",
                                                 absl::string_view(worker_id.data(), worker_id.size()),
                                                 "' is implausible: steps above 2^40 (", kMaxStepNumber,
                                                 ") are refused"));
}

}  // namespace pacer
