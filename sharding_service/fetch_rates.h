// FetchRates: the records each worker trains a step, as the batch plan in force says (pacerd's
// WorkerSessions hold the plan; the simulator's control plane the plan it carried out).
//
// Near an epoch's end the fetch planner (fetch_planner.cc) shares the records left between the
// dataset's consumers by these rates when every consumer has one, so that ranks planned to
// unequal local batches run out within a step or two of each other. Soft state: never
// journaled -- each lease's decided range is (CreateLeaseUpdate, v3 on), so a replay gives the
// same leases without it.
#pragma once

#include <map>
#include <string>

namespace pacer {

class FetchRates {
 public:
  // `worker` trains `records_per_step` records a step (a plan's samples: micro-batch x
  // accumulation); a value <= 0 forgets the worker.
  void Set(const std::string& worker, double records_per_step) {
    auto it = per_worker_.find(worker);
    if (it != per_worker_.end()) {
      total_ -= it->second;
      per_worker_.erase(it);
    }
    if (records_per_step > 0) {
      per_worker_.emplace(worker, records_per_step);
      total_ += records_per_step;
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

 private:
  std::map<std::string, double> per_worker_;
  double total_ = 0;
};

}  // namespace pacer
