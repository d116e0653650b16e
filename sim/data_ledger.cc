#include "sim/data_ledger.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace pacer::sim {

void DataLedger::Acknowledge(uint64_t begin, uint64_t end, uint64_t key) {
  if (begin >= end) return;
  auto it = segs_.upper_bound(begin);
  if (it != segs_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > begin) it = prev;
  }
  absl::InlinedVector<std::pair<uint64_t, uint64_t>, 4> gaps;  // no allocation in the usual case
  uint64_t pos = begin;
  for (; it != segs_.end() && it->first < end; ++it) {
    if (it->first > pos) gaps.emplace_back(pos, it->first);
    const uint64_t lo = std::max(pos, it->first), hi = std::min(end, it->second.end);
    if (hi > lo) {
      if (key != 0 && it->second.key == key) backup_overlap_ += hi - lo;
      else duplicated_ += hi - lo;
    }
    pos = std::max(pos, hi);
    if (pos >= end) break;
  }
  if (pos < end) gaps.emplace_back(pos, end);
  for (const auto& [a, b] : gaps) InsertGap(a, b, key);
}

void DataLedger::InsertGap(uint64_t begin, uint64_t end, uint64_t key) {
  covered_ += end - begin;
  auto next = segs_.lower_bound(begin);
  if (next != segs_.begin()) {
    auto prev = std::prev(next);
    if (prev->second.end == begin && prev->second.key == key) {
      prev->second.end = end;
      if (next != segs_.end() && next->first == end && next->second.key == key) {
        prev->second.end = next->second.end;
        segs_.erase(next);
      }
      return;
    }
  }
  if (next != segs_.end() && next->first == end && next->second.key == key) {
    const Seg s{next->second.end, key};
    segs_.erase(next);
    segs_.emplace(begin, s);
    return;
  }
  segs_.emplace(begin, Seg{end, key});
}

}  // namespace pacer::sim
