// ShardingState: what a request may ask for — dataset specs (normalised, defaults filled in),
// names, allocations. Pure functions; the service calls them before anything is journaled.
#include "sharding_service/sharding_state.h"
#include <set>

#include "absl/strings/str_cat.h"

namespace pacer {

bool IsValidName(const std::string& s, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == ':' || c == '/')) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<DatasetSpec> ShardingState::NormalizeSpec(const DatasetSpec& in) {
  DatasetSpec s = in;
  if (!IsValidName(s.name(), kMaxNameLength)) {
    return absl::InvalidArgumentError(
        "dataset.name: must be 1..128 characters of [A-Za-z0-9._:/-]");
  }
  const std::string where = "dataset '" + s.name() + "': ";
  switch (s.source_case()) {
    case DatasetSpec::kNumRecords:
      if (s.num_records() == 0 || s.num_records() > kMaxRecordsPerDataset) {
        return absl::InvalidArgumentError(where + "num_records must be in 1..2^50");
      }
      break;
    case DatasetSpec::kFiles: {
      const auto& files = s.files().files();
      if (files.empty() || files.size() > kMaxFiles) {
        return absl::InvalidArgumentError(where + "files: must list 1..1000000 files");
      }
      uint64_t total = 0;
      for (int i = 0; i < files.size(); ++i) {
        if (files[i].path().empty() || files[i].path().size() > 4096) {
          return absl::InvalidArgumentError(where + "files[" + std::to_string(i) +
                                            "].path: must be 1..4096 characters");
        }
        if (files[i].num_records() > kMaxRecordsPerDataset) {
          return absl::InvalidArgumentError(where + "files[" + std::to_string(i) +
                                            "].num_records: too large");
        }
        total += files[i].num_records();
        if (total > kMaxRecordsPerDataset) {
          return absl::InvalidArgumentError(where + "files: more than 2^50 records in all");
        }
      }
      if (total == 0) return absl::InvalidArgumentError(where + "files: no records");
      break;
    }
    case DatasetSpec::kStream: {
      const auto& parts = s.stream().partitions();
      if (parts.empty() || parts.size() > kMaxPartitions) {
        return absl::InvalidArgumentError(where + "stream.partitions: must list 1..65536");
      }
      std::set<uint32_t> ids;
      for (const auto& p : parts) {
        if (!ids.insert(p.id()).second) {
          return absl::InvalidArgumentError(where + "stream.partitions: duplicate id " +
                                            std::to_string(p.id()));
        }
      }
      if (s.num_epochs() != 0) {
        return absl::InvalidArgumentError(where + "num_epochs: a stream has no epochs");
      }
      if (s.shuffle() != SHUFFLE_NONE) {
        return absl::InvalidArgumentError(where + "shuffle: a stream cannot be shuffled");
      }
      if (s.epoch_barrier()) {
        return absl::InvalidArgumentError(where + "epoch_barrier: a stream has no epochs");
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(where + "one of num_records, files or stream is required");
  }
  if (!ShuffleMode_IsValid(s.shuffle())) {
    return absl::InvalidArgumentError(where + "shuffle: unknown mode");
  }
  if (!PoisonAction_IsValid(s.on_poison())) {
    return absl::InvalidArgumentError(where + "on_poison: unknown action");
  }
  if (s.batch_size() > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(where + "batch_size: at most 16777216");
  }
  if (s.shard_size() == 0) {
    s.set_shard_size(s.batch_size() > 0 ? 10 * s.batch_size() : kDefaultShardSize);
  }
  if (s.batch_size() == 0) s.set_batch_size(1);
  if (s.shard_size() > kMaxShardSize) {
    return absl::InvalidArgumentError(where + "shard_size: at most 2^32");
  }
  if (s.shuffle() == SHUFFLE_RECORDS && s.shard_size() > kMaxRecordsShuffleShardSize) {
    return absl::InvalidArgumentError(
        where + "shard_size: at most 65536 with shuffle=records (a lease lists its record ids)");
  }
  if (s.max_attempts() == 0) s.set_max_attempts(kDefaultMaxAttempts);
  if (s.max_attempts() > 1'000'000) {
    return absl::InvalidArgumentError(where + "max_attempts: at most 1000000");
  }
  return s;
}


absl::Status ShardingState::ValidateAllocation(const SetAllocationUpdate& u) {
  if (!(u.weight() >= 0.0 && u.weight() <= 1000.0)) {  // also rejects NaN
    return absl::InvalidArgumentError("allocation.weight: must be in [0, 1000]");
  }
  if (u.shard_size() > kMaxShardSize) {
    return absl::InvalidArgumentError("allocation.shard_size: at most 2^32");
  }
  if (u.max_leases() > 1024) {
    return absl::InvalidArgumentError("allocation.max_leases: at most 1024");
  }
  return absl::OkStatus();
}

}  // namespace pacer
