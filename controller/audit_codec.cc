// The controller's journal form of its types (history.h: PlanToProto, AuditToProto, ...).
#include "absl/strings/str_cat.h"
#include "controller/history.h"

namespace pacer {
namespace {
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
  p.set_relative_speed_before(a.relative_speed_before);
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
  a.relative_speed_before = p.relative_speed_before();
  return a;
}

}  // namespace

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

}  // namespace pacer
