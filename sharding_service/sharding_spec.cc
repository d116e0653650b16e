// ShardingState: what a request may ask for — dataset specs (normalised, defaults filled in),
// names, allocations. Pure functions; the service calls them before anything is journaled.
#include "sharding_service/sharding_state.h"
#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

namespace pacer {
namespace {

std::string SourceName(const DatasetSpec& s) {
  switch (s.source_case()) {
    case DatasetSpec::kNumRecords: return "num_records";
    case DatasetSpec::kFiles: return "files";
    case DatasetSpec::kStream: return "stream";
    default: return "none";
  }
}

// One differing scalar or enum field of the spec, by reflection (a field added to DatasetSpec
// is covered without a change here).
std::string ScalarField(const google::protobuf::Message& m,
                        const google::protobuf::FieldDescriptor* f) {
  using FD = google::protobuf::FieldDescriptor;
  const auto* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32: return std::to_string(r->GetInt32(m, f));
    case FD::CPPTYPE_INT64: return std::to_string(r->GetInt64(m, f));
    case FD::CPPTYPE_UINT32: return std::to_string(r->GetUInt32(m, f));
    case FD::CPPTYPE_UINT64: return std::to_string(r->GetUInt64(m, f));
    case FD::CPPTYPE_BOOL: return r->GetBool(m, f) ? "true" : "false";
    case FD::CPPTYPE_ENUM: return std::string(r->GetEnum(m, f)->name());
    case FD::CPPTYPE_STRING: return "'" + r->GetString(m, f) + "'";
    case FD::CPPTYPE_DOUBLE: return std::to_string(r->GetDouble(m, f));
    case FD::CPPTYPE_FLOAT: return std::to_string(r->GetFloat(m, f));
    default: return "?";
  }
}

std::string FilesDifference(const FileList& a, const FileList& b) {
  uint64_t ra = 0, rb = 0;
  for (const auto& f : a.files()) ra += f.num_records();
  for (const auto& f : b.files()) rb += f.num_records();
  std::vector<std::string> out;
  if (a.files_size() != b.files_size()) {
    out.push_back(absl::StrCat(a.files_size(), " files (registered) vs ", b.files_size(),
                               " (requested)"));
  }
  if (ra != rb) out.push_back(absl::StrCat(ra, " records vs ", rb));
  for (int i = 0; i < std::min(a.files_size(), b.files_size()); ++i) {
    const FileSpec& fa = a.files(i);
    const FileSpec& fb = b.files(i);
    if (fa.path() != fb.path() || fa.num_records() != fb.num_records()) {
      out.push_back(absl::StrCat("files[", i, "] '", fa.path(), "' (", fa.num_records(),
                                 " records) vs '", fb.path(), "' (", fb.num_records(), ")"));
      break;  // the first one is enough to find the rest
    }
  }
  return absl::StrJoin(out, ", ");
}

std::string StreamDifference(const StreamSpec& a, const StreamSpec& b) {
  if (a.partitions_size() != b.partitions_size()) {
    return absl::StrCat(a.partitions_size(), " partitions (registered) vs ",
                        b.partitions_size(), " (requested)");
  }
  for (int i = 0; i < a.partitions_size(); ++i) {
    const auto& pa = a.partitions(i);
    const auto& pb = b.partitions(i);
    if (pa.id() != pb.id() || pa.start_offset() != pb.start_offset()) {
      return absl::StrCat("partitions[", i, "] id ", pa.id(), " from ", pa.start_offset(),
                          " (registered) vs id ", pb.id(), " from ", pb.start_offset());
    }
  }
  return "";
}

}  // namespace

std::string DescribeSpecDifference(const DatasetSpec& a, const DatasetSpec& b) {
  std::vector<std::string> out;
  bool first = true;
  auto add = [&](const std::string& field, const std::string& va, const std::string& vb) {
    out.push_back(first ? absl::StrCat(field, " ", va, " (registered) vs ", vb, " (requested)")
                        : absl::StrCat(field, " ", va, " vs ", vb));
    first = false;
  };
  if (a.source_case() != b.source_case()) {
    add("source", SourceName(a), SourceName(b));
  } else if (a.source_case() == DatasetSpec::kFiles) {
    if (std::string d = FilesDifference(a.files(), b.files()); !d.empty()) {
      out.push_back("files: " + d);
      first = false;
    }
  } else if (a.source_case() == DatasetSpec::kStream) {
    if (std::string d = StreamDifference(a.stream(), b.stream()); !d.empty()) {
      out.push_back("stream: " + d);
      first = false;
    }
  }
  const auto* desc = DatasetSpec::descriptor();
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    if (f->is_repeated()) continue;
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->containing_oneof() != nullptr && f->name() != "num_records") continue;
    if (f->name() == "num_records" && (a.source_case() != DatasetSpec::kNumRecords ||
                                       b.source_case() != DatasetSpec::kNumRecords)) {
      continue;
    }
    const std::string va = ScalarField(a, f), vb = ScalarField(b, f);
    if (va != vb) add(std::string(f->name()), va, vb);
  }
  return absl::StrJoin(out, ", ");
}

absl::Status SpecMismatchError(const DatasetSpec& registered, const DatasetSpec& requested) {
  std::string diff = DescribeSpecDifference(registered, requested);
  if (diff.empty()) diff = "fields unknown to this pacerd";
  const std::string& name = registered.name();
  return absl::AlreadyExistsError(absl::StrCat(
      "dataset '", name, "' already exists with a different spec: ", diff,
      "; to register it with the new spec, delete it first with 'pacerctl datasets delete ",
      name, "' (admin token; its progress and checkpoints go with it)"));
}

}  // namespace pacer
