// ShardingState: checkpoints — pinning the data position to a model checkpoint (SaveCheckpoint)
// and going back to it (RestoreCheckpoint).
#include "sharding_service/sharding_state.h"
#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pacer {

Checkpoint ShardingState::CapturePosition(const std::string& tag, int64_t t) const {
  Checkpoint cp;
  cp.set_tag(tag);
  cp.set_time_ms(t);
  for (const auto& [name, ds] : datasets_) {
    DatasetPosition* pos = cp.add_datasets();
    pos->set_dataset(name);
    pos->set_next_epoch(ds.next_epoch);
    pos->set_completed_epochs(ds.completed_epochs);
    pos->set_records_done_total(ds.records_done_total);
    pos->set_has_records_done_total(true);
    for (const Epoch& ep : ds.open) {
      // Pending = requeued ranges + frontier + the undone suffix of every lease (once per pair).
      std::vector<std::vector<PendingRange>> pending(ep.partitions.size());
      for (size_t d = 0; d < ep.partitions.size(); ++d) {
        for (const Pending& p : ep.partitions[d].requeue) {
          PendingRange r;
          r.set_begin(p.begin);
          r.set_end(p.end);
          pending[d].push_back(r);
        }
      }
      for (const auto& [id, l] : leases_) {
        if (l.dataset != name || l.epoch != ep.epoch) continue;
        if (l.backup && l.partner != 0) continue;  // its primary accounts for the pair
        uint64_t from = l.done_pos();
        if (l.partner != 0) from = std::max(from, leases_.at(l.partner).done_pos());
        if (from >= l.end) continue;
        PendingRange r;
        r.set_begin(from);
        r.set_end(l.end);
        pending[l.partition].push_back(r);
      }
      EpochPosition* e = pos->add_epochs();
      e->set_epoch(ep.epoch);
      for (size_t d = 0; d < ep.partitions.size(); ++d) {
        const Partition& dom = ep.partitions[d];
        PartitionState* out = e->add_partitions();
        out->set_start(dom.start);
        out->set_frontier(dom.frontier);
        out->set_limit(dom.limit);
        out->set_done(dom.done);
        out->set_quarantined(dom.quarantined);
        std::sort(pending[d].begin(), pending[d].end(),
                  [](const PendingRange& a, const PendingRange& b) { return a.begin() < b.begin(); });
        for (auto& r : pending[d]) *out->add_requeue() = std::move(r);
      }
    }
  }
  return cp;
}

absl::Status ShardingState::ValidateCheckpointTag(const std::string& tag) {
  if (!IsValidName(tag, kMaxNameLength)) {
    return absl::InvalidArgumentError("tag: must be 1..128 characters of [A-Za-z0-9._:/-]");
  }
  return absl::OkStatus();
}

uint64_t ShardingState::CheckpointHeldBytes(const Checkpoint& cp) {
  uint64_t partitions = 0;
  for (const auto& ds : cp.datasets()) {
    for (const auto& ep : ds.epochs()) partitions += ep.partitions_size();
  }
  return cp.ByteSizeLong() + partitions * kCheckpointPartitionBytes;
}

void ShardingState::ApplySaveCheckpoint(const SaveCheckpointUpdate& u, int64_t t) {
  checkpoints_[u.tag()] = CapturePosition(u.tag(), t);
  // At most kMaxCheckpoints, and at most kMaxCheckpointBytes (CheckpointHeldBytes, the same on
  // every replay) unless the newest alone is larger: the oldest go first.
  uint64_t bytes = 0;
  for (const auto& [tag, cp] : checkpoints_) bytes += CheckpointHeldBytes(cp);
  while (checkpoints_.size() > kMaxCheckpoints ||
         (checkpoints_.size() > 1 && bytes > kMaxCheckpointBytes)) {
    // Over the count: the oldest of all. Over the bytes: the oldest of the others.
    const bool keep_newest = checkpoints_.size() <= kMaxCheckpoints;
    auto oldest = checkpoints_.end();
    for (auto it = checkpoints_.begin(); it != checkpoints_.end(); ++it) {
      if (keep_newest && it->first == u.tag()) continue;
      if (oldest == checkpoints_.end() || it->second.time_ms() < oldest->second.time_ms()) oldest = it;
    }
    bytes -= CheckpointHeldBytes(oldest->second);
    checkpoints_.erase(oldest);
  }
}

void ShardingState::ApplyRestoreCheckpoint(const RestoreCheckpointUpdate& u, int64_t t) {
  const Checkpoint cp = checkpoints_.at(u.tag());
  // Fence every lease: the data position goes back to the checkpoint's.
  for (auto& [id, lease] : leases_) {
    RememberEnded(lease, LEASE_CANCELLED);
    cancelled_.emplace_back(lease.worker, id);
  }
  leases_.clear();
  for (auto& [name, ds] : datasets_) {
    const DatasetPosition* pos = nullptr;
    for (const auto& p : cp.datasets()) {
      if (p.dataset() == name) pos = &p;
    }
    ds.open.clear();
    if (pos == nullptr) {  // registered after the checkpoint: everything is delivered again
      ds.next_epoch = 0;
      ds.completed_epochs = 0;
      ds.records_done_total = 0;
      if (ds.is_stream()) {
        ds.open.push_back(MakeEpoch(ds, 0));
        ds.next_epoch = 1;
      }
      continue;
    }
    ds.next_epoch = pos->next_epoch();
    ds.completed_epochs = pos->completed_epochs();
    if (pos->has_records_done_total()) {
      ds.records_done_total = pos->records_done_total();
    } else {
      // A v2 checkpoint: rebuild the count from the position it pinned.
      uint64_t done = static_cast<uint64_t>(ds.completed_epochs) * ds.records_per_epoch;
      for (const auto& e : pos->epochs()) {
        for (const auto& d : e.partitions()) done += d.done();
      }
      ds.records_done_total = done;
    }
    for (const auto& e : pos->epochs()) {
      Epoch ep;
      ep.epoch = e.epoch();
      for (const auto& d : e.partitions()) {
        ep.partitions.push_back(PartitionFromProto(d, /*keep_attempts=*/false));
      }
      ds.open.push_back(std::move(ep));
    }
  }
  ForgetConsumerSums();  // every lease ended: summed again at the next fetch
}

}  // namespace pacer
