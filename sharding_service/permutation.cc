#include "sharding_service/permutation.h"

#include <algorithm>

#include "common/log.h"

namespace pacer {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  PACER_CHECK(n >= 1) << "empty permutation";
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = SplitMix64(seed ^ SplitMix64(epoch + 0x5bd1e995ULL));
  for (auto& key : keys_) {
    k = SplitMix64(k);
    key = k;
  }
}

uint64_t Permutation::Round(uint64_t half, int round) const {
  return SplitMix64(half ^ keys_[round]) & half_mask_;
}

uint64_t Permutation::Encrypt(uint64_t x) const {
  uint64_t l = x >> half_bits_, r = x & half_mask_;
  for (int i = 0; i < 4; ++i) {
    uint64_t next = l ^ Round(r, i);
    l = r;
    r = next;
  }
  return (l << half_bits_) | r;
}

uint64_t Permutation::Decrypt(uint64_t y) const {
  uint64_t l = y >> half_bits_, r = y & half_mask_;
  for (int i = 3; i >= 0; --i) {
    uint64_t prev = r ^ Round(l, i);
    r = l;
    l = prev;
  }
  return (l << half_bits_) | r;
}

// Cycle walking: the Feistel domain is at most 4n, so a walk takes under 4 steps on average and
// stays a bijection on [0, n).
uint64_t Permutation::Apply(uint64_t x) const {
  uint64_t y = Encrypt(x);
  while (y >= n_) y = Encrypt(y);
  return y;
}

uint64_t Permutation::Invert(uint64_t y) const {
  uint64_t x = Decrypt(y);
  while (x >= n_) x = Decrypt(x);
  return x;
}

uint64_t RecordsPerEpoch(const DatasetSpec& spec) {
  switch (spec.source_case()) {
    case DatasetSpec::kNumRecords:
      return spec.num_records();
    case DatasetSpec::kFiles: {
      uint64_t total = 0;
      for (const auto& f : spec.files().files()) total += f.num_records();
      return total;
    }
    default:
      return 0;
  }
}

namespace {

void AppendRecord(std::vector<Range>& out, uint64_t begin, uint64_t end) {
  if (!out.empty() && out.back().end() == begin) {
    out.back().set_end(end);
    return;
  }
  Range r;
  r.set_begin(begin);
  r.set_end(end);
  out.push_back(std::move(r));
}

}  // namespace

std::vector<Range> MapPositionsToRecords(const DatasetSpec& spec, uint32_t epoch, uint64_t begin,
                                         uint64_t end) {
  std::vector<Range> out;
  if (begin >= end) return out;
  const uint64_t n = RecordsPerEpoch(spec);
  if (spec.shuffle() == SHUFFLE_NONE || n == 0) {
    AppendRecord(out, begin, end);
    return out;
  }
  if (spec.shuffle() == SHUFFLE_RECORDS) {
    Permutation perm(n, spec.seed(), epoch);
    for (uint64_t p = begin; p < end; ++p) {
      uint64_t r = perm.Apply(p);
      AppendRecord(out, r, r + 1);
    }
    return out;
  }
  // SHUFFLE_SHARDS: record blocks of `s` records, visited in a permuted order. Every block is
  // full except possibly the last record block `last`; positions after the slot holding it are
  // shifted by the records it lacks.
  const uint64_t s = std::max<uint64_t>(spec.shard_size(), 1);
  const uint64_t blocks = (n + s - 1) / s;
  const uint64_t last = blocks - 1;
  const uint64_t last_size = n - last * s;
  Permutation perm(blocks, spec.seed(), epoch);
  const uint64_t last_slot = perm.Invert(last);
  const uint64_t last_slot_begin = last_slot * s;  // position where the short block starts
  uint64_t p = begin;
  while (p < end) {
    uint64_t slot, offset, block_size;
    if (p < last_slot_begin) {
      slot = p / s;
      offset = p % s;
    } else if (p < last_slot_begin + last_size) {
      slot = last_slot;
      offset = p - last_slot_begin;
    } else {
      uint64_t shifted = p + (s - last_size);
      slot = shifted / s;
      offset = shifted % s;
    }
    const uint64_t block = perm.Apply(slot);
    block_size = block == last ? last_size : s;
    const uint64_t take = std::min(end - p, block_size - offset);
    AppendRecord(out, block * s + offset, block * s + offset + take);
    p += take;
  }
  return out;
}

std::vector<FileSegment> RecordsToFileSegments(const DatasetSpec& spec,
                                               const std::vector<Range>& records) {
  std::vector<FileSegment> out;
  if (spec.source_case() != DatasetSpec::kFiles) return out;
  const auto& files = spec.files().files();
  std::vector<uint64_t> starts;  // global id of each file's first record
  starts.reserve(files.size() + 1);
  uint64_t acc = 0;
  for (const auto& f : files) {
    starts.push_back(acc);
    acc += f.num_records();
  }
  starts.push_back(acc);
  for (const auto& r : records) {
    uint64_t id = r.begin();
    while (id < r.end()) {
      // The file whose range holds `id` (skipping empty files).
      auto it = std::upper_bound(starts.begin(), starts.end(), id);
      size_t f = static_cast<size_t>(it - starts.begin()) - 1;
      const uint64_t file_end = starts[f + 1];
      const uint64_t take_end = std::min(r.end(), file_end);
      if (!out.empty() && out.back().file_index() == f &&
          out.back().end() == id - starts[f]) {
        out.back().set_end(take_end - starts[f]);
      } else {
        FileSegment seg;
        seg.set_file_index(static_cast<uint32_t>(f));
        seg.set_path(files[static_cast<int>(f)].path());
        seg.set_begin(id - starts[f]);
        seg.set_end(take_end - starts[f]);
        out.push_back(std::move(seg));
      }
      id = take_end;
    }
  }
  return out;
}

}  // namespace pacer
