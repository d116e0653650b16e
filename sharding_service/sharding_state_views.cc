// ShardingState: reads — lookups and the proto views the service returns (Lease, DatasetInfo).
#include "sharding_service/sharding_state.h"
#include "sharding_service/permutation.h"

#include "absl/strings/str_cat.h"

namespace pacer {

const ShardingState::Dataset* ShardingState::FindDataset(const std::string& name) const {
  auto it = datasets_.find(name);
  return it == datasets_.end() ? nullptr : &it->second;
}

const ShardingState::LeaseRec* ShardingState::FindLease(uint64_t id) const {
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

const ShardingState::WorkerRec* ShardingState::FindWorker(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const EndedLease* ShardingState::FindEnded(const std::string& worker, uint64_t lease_id) const {
  const WorkerRec* w = FindWorker(worker);
  if (w == nullptr) return nullptr;
  auto it = w->ended.find(lease_id);
  return it == w->ended.end() ? nullptr : &it->second;
}

std::string ShardingState::ExplainUnknownLease(const std::string& worker,
                                               uint64_t lease_id) const {
  if (lease_id == 0 || lease_id >= next_lease_id_) {
    return absl::StrCat("lease ", lease_id, " was never granted");
  }
  // Ended leases are kept: each worker's newest EndedFloor whatever their epoch and, for the
  // open epochs and the one before, as far as the job's budget allows, more (sharding_state.h,
  // "Memory");
  // anything older (or another worker's lease) is not known to this worker any more, so whether
  // it was counted is unknown.
  const WorkerRec* w = FindWorker(worker);
  return absl::StrCat(
      "lease ", lease_id, " is not an active or remembered lease of worker '", worker,
      "' (beyond a worker's newest ", w ? EndedFloor(*w) : kMinEndedPerWorker,
      ", leases of epochs finished before the previous one are forgotten, and so are all but a "
      "worker's newest ", w ? EndedFloor(*w) : kMinEndedPerWorker, " once the job remembers ",
      kMaxEndedBeyondFloor, " more, and all but its newest ", kMaxEndedPerWorker,
      "); its outcome is unknown: too old to know");
}

Lease ShardingState::DescribeLease(const LeaseRec& l) const {
  const Dataset& ds = datasets_.at(l.dataset);
  Lease out;
  out.set_lease_id(l.id);
  out.set_fencing_token(l.token);
  out.set_dataset(l.dataset);
  out.set_epoch(l.epoch);
  out.set_partition(l.partition);
  out.set_begin(l.begin);
  out.set_end(l.end);
  out.set_records_done(l.done);
  out.set_backup(l.backup);
  out.set_worker_id(l.worker);
  out.set_shard_id(absl::StrCat(l.dataset, "/e", l.epoch, "/p", l.partition, "/", l.begin, "-",
                                l.end));
  auto records = MapPositionsToRecords(*ds.spec, l.epoch, l.begin, l.end);
  if (ds.spec->source_case() == DatasetSpec::kFiles) {
    for (auto& seg : RecordsToFileSegments(*ds.spec, records)) *out.add_segments() = std::move(seg);
  }
  for (auto& r : records) *out.add_records() = std::move(r);
  return out;
}

DatasetInfo ShardingState::DescribeDataset(const Dataset& ds, bool include_files) const {
  DatasetInfo info;
  if (include_files || ds.spec->source_case() != DatasetSpec::kFiles) {
    *info.mutable_spec() = *ds.spec;
  } else {
    // Every field but the file list (up to 1 M files: never copied for a listing). A field
    // added to DatasetSpec must be added here; sharding_snapshot_test checks every field.
    const DatasetSpec& in = *ds.spec;
    DatasetSpec* out = info.mutable_spec();
    out->set_name(in.name());
    out->mutable_files();
    out->set_shard_size(in.shard_size());
    out->set_batch_size(in.batch_size());
    out->set_num_epochs(in.num_epochs());
    out->set_shuffle(in.shuffle());
    out->set_seed(in.seed());
    out->set_epoch_barrier(in.epoch_barrier());
    out->set_max_attempts(in.max_attempts());
    out->set_on_poison(in.on_poison());
    out->set_tail_backup(in.tail_backup());
  }
  info.set_current_epoch(ds.open.empty() ? ds.next_epoch : ds.open.front().epoch);
  info.set_completed_epochs(ds.completed_epochs);
  info.set_records_per_epoch(ds.records_per_epoch);
  uint64_t active = 0, pending = 0;
  if (!ds.open.empty()) {
    uint64_t done = 0;
    for (const auto& d : ds.open.front().partitions) done += d.done;
    info.set_records_done_current_epoch(done);
  }
  for (const auto& ep : ds.open) {
    active += ep.active_leases;
    for (const auto& d : ep.partitions) pending += d.requeue.size() + (d.frontier < d.limit ? 1 : 0);
  }
  info.set_active_leases(active);
  info.set_pending_ranges(pending);
  info.set_records_done_total(ds.records_done_total);
  info.set_requeues_total(ds.requeues_total);
  for (const auto& q : ds.quarantined) *info.add_quarantined() = q;
  info.set_records_quarantined(ds.records_quarantined_total);
  if (ds.spec->source_case() == DatasetSpec::kFiles) info.set_num_files(ds.spec->files().files_size());
  info.set_failed(ds.failed);
  info.set_failure(ds.failure);
  info.set_finished(ds.Finished());
  info.set_tail_backup(ds.tail_backup);
  return info;
}



}  // namespace pacer
