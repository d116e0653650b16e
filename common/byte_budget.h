// ByteBudget: the bytes that callers' requests make a service hold, bounded in total and per
// caller (one credential), so that no single caller can exhaust pacerd or lock honest callers
// out of a shared resource. A caller is named by the string its credential maps to
// (Principal::Describe(), common/auth.h); the empty string is a caller like any other.
//
// Not thread-safe: the owning service calls it under its own mutex.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pacer {

class ByteBudget {
 public:
  struct Limits {
    uint64_t total = 0;       // over every caller
    uint64_t per_caller = 0;  // for one caller
  };
  // `what` names the resource in errors ("waiting Get keys"); `total_name` / `per_caller_name`
  // name the limits as an operator sets them (a flag, or an option of the embedding API).
  ByteBudget(Limits limits, std::string what, std::string total_name, std::string per_caller_name)
      : limits_(limits),
        what_(std::move(what)),
        total_name_(std::move(total_name)),
        per_caller_name_(std::move(per_caller_name)) {}

  // Charges `bytes` to `caller`; RESOURCE_EXHAUSTED naming the limit that would be passed (and
  // nothing charged) otherwise.
  absl::Status Charge(const std::string& caller, uint64_t bytes) {
    uint64_t& mine = used_by_[caller];
    if (mine + bytes > limits_.per_caller || mine + bytes < mine) {
      const uint64_t held = mine;
      if (held == 0) used_by_.erase(caller);
      return absl::ResourceExhaustedError(absl::StrCat(
          what_, ": this caller would hold ", held + bytes, " bytes, over its limit of ",
          limits_.per_caller, " (", per_caller_name_, ")"));
    }
    if (used_ + bytes > limits_.total || used_ + bytes < used_) {
      if (mine == 0) used_by_.erase(caller);
      return absl::ResourceExhaustedError(absl::StrCat(what_, ": every caller together would hold ",
                                                       used_ + bytes, " bytes, over the limit of ",
                                                       limits_.total, " (", total_name_, ")"));
    }
    mine += bytes;
    used_ += bytes;
    return absl::OkStatus();
  }
  // Gives back what Charge took (never more than `caller` holds).
  void Release(const std::string& caller, uint64_t bytes) {
    auto it = used_by_.find(caller);
    if (it == used_by_.end()) return;
    const uint64_t n = bytes < it->second ? bytes : it->second;
    it->second -= n;
    used_ -= n;
    if (it->second == 0) used_by_.erase(it);
  }

  // Forgets every charge (the resource was dropped whole).
  void Clear() {
    used_ = 0;
    used_by_.clear();
  }

  uint64_t used() const { return used_; }
  uint64_t used_by(const std::string& caller) const {
    auto it = used_by_.find(caller);
    return it == used_by_.end() ? 0 : it->second;
  }
  const Limits& limits() const { return limits_; }

 private:
  Limits limits_;
  std::string what_, total_name_, per_caller_name_;
  uint64_t used_ = 0;
  std::map<std::string, uint64_t> used_by_;  // only callers holding something
};

}  // namespace pacer
