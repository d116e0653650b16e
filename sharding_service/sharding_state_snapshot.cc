// ShardingState <-> ShardingSnapshot (the journal's snapshots). Repeated fields come out sorted
// by key (the state's maps are ordered), so equal states serialize to equal bytes.
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
  for (const auto& r : d.requeue()) {
    dom.requeue.push_back(Pending{r.begin(), r.end(), keep_attempts ? r.attempts() : 0});
  }
  return dom;
}

ShardingSnapshot ShardingState::ToSnapshot() const {
  ShardingSnapshot snap;
  snap.set_seq(last_seq_);
  snap.set_next_lease_id(next_lease_id_);
  snap.set_next_token(next_token_);
  snap.set_next_incarnation(next_incarnation_);
  for (const auto& [name, ds] : datasets_) {
    DatasetState* out = snap.add_datasets();
    *out->mutable_spec() = ds.spec;
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
  return snap;
}

absl::StatusOr<ShardingState> ShardingState::FromSnapshot(const ShardingSnapshot& snap) {
  ShardingState st;
  st.last_seq_ = snap.seq();
  st.next_lease_id_ = snap.next_lease_id();
  st.next_token_ = snap.next_token();
  st.next_incarnation_ = snap.next_incarnation();
  for (const auto& in : snap.datasets()) {
    auto spec = NormalizeSpec(in.spec());
    if (!spec.ok()) return absl::DataLossError("snapshot: " + std::string(spec.status().message()));
    Dataset ds;
    ds.spec = *spec;
    ds.records_per_epoch = RecordsPerEpoch(ds.spec);
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
    st.datasets_.emplace(ds.spec.name(), std::move(ds));
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
    for (const auto& e : in.recent_ended()) {
      EndedLease& kept = w.ended[e.lease_id()] = e;
      // A v2 snapshot names no incarnation: those leases were the current incarnation's or
      // earlier, which is all a registration reply needs to know.
      if (kept.incarnation() == 0) kept.set_incarnation(w.incarnation);
    }
    st.workers_.emplace(w.id, std::move(w));
  }
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
    if (l.incarnation == 0) l.incarnation = wit->second.incarnation;  // a v2 snapshot
    wit->second.leases.insert(l.id);
    st.leases_.emplace(l.id, std::move(l));
  }
  for (const auto& cp : snap.checkpoints()) st.checkpoints_[cp.tag()] = cp;
  // Which remembered leases are stream leases (kept to a bound).
  for (auto& [id, w] : st.workers_) {
    for (const auto& [lease_id, e] : w.ended) {
      auto dit = st.datasets_.find(e.dataset());
      if (dit != st.datasets_.end() && dit->second.is_stream()) w.stream_ended.insert(lease_id);
    }
  }
  return st;
}

}  // namespace pacer
