// ProtoMutator: structure-aware mutation of any protobuf message through reflection, for the
// fuzz targets of tests/fuzz (Debian packages no libprotobuf-mutator, so this is our own, much
// smaller one, in its spirit).
//
// One Mutate() call makes one edit somewhere in the message tree: an integer set to a boundary
// value (0, 1, 2^31 - 1, 2^32 - 1, 2^63 - 1, 2^63, 2^64 - 1, ...) or nudged, a double set to
// 0 / -0 / NaN / +-inf / 1e308 / a denormal, an enum to a named or an unnamed number, a string
// to an id from the dictionary or another string of the message, emptied, cut, lengthened or
// given random bytes, a sub-message created or cleared, another field of a oneof chosen, a
// repeated field's element added, copied, dropped or swapped. CrossOver() takes elements of a
// repeated field of one message into another. Deterministic for a given seed.
//
// Not thread-safe; one per fuzzing thread.
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pacer::fuzz {

class ProtoMutator {
 public:
  explicit ProtoMutator(uint64_t seed) : rng_(seed) {}

  // Strings the mutator prefers for string fields (ids pacerd knows, for example).
  void set_dictionary(std::vector<std::string> words) { dictionary_ = std::move(words); }

  // One edit of `msg`, keeping its serialized size within `max_bytes` (an edit that would pass
  // it is undone and another tried).
  void Mutate(google::protobuf::Message* msg, size_t max_bytes);
  // Moves some elements of `other`'s repeated fields into the same fields of `msg` (same type).
  void CrossOver(const google::protobuf::Message& other, google::protobuf::Message* msg,
                 size_t max_bytes);

  std::mt19937_64& rng() { return rng_; }

 private:
  struct Slot {
    google::protobuf::Message* msg;
    const google::protobuf::FieldDescriptor* field;
  };
  void CollectSlots(google::protobuf::Message* msg, int depth, std::vector<Slot>* out);
  void MutateSlot(const Slot& slot);
  void MutateScalar(google::protobuf::Message* msg, const google::protobuf::FieldDescriptor* f,
                    int index);
  std::string MutateString(const std::string& in, bool bytes);
  uint64_t BoundaryU64(uint64_t old);
  int64_t BoundaryI64(int64_t old);
  double BoundaryDouble(double old);
  bool OneIn(int n) { return rng_() % n == 0; }

  std::mt19937_64 rng_;
  std::vector<std::string> dictionary_;
  std::vector<std::string> seen_strings_;  // strings of the message being mutated
};

}  // namespace pacer::fuzz
