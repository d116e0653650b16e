#include "controller/controller_store.h"

#include <google/protobuf/util/message_differencer.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/write_batch.h>

#include <cinttypes>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "controller/controller.h"

namespace pacer {
namespace {

constexpr char kAuditPrefix[] = "audit/";

// Field by field: serialized bytes differ with a map's iteration order (PlanState.basis_share).
bool Same(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}
constexpr char kStateKey[] = "state";
constexpr char kPolicyKey[] = "policy";

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsCorruption()) return absl::DataLossError("controller store: " + what + ": " + s.ToString());
  return absl::UnavailableError("controller store: " + what + ": " + s.ToString());
}

bool ParseOutcome(const std::string& name, AuditRecord::Outcome* out) {
  for (auto o : {AuditRecord::Outcome::kExecuted, AuditRecord::Outcome::kDryRun,
                 AuditRecord::Outcome::kVetoed, AuditRecord::Outcome::kPolicy}) {
    if (name == AuditOutcomeName(o)) {
      *out = o;
      return true;
    }
  }
  return false;
}

void AllocationsToProto(const std::vector<WorkerAllocation>& in,
                        google::protobuf::RepeatedPtrField<AllocationState>* out) {
  for (const auto& a : in) {
    AllocationState* p = out->Add();
    p->set_worker_id(a.worker_id);
    p->set_weight(a.weight);
    p->set_shard_scale(a.shard_scale);
  }
}

std::vector<WorkerAllocation> AllocationsFromProto(
    const google::protobuf::RepeatedPtrField<AllocationState>& in) {
  std::vector<WorkerAllocation> out;
  for (const auto& p : in) out.push_back({p.worker_id(), p.weight(), p.shard_scale()});
  return out;
}

template <typename Repeated>
std::vector<std::string> Strings(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

ActionState ActionToProto(const Action& a) {
  ActionState p;
  p.set_id(a.id);
  p.set_kind(ActionKindName(a.kind));
  p.set_target(a.target);
  p.set_reason(a.reason);
  p.set_predicted_gain(a.predicted_gain);
  p.set_mandatory(a.mandatory);
  p.set_rollback_of(a.rollback_of);
  if (a.plan) *p.mutable_plan() = PlanToProto(*a.plan);
  AllocationsToProto(a.allocations, p.mutable_allocations());
  if (a.tail_backups) p.set_tail_backups(*a.tail_backups);
  p.set_node(a.node);
  for (const auto& n : a.avoid_nodes) p.add_avoid_nodes(n);
  for (const auto& w : a.excluded_workers) p.add_excluded_workers(w);
  p.set_cost_s(a.cost_s);
  p.set_saved_s(a.saved_s);
  return p;
}

absl::StatusOr<Action> ActionFromProto(const ActionState& p) {
  Action a;
  if (!ParseActionKind(p.kind(), &a.kind)) {
    return absl::InvalidArgumentError("unknown action kind '" + p.kind() + "'");
  }
  a.id = p.id();
  a.target = p.target();
  a.reason = p.reason();
  a.predicted_gain = p.predicted_gain();
  a.mandatory = p.mandatory();
  a.rollback_of = p.rollback_of();
  if (p.has_plan()) a.plan = PlanFromProto(p.plan());
  a.allocations = AllocationsFromProto(p.allocations());
  if (p.has_tail_backups()) a.tail_backups = p.tail_backups();
  a.node = p.node();
  a.avoid_nodes = Strings(p.avoid_nodes());
  a.excluded_workers = Strings(p.excluded_workers());
  a.cost_s = p.cost_s();
  a.saved_s = p.saved_s();
  return a;
}

}  // namespace

PlanState PlanToProto(const BatchPlan& plan) {
  PlanState p;
  p.set_version(plan.version);
  p.set_effective_step(plan.effective_step);
  p.set_global_batch(plan.global_batch);
  p.set_predicted_step_s(plan.predicted_step_s);
  for (const auto& w : plan.workers) {
    PlanState::Worker* pw = p.add_workers();
    pw->set_worker_id(w.worker_id);
    pw->set_samples(w.samples);
    pw->set_micro_batch(w.micro_batch);
    pw->set_accumulation(w.accumulation);
    pw->set_predicted_step_s(w.predicted_step_s);
  }
  for (const auto& [w, share] : plan.basis_share) (*p.mutable_basis_share())[w] = share;
  return p;
}

BatchPlan PlanFromProto(const PlanState& p) {
  BatchPlan plan;
  plan.version = p.version();
  plan.effective_step = p.effective_step();
  plan.global_batch = p.global_batch();
  plan.predicted_step_s = p.predicted_step_s();
  for (const auto& pw : p.workers()) {
    plan.workers.push_back(
        {pw.worker_id(), pw.samples(), pw.micro_batch(), pw.accumulation(), pw.predicted_step_s()});
  }
  for (const auto& [w, share] : p.basis_share()) plan.basis_share[w] = share;
  return plan;
}

