// RecentDurations: the last `capacity` durations seen (a ring) and their median. The sharding
// service keeps one of completed shard leases for pacerd's view (JobFacts::typical_shard_time_s);
// the simulator keeps one per run, so both report the same statistic. Not thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace pacer {

class RecentDurations {
 public:
  explicit RecentDurations(size_t capacity = 64) : capacity_(std::max<size_t>(1, capacity)) {}

  void Add(double seconds) {
    if (values_.size() < capacity_) {
      values_.push_back(seconds);
    } else {
      values_[next_] = seconds;
    }
    next_ = (next_ + 1) % capacity_;
  }
  // The upper median (the same element for an odd and an even count as nth_element at n/2);
  // 0 when nothing was added.
  double Median() const {
    if (values_.empty()) return 0;
    std::vector<double> v = values_;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return v[v.size() / 2];
  }
  size_t size() const { return values_.size(); }

 private:
  size_t capacity_;
  size_t next_ = 0;
  std::vector<double> values_;
};

}  // namespace pacer
