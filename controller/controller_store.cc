#include "controller/controller_store.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/write_batch.h>

#include <cinttypes>
#include <cstdio>

#include "common/rocksdb_logger.h"

namespace pacer {
namespace {

constexpr char kAuditPrefix[] = "audit/";
constexpr char kStateKey[] = "state";
constexpr char kPolicyKey[] = "policy";

std::string AuditKey(uint64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%020" PRIu64, kAuditPrefix, id);
  return buf;
}

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

absl::StatusOr<std::unique_ptr<ControllerStore>> ControllerStore::Open(const std::string& dir,
                                                                      bool must_exist) {
  rocksdb::Options o;
  if (must_exist && !rocksdb::Env::Default()->FileExists(dir + "/CURRENT").ok()) {
    return absl::DataLossError("controller store: '" + dir +
                               "/CURRENT' is missing, but the data dir's IDENTITY says the store "
                               "was created: its audit trail and plan history would be lost");
  }
  o.create_if_missing = !must_exist;
  o.paranoid_checks = true;
  // Damage is refused, not rolled back to a point in time (docs/journal-integrity.md).
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kAbsoluteConsistency;
  o.track_and_verify_wals_in_manifest = true;
  o.info_log_level = rocksdb::WARN_LEVEL;
  // No LOG file on the data disk: a full disk made its writer abort pacerd (rocksdb_logger.h).
  o.info_log = std::make_shared<RocksDbLogger>("controller store");
  o.keep_log_file_num = 2;
  o.max_background_jobs = 1;
  o.write_buffer_size = 4 << 20;
  if (!must_exist) (void)rocksdb::Env::Default()->CreateDirIfMissing(dir);  // no ERROR line
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status st = rocksdb::DB::Open(o, dir, &raw);
  if (!st.ok() && (st.IsPathNotFound() || st.IsInvalidArgument() ||
                   st.ToString().find("No such file") != std::string::npos)) {
    return absl::DataLossError("controller store: the RocksDB database in '" + dir +
                               "' is damaged or incomplete: " + st.ToString());
  }
  if (absl::Status s = FromRocks(st, "cannot open RocksDB in '" + dir + "'"); !s.ok()) return s;
  return std::unique_ptr<ControllerStore>(new ControllerStore(std::unique_ptr<rocksdb::DB>(raw)));
}

ControllerStore::ControllerStore(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}

ControllerStore::~ControllerStore() = default;

absl::StatusOr<ControllerStore::Loaded> ControllerStore::Load() const {
  Loaded out;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  for (it->Seek(kAuditPrefix); it->Valid() && it->key().starts_with(kAuditPrefix); it->Next()) {
    AuditState p;
    if (!p.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("controller store: record '" + it->key().ToString() + "' does not parse");
    }
    auto r = AuditFromProto(p);
    if (!r.ok()) {
      return absl::DataLossError("controller store: record '" + it->key().ToString() +
                                 "': " + std::string(r.status().message()));
    }
    if (!p.dispatch().empty()) out.dispatch[r->id] = p.dispatch();
    out.audit.push_back(std::move(*r));
    out.empty = false;
  }
  if (absl::Status s = FromRocks(it->status(), "reading the audit"); !s.ok()) return s;
  std::string value;
  rocksdb::Status st = db_->Get(ro, kStateKey, &value);
  if (st.ok()) {
    if (!out.state.ParseFromString(value)) return absl::DataLossError("controller store: state does not parse");
    out.empty = false;
  } else if (!st.IsNotFound()) {
    return FromRocks(st, "reading the state");
  }
  st = db_->Get(ro, kPolicyKey, &value);
  if (st.ok()) {
    AppliedPolicy p;
    if (!p.ParseFromString(value)) return absl::DataLossError("controller store: policy does not parse");
    out.policy = std::move(p);
    out.empty = false;
  } else if (!st.IsNotFound()) {
    return FromRocks(st, "reading the policy");
  }
  return out;
}

absl::Status ControllerStore::Save(const History& history, const History::Changes& changes,
                                   const std::map<uint64_t, std::string>& dispatch) {
  if (changes.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (uint64_t id : changes.records) {
    const AuditRecord* r = history.FindRecord(id);
    if (r == nullptr) continue;  // already dropped (max_records)
    AuditState p = AuditToProto(*r);
    if (auto d = dispatch.find(id); d != dispatch.end()) p.set_dispatch(d->second);
    batch.Put(AuditKey(id), p.SerializeAsString());
  }
  if (changes.state) {
    ControllerState s;
    s.set_next_audit_id(history.next_id());
    if (history.plan()) *s.mutable_plan() = PlanToProto(*history.plan());
    AllocationsToProto(history.allocations(), s.mutable_allocations());
    s.set_tail_backups(history.tail_backups());
    for (const auto& w : history.excluded_workers()) s.add_excluded(w);
    for (const auto& [node, n] : history.nodes()) {
      ControllerState::Node& pn = (*s.mutable_nodes())[node];
      pn.set_incidents(n.incidents);
      pn.set_last_ms(n.last_ms);
    }
    batch.Put(kStateKey, s.SerializeAsString());
    // Records the history no longer keeps.
    const uint64_t oldest = history.audit().empty() ? history.next_id() : history.audit().front().id;
    batch.DeleteRange(AuditKey(0), AuditKey(oldest));
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Write(wo, &batch), "write");
}

absl::Status ControllerStore::SavePolicy(const AppliedPolicy& policy) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Put(wo, kPolicyKey, policy.SerializeAsString()), "write the policy");
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