AuditState AuditToProto(const AuditRecord& r) {
  AuditState p;
  p.set_id(r.id);
  p.set_time_ms(r.time_ms);
  p.set_last_seen_ms(r.last_seen_ms);
  p.set_repeats(r.repeats);
  p.set_policy(r.policy);
  p.set_outcome(AuditOutcomeName(r.outcome));
  p.set_veto_reason(r.veto_reason);
  p.set_inputs(r.inputs);
  *p.mutable_action() = ActionToProto(r.action);
  p.set_baseline_throughput(r.baseline_throughput);
  if (r.measured_gain) p.set_measured_gain(*r.measured_gain);
  p.set_measured_at_ms(r.measured_at_ms);
  p.set_rolled_back(r.rolled_back);
  if (r.previous_plan) *p.mutable_previous_plan() = PlanToProto(*r.previous_plan);
  AllocationsToProto(r.previous_allocations, p.mutable_previous_allocations());
  if (r.previous_tail_backups) p.set_previous_tail_backups(*r.previous_tail_backups);
  for (const auto& w : r.previous_excluded) p.add_previous_excluded(w);
  return p;
}

absl::StatusOr<AuditRecord> AuditFromProto(const AuditState& p) {
  AuditRecord r;
  if (!ParseOutcome(p.outcome(), &r.outcome)) {
    return absl::InvalidArgumentError("unknown audit outcome '" + p.outcome() + "'");
  }
  auto action = ActionFromProto(p.action());
  if (!action.ok()) return action.status();
  r.action = std::move(*action);
  r.id = p.id();
  r.time_ms = p.time_ms();
  r.last_seen_ms = p.last_seen_ms();
  r.repeats = p.repeats();
  r.policy = p.policy();
  r.veto_reason = p.veto_reason();
  r.inputs = p.inputs();
  r.baseline_throughput = p.baseline_throughput();
  if (p.has_measured_gain()) r.measured_gain = p.measured_gain();
  r.measured_at_ms = p.measured_at_ms();
  r.rolled_back = p.rolled_back();
  if (p.has_previous_plan()) r.previous_plan = PlanFromProto(p.previous_plan());
  r.previous_allocations = AllocationsFromProto(p.previous_allocations());
  if (p.has_previous_tail_backups()) r.previous_tail_backups = p.previous_tail_backups();
  r.previous_excluded = Strings(p.previous_excluded());
  return r;
}

namespace {

// ---- The store before the journal (format v0), imported on open ----
// v0 layout: "audit/<20-digit id>" -> AuditState (with its dispatch note), "state" ->
// ControllerState, "policy" -> AppliedPolicy, each Save one synced WriteBatch. Kept only to read
// such a folder once (ImportStoreV0); nothing writes it any more.
absl::StatusOr<std::optional<LegacyImport>> ImportStoreV0(rocksdb::DB& db) {
  ControllerSnapshot snap;
  snap.set_seq(1);
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(ro));
  size_t keys = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++keys;
  if (absl::Status s = FromRocks(it->status(), "reading the v0 store"); !s.ok()) return s;
  for (it->Seek(kAuditPrefix); it->Valid() && it->key().starts_with(kAuditPrefix); it->Next()) {
    AuditState* p = snap.add_records();
    if (!p->ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("controller store: record '" + it->key().ToString() + "' does not parse");
    }
    if (auto r = AuditFromProto(*p); !r.ok()) {
      return absl::DataLossError("controller store: record '" + it->key().ToString() +
                                 "': " + std::string(r.status().message()));
    }
  }
  if (absl::Status s = FromRocks(it->status(), "reading the audit"); !s.ok()) return s;
  size_t known = static_cast<size_t>(snap.records_size());
  std::string value;
  rocksdb::Status st = db.Get(ro, kStateKey, &value);
  if (st.ok()) {
    if (!snap.mutable_state()->ParseFromString(value)) {
      return absl::DataLossError("controller store: state does not parse");
    }
    for (const auto& w : snap.state().excluded()) snap.mutable_exclusion()->add_excluded(w);
    ++known;
  } else if (!st.IsNotFound()) {
    return FromRocks(st, "reading the state");
  }
  st = db.Get(ro, kPolicyKey, &value);
  if (st.ok()) {
    if (!snap.mutable_policy()->ParseFromString(value)) {
      return absl::DataLossError("controller store: policy does not parse");
    }
    ++known;
  } else if (!st.IsNotFound()) {
    return FromRocks(st, "reading the policy");
  }
  if (known != keys) return std::optional<LegacyImport>();  // something else: not a v0 store
  if (auto check = ControllerDurableState::FromSnapshot(snap); !check.ok()) {
    return absl::DataLossError("controller store: " + std::string(check.status().message()));
  }
  LegacyImport out;
  out.snapshot = snap.SerializeAsString();
  out.delete_keys = {kStateKey, kPolicyKey};
  out.delete_ranges = {{kAuditPrefix, "audit0"}};  // '0' follows '/'
  out.what = absl::StrCat("controller store v0 (", snap.records_size(), " audit records",
                          snap.state().has_plan() ? ", a plan" : "", snap.has_policy() ? ", a policy" : "",
                          ")");
  return std::optional<LegacyImport>(std::move(out));
}

