// ShardingState <-> ShardingSnapshot (the journal's snapshots). Repeated fields come out sorted
// by key (the state's maps are ordered), so equal states serialize to equal bytes.
//
// Specs apart (format 4): a dataset's spec — its file list can be 1 M entries — is immutable
// once registered, so a snapshot names it (DatasetState.spec_key) and the journal keeps it as a
// pinned entry, written once in the batch of the first snapshot after the registration. The
// state holds each spec behind a shared_ptr<const>, so capturing a snapshot copies no file list
// and the journal's writer serializes only the new ones. Format 0 (specs inline, v2/v3) is
// still read, and is what ToSnapshot() gives for comparing whole states.
#include "absl/strings/str_cat.h"
#include "sharding_service/permutation.h"
#include "sharding_service/sharding_state.h"

namespace pacer {

namespace {

void PartitionToProto(const ShardingState::Partition& d, PartitionState* out) {
  out->set_start(d.start);
  out->set_frontier(d.frontier);
  out->set_limit(d.limit);
  out->set_done(d.done);
  out->set_quarantined(d.quarantined);
  for (const auto& p : d.requeue) {
    PendingRange* r = out->add_requeue();
    r->set_begin(p.begin);
    r->set_end(p.end);
    r->set_attempts(p.attempts);
  }
}

}  // namespace

ShardingState::Partition ShardingState::PartitionFromProto(const PartitionState& d, bool keep_attempts) {
  Partition dom;
  dom.start = d.start();
  dom.frontier = d.frontier();
  dom.limit = d.limit();
  dom.done = d.done();
  dom.quarantined = d.quarantined();
  for (int i = d.requeue_size() - 1; i >= 0; --i) {  // pushed at the front: the last first
    const PendingRange& r = d.requeue(i);
    dom.requeue.push_front(Pending{r.begin(), r.end(), keep_attempts ? r.attempts() : 0});
  }
  return dom;
}

std::string ShardingState::SpecKey(const std::string& dataset) { return "spec/" + dataset; }

absl::Status ShardingState::AddPinnedSpec(const std::string& key, const std::string& bytes,
                                          SpecsByKey* specs) {
  if (key.rfind("spec/", 0) != 0) return absl::OkStatus();  // not ours to read
  auto spec = std::make_shared<DatasetSpec>();
  if (!spec->ParseFromString(bytes)) return absl::DataLossError("not a DatasetSpec");
  if (SpecKey(spec->name()) != key) {
    return absl::DataLossError("holds the spec of dataset '" + spec->name() + "'");
  }
  (*specs)[key] = std::move(spec);
  return absl::OkStatus();
}

ShardingSnapshot ShardingState::ToSnapshot() const {
  JournalSnapshot js = ToJournalSnapshot();
  ShardingSnapshot& snap = js.snapshot;
  snap.clear_format();
  for (DatasetState& d : *snap.mutable_datasets()) {
    *d.mutable_spec() = *js.specs.at(d.spec_key());
    d.clear_spec_key();
  }
  return std::move(snap);
}

ShardingState::JournalSnapshot ShardingState::ToJournalSnapshot() const {
  JournalSnapshot js;
  ShardingSnapshot& snap = js.snapshot;
  snap.set_format(kSnapshotFormatSpecsApart);
  snap.set_seq(last_seq_);
  snap.set_next_lease_id(next_lease_id_);
  snap.set_next_token(next_token_);
  snap.set_next_incarnation(next_incarnation_);
  for (const auto& [name, ds] : datasets_) {
    DatasetState* out = snap.add_datasets();
    const std::string key = SpecKey(name);
    out->set_spec_key(key);
    js.specs.emplace(key, ds.spec);
    out->set_next_epoch(ds.next_epoch);
    out->set_completed_epochs(ds.completed_epochs);
    out->set_tail_backup(ds.tail_backup);
    out->set_failed(ds.failed);
    out->set_failure(ds.failure);
    out->set_records_done_total(ds.records_done_total);
    out->set_requeues_total(ds.requeues_total);
    for (const auto& q : ds.quarantined) *out->add_quarantined() = q;
    for (const auto& ep : ds.open) {
      EpochState* e = out->add_open_epochs();
      e->set_epoch(ep.epoch);
      for (const auto& d : ep.partitions) PartitionToProto(d, e->add_partitions());
    }
  }
  for (const auto& [id, l] : leases_) {
    LeaseState* out = snap.add_leases();
    out->set_lease_id(l.id);
    out->set_fencing_token(l.token);
    out->set_worker_id(l.worker);
    out->set_dataset(l.dataset);
    out->set_epoch(l.epoch);
    out->set_partition(l.partition);
    out->set_begin(l.begin);
    out->set_end(l.end);
    out->set_records_done(l.done);
    out->set_attempts(l.attempts);
    out->set_partner(l.partner);
    out->set_backup(l.backup);
    out->set_created_ms(l.created_ms);
    out->set_progress_ms(l.progress_ms);
    out->set_incarnation(l.incarnation);
    out->set_request_id(l.request_id);
  }
  for (const auto& [id, w] : workers_) {
    WorkerState* out = snap.add_workers();
    out->set_worker_id(w.id);
    out->set_incarnation(w.incarnation);
    out->set_node(w.node);
    out->set_weight(w.weight);
    out->set_shard_size(w.shard_size);
    out->set_max_leases(w.max_leases);
    out->set_lost(w.lost);
    for (const auto& [lease_id, e] : w.ended) *out->add_recent_ended() = e;
  }
  for (const auto& [tag, cp] : checkpoints_) *snap.add_checkpoints() = cp;
  return js;
}

absl::StatusOr<ShardingState> ShardingState::FromSnapshot(const ShardingSnapshot& snap,
                                                          const SpecsByKey& specs) {
  if (snap.format() != 0 && snap.format() != kSnapshotFormatSpecsApart) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot format ", snap.format(), " is unknown to this pacerd (it reads 0 and ",
        kSnapshotFormatSpecsApart, "; was it written by a newer pacerd?)"));
  }
  const bool apart = snap.format() == kSnapshotFormatSpecsApart;
  ShardingState st;
  st.last_seq_ = snap.seq();
  st.next_lease_id_ = snap.next_lease_id();
  st.next_token_ = snap.next_token();
  st.next_incarnation_ = snap.next_incarnation();
  for (const auto& in : snap.datasets()) {
    Dataset ds;
    if (apart) {
      auto it = specs.find(in.spec_key());
      if (in.has_spec() || it == specs.end()) {
        return absl::DataLossError("snapshot: the spec '" + in.spec_key() +
                                   "' it names is not among the journal's pinned entries");
      }
      // Shared, not copied; validated (NormalizeSpec: a temporary copy, at load only).
      if (auto s = NormalizeSpec(*it->second); !s.ok()) {
        return absl::DataLossError("snapshot: " + std::string(s.status().message()));
      }
      ds.spec = it->second;
    } else {
      auto spec = NormalizeSpec(in.spec());
      if (!spec.ok()) return absl::DataLossError("snapshot: " + std::string(spec.status().message()));
      ds.spec = std::make_shared<const DatasetSpec>(*std::move(spec));
    }
    ds.records_per_epoch = RecordsPerEpoch(*ds.spec);
    ds.next_epoch = in.next_epoch();
    ds.completed_epochs = in.completed_epochs();
    ds.tail_backup = in.tail_backup();
    ds.failed = in.failed();
    ds.failure = in.failure();
    ds.records_done_total = in.records_done_total();
    ds.requeues_total = in.requeues_total();
    ds.quarantined.assign(in.quarantined().begin(), in.quarantined().end());
    for (const auto& q : ds.quarantined) ds.records_quarantined_total += q.end() - q.begin();
    for (const auto& e : in.open_epochs()) {
      Epoch ep;
      ep.epoch = e.epoch();
      for (const auto& d : e.partitions()) {
        ep.partitions.push_back(PartitionFromProto(d, /*keep_attempts=*/true));
      }
      ds.open.push_back(std::move(ep));
    }
    ds.held_bytes = HeldBytes(*ds.spec);
    st.datasets_.emplace(ds.spec->name(), std::move(ds));
  }
  for (const auto& in : snap.workers()) {
    WorkerRec w;
    w.id = in.worker_id();
    w.incarnation = in.incarnation();
    w.node = in.node();
    w.weight = in.weight();
    w.shard_size = in.shard_size();
    w.max_leases = in.max_leases();
    w.lost = in.lost();
    auto [wit, added] = st.workers_.emplace(in.worker_id(), std::move(w));
    if (!added) continue;  // a duplicate worker: the first one counts (as before)
    for (const auto& e : in.recent_ended()) {
      EndedLease kept = e;
      // A v2 snapshot names no incarnation: those leases were the current incarnation's or
      // earlier, which is all a registration reply needs to know.
      if (kept.incarnation() == 0) kept.set_incarnation(wit->second.incarnation);
      st.AddEnded(wit->second, std::move(kept));
    }
  }
  // A snapshot written before ended leases were bounded over the job (up to 4 096 per worker)
  // is brought within the bound here, each worker's oldest first, in worker order; one written
  // since is within it already and loads unchanged (TrimEnded drops nothing).
  for (auto& [id, w] : st.workers_) st.TrimEnded(w);
  for (const auto& in : snap.leases()) {
    LeaseRec l;
    l.id = in.lease_id();
    l.token = in.fencing_token();
    l.worker = in.worker_id();
    l.dataset = in.dataset();
    l.epoch = in.epoch();
    l.partition = in.partition();
    l.begin = in.begin();
    l.end = in.end();
    l.done = in.records_done();
    l.attempts = in.attempts();
    l.partner = in.partner();
    l.backup = in.backup();
    l.created_ms = in.created_ms();
    l.progress_ms = in.progress_ms();
    l.incarnation = in.incarnation();
    l.request_id = in.request_id();
    auto dit = st.datasets_.find(l.dataset);
    auto wit = st.workers_.find(l.worker);
    if (dit == st.datasets_.end() || wit == st.workers_.end() || l.begin > l.end ||
        l.done > l.end - l.begin) {
      return absl::DataLossError(absl::StrCat("snapshot: lease ", l.id, " is inconsistent"));
    }
    Epoch* ep = st.FindEpoch(dit->second, l.epoch);
    if (ep == nullptr || l.partition >= ep->partitions.size()) {
      return absl::DataLossError(absl::StrCat("snapshot: lease ", l.id, " in a closed epoch"));
    }
    ep->active_leases++;
    if (!l.backup) ep->unconsumed_held += l.unconsumed();
    if (l.incarnation == 0) l.incarnation = wit->second.incarnation;  // a v2 snapshot
    wit->second.leases.insert(l.id);
    st.leases_.emplace(l.id, std::move(l));
  }
  for (const auto& cp : snap.checkpoints()) st.checkpoints_[cp.tag()] = cp;
  return st;
}

}  // namespace pacer
