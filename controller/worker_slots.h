// WorkerSlots<T>: one record per worker id, stored densely, found by id or by a caller's hint.
//
// The burst rule and the step statistics see every worker's timing at every heartbeat (a
// 4 096-worker job: ~4 000 a second each). Hashing the id string for each of them, and walking
// a hash table's scattered entries to decide, was most of the step path's cost. Here records
// live in a vector (Decide walks it in order); a timing may carry the caller's own dense index
// of the worker (StepTiming::worker_index: the simulator's; pacerd leaves it 0), which finds
// the record with one id comparison instead of a hashed lookup. A hint is only a hint: a wrong
// one (another worker's slot) is checked against the id and falls back to the lookup.
//
// Nothing may depend on the slots' order (a forgotten worker's slot is reused): users sort
// what they read or take order-free sums and maxima.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace pacer {

template <typename T>
class WorkerSlots {
 public:
  // The record of `id`, created (value-initialised) when absent. `hint`: the caller's dense
  // index of `id` + 1 (0: none).
  T& At(const std::string& id, uint32_t hint = 0) {
    if (hint > 0 && hint <= by_hint_.size()) {
      const uint32_t s = by_hint_[hint - 1];
      if (s > 0 && SameId(ids_[s - 1], id)) return values_[s - 1];
    }
    uint32_t slot;
    if (auto it = index_.find(id); it != index_.end()) {
      slot = it->second;
    } else {
      if (!free_.empty()) {
        slot = free_.back();
        free_.pop_back();
      } else {
        slot = static_cast<uint32_t>(values_.size());
        ids_.emplace_back();
        live_.push_back(false);
        values_.emplace_back();
      }
      ids_[slot] = id;
      live_[slot] = true;
      values_[slot] = T();
      index_.emplace(id, slot);
    }
    if (hint > 0) {
      if (by_hint_.size() < hint) by_hint_.resize(hint, 0);
      by_hint_[hint - 1] = slot + 1;
    }
    return values_[slot];
  }
  const T* Find(const std::string& id) const {
    auto it = index_.find(id);
    return it == index_.end() ? nullptr : &values_[it->second];
  }
  T* Find(const std::string& id) {
    auto it = index_.find(id);
    return it == index_.end() ? nullptr : &values_[it->second];
  }
  void Erase(const std::string& id) {
    auto it = index_.find(id);
    if (it == index_.end()) return;
    const uint32_t s = it->second;
    live_[s] = false;
    ids_[s].clear();
    values_[s] = T();
    free_.push_back(s);
    index_.erase(it);
  }
  void Clear() {
    ids_.clear();
    live_.clear();
    values_.clear();
    free_.clear();
    by_hint_.clear();
    index_.clear();
  }
  size_t size() const { return index_.size(); }

  // f(id, record) for every worker, in slot order (which nothing may depend on).
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t s = 0; s < values_.size(); ++s)
      if (live_[s]) f(ids_[s], values_[s]);
  }
  template <typename F>
  void ForEach(F&& f) {
    for (size_t s = 0; s < values_.size(); ++s)
      if (live_[s]) f(ids_[s], values_[s]);
  }
  // Whether p(id, record) holds for some worker (stops at the first that does).
  template <typename P>
  bool Any(P&& p) const {
    for (size_t s = 0; s < values_.size(); ++s)
      if (live_[s] && p(ids_[s], values_[s])) return true;
    return false;
  }

 private:
  // Ids are short ("w1234"): a loop the compiler keeps inline, not a memcmp call.
  static bool SameId(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return false;
    const char* p = a.data();
    const char* q = b.data();
    for (size_t i = a.size(); i-- > 0;)
      if (p[i] != q[i]) return false;
    return true;
  }
  // A slot's id, whether it is in use, and its record, apart: a pass over every worker's
  // record (Decide, Summaries) reads the records alone, not the ids between them.
  std::vector<std::string> ids_;
  std::vector<uint8_t> live_;
  std::vector<T> values_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> by_hint_;  // hint − 1 → slot + 1 (0: unknown)
  absl::flat_hash_map<std::string, uint32_t> index_;
};

}  // namespace pacer