// Rebuilds the durable state from the journal, at open and after a failed write: the
// snapshot's state, then each later update applied in order (`replayed` counts them).
struct Rebuild {
  ControllerDurableState& state;
  uint64_t replayed = 0;
  auto FromSnapshot() {
    return [this](const ControllerSnapshot& snap) -> absl::Status {
      ASSIGN_OR_RETURN(state, ControllerDurableState::FromSnapshot(snap));
      return absl::OkStatus();
    };
  }
  auto Replay() {
    return [this](const ControllerUpdate& u) {
      ++replayed;
      return state.ApplyChecked(u);
    };
  }
};

}  // namespace

ExclusionState ExclusionInForce(const History& history, const ExclusionState& before) {
  ExclusionState e;
  for (const auto& w : history.excluded_workers()) e.add_excluded(w);
  const auto& audit = history.audit();
  for (auto it = audit.rbegin(); it != audit.rend(); ++it) {
    if (it->outcome != AuditRecord::Outcome::kExecuted || it->action.kind != ActionKind::kExcludeWorkers)
      continue;
    e.set_version(it->id);
    e.set_reason(it->action.reason);
    e.set_step_rule(DecidedByStepRule(*it));
    return e;
  }
  e.set_version(before.version());
  e.set_reason(before.reason());
  e.set_step_rule(before.step_rule());
  return e;
}

absl::StatusOr<std::unique_ptr<ControllerStore>> ControllerStore::Open(const std::string& dir,
                                                                      bool must_exist,
                                                                      bool accept_data_loss) {
  JournalOptions o;
  o.dir = dir;
  o.must_exist = must_exist;
  o.accept_data_loss = accept_data_loss;
  o.import_legacy = ImportStoreV0;
  std::unique_ptr<ControllerStore> store(new ControllerStore());
  ControllerDurableState& state = store->state_;
  Rebuild rebuild{state};
  auto journal = ControllerJournal::Open(o, rebuild.FromSnapshot(), rebuild.Replay());
  if (!journal.ok()) return journal.status();
  store->journal_ = std::move(*journal);
  store->snapshot_seq_ = state.last_seq() - rebuild.replayed;
  if (!store->journal_->recovery().imported.empty()) {
    PACER_LOG(WARNING) << "controller store '" << dir << "' migrated to " << kControllerJournalFormat
                       << ": " << store->journal_->recovery().imported;
  }
  return store;
}

ControllerStore::~ControllerStore() = default;

absl::StatusOr<ControllerStore::Loaded> ControllerStore::Load() const {
  Loaded out;
  out.empty = state_.empty();
  for (const auto& [id, p] : state_.records()) {
    auto r = AuditFromProto(p);
    if (!r.ok()) return absl::DataLossError(absl::StrCat("controller store: record ", id, ": ", r.status().message()));
    out.audit.push_back(std::move(*r));
  }
  out.dispatch = state_.dispatch();
  ControllerState& s = out.state;
  s.set_next_audit_id(state_.next_audit_id());
  if (state_.plan()) *s.mutable_plan() = *state_.plan();
  for (const auto& a : state_.allocations()) *s.add_allocations() = a;
  s.set_tail_backups(state_.tail_backups());
  for (const auto& w : state_.exclusion().excluded()) s.add_excluded(w);
  for (const auto& [node, n] : state_.nodes()) {
    ControllerState::Node& pn = (*s.mutable_nodes())[node];
    pn.set_incidents(n.incidents);
    pn.set_last_ms(n.last_ms);
  }
  out.exclusion = state_.exclusion();
  out.policy = state_.policy();
  return out;
}

absl::Status ControllerStore::RecoverIfFailed() {
  if (journal_->health().ok()) return absl::OkStatus();
  ControllerDurableState state;
  Rebuild rebuild{state};
  absl::Status s = journal_->Recover(rebuild.FromSnapshot(), rebuild.Replay());
  if (!s.ok()) return s;
  // What was applied here but never written is journaled again by the next Save (the
  // Reconciler keeps the changes a failed Save named).
  state_ = std::move(state);
  snapshot_seq_ = state_.last_seq() - rebuild.replayed;
  return absl::OkStatus();
}

