// Seeded permutations and the position -> record mapping of a dataset epoch.
//
// The sharding state stores only *positions* (0..N-1 per epoch). How positions map to record ids
// is a pure function of the dataset spec and the epoch, computed here without memory that grows
// with N: a keyed Feistel network over the smallest even-bit domain >= N, with cycle walking,
// is a bijection on [0, N) that can be evaluated (and inverted) one index at a time. Every
// epoch gets its own key, so orders differ per epoch yet are reproducible from the seed.
#pragma once

#include <cstdint>
#include <vector>

#include "proto/pacer/sharding.pb.h"

namespace pacer {

class Permutation {
 public:
  // A bijection on [0, n); n >= 1.
  Permutation(uint64_t n, uint64_t seed, uint64_t epoch);
  uint64_t Apply(uint64_t x) const;
  uint64_t Invert(uint64_t y) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t Round(uint64_t half, int round) const;
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t y) const;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[4];
};

// Number of records one epoch of `spec` holds; 0 for a stream.
uint64_t RecordsPerEpoch(const DatasetSpec& spec);

// Maps positions [begin, end) of `epoch` (or offsets of a stream partition) to record ids, in
// delivery order, merging adjacent ids into ranges.
std::vector<Range> MapPositionsToRecords(const DatasetSpec& spec, uint32_t epoch, uint64_t begin,
                                         uint64_t end);

// Splits record-id ranges of a file dataset into per-file segments.
std::vector<FileSegment> RecordsToFileSegments(const DatasetSpec& spec,
                                               const std::vector<Range>& records);

}  // namespace pacer
