// FetchRates: the records each worker trains a step, as the batch plan in force says (pacerd's
// WorkerSessions hold the plan; the simulator's control plane the plan it carried out).
//
// Near an epoch's end the fetch planner (fetch_planner.cc) shares the records left between the
// dataset's consumers by these rates when every consumer has one, so that ranks planned to
// unequal local batches run out within a step or two of each other. Soft state: never
// journaled -- each lease's decided range is (CreateLeaseUpdate, v3 on), so a replay gives the
// same leases without it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace pacer {

class FetchRates {
 public:
  FetchRates() = default;
  FetchRates(const FetchRates&) = default;
  FetchRates& operator=(const FetchRates&) = default;
  // A moved-from FetchRates is empty, with the empty stamp (never another's content's).
  FetchRates(FetchRates&& o) noexcept
      : per_worker_(std::move(o.per_worker_)), total_(o.total_), stamp_(o.stamp_) {
    o.Clear();
  }
  FetchRates& operator=(FetchRates&& o) noexcept {
    if (this != &o) {
      per_worker_ = std::move(o.per_worker_);
      total_ = o.total_;
      stamp_ = o.stamp_;
      o.Clear();
    }
    return *this;
  }

  // `worker` trains `records_per_step` records a step (a plan's samples: micro-batch x
  // accumulation); a value <= 0 forgets the worker.
  void Set(const std::string& worker, double records_per_step) {
    auto it = per_worker_.find(worker);
    if (it != per_worker_.end()) {
      total_ -= it->second;
      if (records_per_step > 0) {
        // Plans name every worker again whenever one changes: most Sets repeat the rate.
        if (it->second != records_per_step) {
          it->second = records_per_step;
          stamp_ = NextStamp();
        }
        total_ += records_per_step;
        return;
      }
      per_worker_.erase(it);
      stamp_ = NextStamp();
      return;
    }
    if (records_per_step > 0) {
      per_worker_.emplace(worker, records_per_step);
      total_ += records_per_step;
      stamp_ = NextStamp();
    }
  }
  // The worker's rate; 0 when the plan does not name it.
  double Of(const std::string& worker) const {
    auto it = per_worker_.find(worker);
    return it == per_worker_.end() ? 0.0 : it->second;
  }
  // Every worker named, by id in std::map order: a caller walking another map keyed by worker
  // id reads the rates in step with it instead of looking each one up.
  const std::map<std::string, double>& per_worker() const { return per_worker_; }
  // Sum over every worker named.
  double total() const { return total_; }
  bool empty() const { return per_worker_.empty(); }
  // Names per_worker()'s content: two FetchRates with one stamp name the same rates (a copy
  // keeps its original's; every change draws a stamp no other content ever had, process-wide;
  // 0 is the empty content). Whoever keeps sums over the rates (the fetch planner's consumer
  // sums) knows by it whether they still hold.
  uint64_t stamp() const { return stamp_; }

 private:
  static uint64_t NextStamp() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  void Clear() {
    per_worker_.clear();
    total_ = 0;
    stamp_ = 0;
  }

  std::map<std::string, double> per_worker_;
  double total_ = 0;
  uint64_t stamp_ = 0;
};

}  // namespace pacer