absl::Status ControllerStore::Commit(std::vector<ControllerUpdate> updates) {
  if (updates.empty()) return absl::OkStatus();
  for (ControllerUpdate& u : updates) {
    u.set_seq(state_.last_seq() + 1);
    if (absl::Status s = state_.Validate(u); !s.ok()) {
      return absl::InternalError(absl::StrCat("controller store: an update would not apply: ", s.message()));
    }
    state_.Apply(u);
  }
  journal_->AppendAll(updates);
  if (state_.last_seq() - snapshot_seq_ >= kSnapshotEvery) {
    journal_->WriteSnapshot(state_.ToSnapshot());
    snapshot_seq_ = state_.last_seq();
  }
  return journal_->Flush();
}

absl::Status ControllerStore::Save(const History& history, const History::Changes& changes,
                                   const std::map<uint64_t, std::string>& dispatch) {
  if (changes.empty()) return absl::OkStatus();
  if (absl::Status s = RecoverIfFailed(); !s.ok()) return s;
  // Each update is the difference between what the history holds and what the durable state
  // holds, in the order Apply needs (records before their notes, trims after both).
  std::vector<ControllerUpdate> updates;
  std::set<uint64_t> recorded;
  for (uint64_t id : changes.records) {
    const AuditRecord* r = history.FindRecord(id);
    if (r == nullptr) continue;  // already dropped (max_records)
    AuditState p = AuditToProto(*r);
    auto held = state_.records().find(id);
    if (held == state_.records().end() || !Same(held->second, p)) {
      *updates.emplace_back().mutable_record() = std::move(p);
    }
    recorded.insert(id);
  }
  for (uint64_t id : recorded) {
    auto d = dispatch.find(id);
    if (d == dispatch.end()) continue;
    auto held = state_.dispatch().find(id);
    if (held != state_.dispatch().end() && held->second == d->second) continue;
    DispatchNote* n = updates.emplace_back().mutable_dispatch();
    n->set_id(id);
    n->set_note(d->second);
  }
  if (changes.state) {
    if (history.next_id() > state_.next_audit_id()) {
      updates.emplace_back().mutable_next_audit_id()->set_next_id(history.next_id());
    }
    std::optional<PlanState> plan;
    if (history.plan()) plan = PlanToProto(*history.plan());
    if (plan.has_value() != state_.plan().has_value() ||
        (plan && !Same(*plan, *state_.plan()))) {
      PlanInForce* p = updates.emplace_back().mutable_plan();
      if (plan) *p->mutable_plan() = std::move(*plan);
    }
    AllocationsInForce alloc;
    AllocationsToProto(history.allocations(), alloc.mutable_allocations());
    alloc.set_tail_backups(history.tail_backups());
    AllocationsInForce held;
    for (const auto& a : state_.allocations()) *held.add_allocations() = a;
    held.set_tail_backups(state_.tail_backups());
    if (!Same(alloc, held)) {
      *updates.emplace_back().mutable_allocations() = std::move(alloc);
    }
    const ExclusionState exclusion = ExclusionInForce(history, state_.exclusion());
    if (!Same(exclusion, state_.exclusion())) {
      *updates.emplace_back().mutable_exclusion() = exclusion;
    }
    for (const auto& [node, n] : history.nodes()) {
      auto h = state_.nodes().find(node);
      if (h != state_.nodes().end() && h->second.incidents == n.incidents && h->second.last_ms == n.last_ms)
        continue;
      NodeIncidents* p = updates.emplace_back().mutable_node();
      p->set_node(node);
      p->set_incidents(n.incidents);
      p->set_last_ms(n.last_ms);
    }
    // Records the history no longer keeps.
    const uint64_t oldest = history.audit().empty() ? history.next_id() : history.audit().front().id;
    if (!state_.records().empty() && state_.records().begin()->first < oldest) {
      updates.emplace_back().mutable_audit_trim()->set_oldest_id(oldest);
    }
  }
  return Commit(std::move(updates));
}

absl::Status ControllerStore::SavePolicy(const AppliedPolicy& policy) {
  if (absl::Status s = RecoverIfFailed(); !s.ok()) return s;
  std::vector<ControllerUpdate> updates(1);
  *updates[0].mutable_policy() = policy;
  return Commit(std::move(updates));
}

void RestoreHistory(const ControllerStore::Loaded& loaded, History* history) {
  const ControllerState& s = loaded.state;
  std::optional<BatchPlan> plan;
  if (s.has_plan()) plan = PlanFromProto(s.plan());
  std::map<std::string, History::NodeRecord> nodes;
  for (const auto& [node, n] : s.nodes()) nodes[node] = {n.incidents(), n.last_ms()};
  history->Restore(loaded.audit, s.next_audit_id(), std::move(plan), AllocationsFromProto(s.allocations()),
                   s.tail_backups(), Strings(s.excluded()), std::move(nodes));
}

}  // namespace pacer
