#include "sim/in_process_control_plane.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "controller/reconciler.h"

namespace pacer::sim {

absl::StatusOr<std::unique_ptr<InProcessControlPlane>> InProcessControlPlane::Create(
    const PolicyConfig& policy, const MonitorOptions& monitor, ControlPlaneJob job, int64_t start_ms) {
  std::unique_ptr<InProcessControlPlane> cp(new InProcessControlPlane(policy, std::move(job), start_ms));
  absl::StatusOr<std::unique_ptr<MonitorState>> m = MonitorState::Create(monitor, &cp->clock_);
  if (!m.ok()) return m.status();
  cp->monitor_ = std::move(*m);
  absl::StatusOr<std::unique_ptr<Controller>> c = Controller::Create(policy);
  if (!c.ok()) return c.status();
  cp->controller_ = std::move(*c);
  return cp;
}

void InProcessControlPlane::SetTime(double t) {
  t_ = t;
  const int64_t ns = static_cast<int64_t>(std::llround(t * 1e9));
  if (ns > clock_ns_) {
    clock_.AdvanceNs(ns - clock_ns_);
    clock_ns_ = ns;
  }
}

absl::Status InProcessControlPlane::Apply(Update u) {
  ++updates_;
  absl::StatusOr<ApplyEffects> effects = state_.Commit(&u, clock_.NowMs());
  if (!effects.ok()) {
    return absl::InternalError(absl::StrCat("sharding state refused an update: ", effects.status().message()));
  }
  return absl::OkStatus();
}

absl::Status InProcessControlPlane::Start(const DatasetSpec& spec) {
  Update ds;
  *ds.mutable_register_dataset()->mutable_spec() = spec;
  return Apply(std::move(ds));
}

absl::StatusOr<uint64_t> InProcessControlPlane::RegisterWorker(const std::string& id,
                                                               const std::string& node,
                                                               uint32_t* monitor_index) {
  Update u;
  u.mutable_register_worker()->set_worker_id(id);
  u.mutable_register_worker()->set_node(node);
  if (absl::Status s = Apply(std::move(u)); !s.ok()) return s;
  const uint64_t incarnation = state_.FindWorker(id)->incarnation;
  if (absl::Status s = monitor_->RegisterWorker(id, node); !s.ok()) return s;
  *monitor_index = *monitor_->WorkerIndex(id);
  return incarnation;
}

absl::Status InProcessControlPlane::WorkerDown(const std::string& id) {
  Update u;
  u.mutable_worker_lost()->set_worker_id(id);
  return Apply(std::move(u));
}

absl::StatusOr<std::optional<LeaseGrant>> InProcessControlPlane::Fetch(const std::string& id, uint64_t) {
  // Decided as the service decides: the update records the outcome.
  absl::StatusOr<FetchDecision> decision =
      state_.DecideFetch(id, job_.dataset, /*request_id=*/0, rates_.empty() ? nullptr : &rates_);
  if (!decision.ok()) return absl::InternalError(absl::StrCat("DecideFetch: ", decision.status().message()));
  if (!decision->update) return std::nullopt;  // WAIT or END_OF_DATA
  if (absl::Status s = Apply(std::move(*decision->update)); !s.ok()) return s;
  const ShardingState::LeaseRec* l = state_.FindLease(state_.last_lease_id());
  LeaseGrant g;
  g.id = l->id;
  g.token = l->token;
  g.lease_begin = l->begin;
  g.begin = l->begin + l->done;
  g.end = l->end;
  g.backup = l->backup;
  g.partner = l->backup ? l->partner : 0;
  lease_start_[id] = t_;
  return g;
}

absl::StatusOr<AckOutcome> InProcessControlPlane::Acknowledge(const std::string& id, uint64_t incarnation,
                                                              const LeaseGrant& lease,
                                                              uint64_t records_done, bool complete,
                                                              bool may_be_fenced) {
  // Only a lease in a tail-backup pair can be fenced behind the worker's back (its partner
  // completed first); every other lease ends only through this worker, so the service's
  // token check (a std::map lookup per report) is needed only for pairs.
  const ShardingState::LeaseRec* l = state_.FindLease(lease.id);
  if ((may_be_fenced || l == nullptr) &&
      !state_.CheckLease(id, incarnation, lease.id, lease.token).ok()) {
    return AckOutcome::kFenced;
  }
  Update u;
  if (complete) {
    u.mutable_end_lease()->set_lease_id(lease.id);
    u.mutable_end_lease()->set_reason(LEASE_COMPLETED);
    u.mutable_end_lease()->set_records_done(records_done);
  } else {
    u.mutable_progress()->set_lease_id(lease.id);
    u.mutable_progress()->set_records_done(records_done);
  }
  // A dead partner's count was inherited: nothing new to report (a real SDK's report would be
  // a no-op).
  if (!complete && l->done > records_done) return AckOutcome::kCounted;
  if (absl::Status s = Apply(std::move(u)); !s.ok()) return s;
  if (complete) shard_times_.Add(t_ - lease_start_[id]);
  return AckOutcome::kCounted;
}

absl::Status InProcessControlPlane::Release(const std::string&, uint64_t, const LeaseGrant& lease,
                                            uint64_t records_done) {
  const ShardingState::LeaseRec* l = state_.FindLease(lease.id);
  Update u;
  u.mutable_end_lease()->set_lease_id(lease.id);
  u.mutable_end_lease()->set_reason(LEASE_RELEASED);
  u.mutable_end_lease()->set_records_done(std::max(l->done, records_done));
  return Apply(std::move(u));
}

absl::Status InProcessControlPlane::CloseWindows() {
  std::vector<ClassificationEvent> events;
  monitor_->AdvanceWindows(&events);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Action>> InProcessControlPlane::Reconcile(const ModelFacts& facts) {
  // The view is built by the code pacerd's Reconciler runs (controller/view_builder.h), from
  // the same kinds of inputs: the monitor's statuses, what the agents, heartbeats and the
  // sharding state know per worker (here: the model's report), and the job's facts.
  ViewInputs in;
  in.now_ms = clock_.NowMs();
  in.window_ms = static_cast<int64_t>(std::llround(policy_.detection.window_s * 1000));
  in.hot_threshold = policy_.server.hot_threshold;
  monitor_->Workers(&worker_statuses_, /*with_evidence=*/false);  // the view reads no evidence
  in.workers = std::move(worker_statuses_);
  in.servers = monitor_->Servers();
  in.nodes = monitor_->Nodes(/*with_evidence=*/false);
  // OldestLeaseAges (sharding_state.h: what pacerd's sharding service reports per worker), the
  // same ages in a hashed map reused across reconciles instead of a std::map built afresh.
  lease_ages_.clear();
  for (const auto& [id, lease] : state_.leases()) {
    const double age = static_cast<double>(in.now_ms - lease.created_ms) / 1000.0;
    auto [it, added] = lease_ages_.emplace(lease.worker, age);
    if (!added) it->second = std::max(it->second, age);
  }
  const auto& lease_ages = lease_ages_;
  for (const WorkerReport& w : facts.workers) {
    WorkerFacts& f = in.facts[w.id];
    f.restarting = w.down;
    f.max_local_batch = w.max_local_batch;
    f.honors_exclusion = w.honors_exclusion;
    if (auto a = lease_ages.find(w.id); a != lease_ages.end()) f.shard_elapsed_s = a->second;
    f.node = w.node;
  }
  JobFacts& j = in.job;
  j.mode = job_.mode;
  j.global_batch = job_.global_batch;
  j.current_step = facts.current_step;
  j.heartbeat_interval_s = job_.heartbeat_interval_s;
  j.progress_interval_s = job_.progress_interval_s;
  j.restart_cost_s = job_.restart_cost_s;
  j.migrate_cost_s = job_.migrate_cost_s;
  j.typical_shard_time_s = shard_times_.Median();
  const ShardingState::Dataset* ds = state_.FindDataset(job_.dataset);
  DatasetProgress d;
  d.records_per_epoch = ds->spec->num_records();
  d.num_epochs = 1;
  d.records_done_current_epoch = ds->records_done_total;
  d.finished = d.records_done_current_epoch >= d.records_per_epoch;
  j.datasets.push_back(d);
  const ClusterView view = BuildClusterView(in);
  worker_statuses_ = std::move(in.workers);  // kept for the next reconcile
  absl::StatusOr<ReconcileResult> r = controller_->Reconcile(view);
  if (!r.ok()) return absl::InternalError(absl::StrCat("controller refused the view: ", r.status().message()));
  NotePlans(r->dispatch);
  return std::move(r->dispatch);
}

absl::StatusOr<std::vector<Action>> InProcessControlPlane::DecideBursts(
    const std::vector<StepTiming>& timings, int64_t decide_ms, const ModelFacts&) {
  controller_->ObserveSteps(timings);
  absl::StatusOr<ReconcileResult> r = controller_->DecideBursts(decide_ms);
  if (!r.ok()) return absl::InternalError(absl::StrCat("burst rule: ", r.status().message()));
  NotePlans(r->dispatch);
  return std::move(r->dispatch);
}

void InProcessControlPlane::NotePlans(const std::vector<Action>& actions) {
  for (const Action& a : actions) {
    if (a.kind != ActionKind::kAdjustBatch || !a.plan) continue;
    for (const WorkerBatch& w : a.plan->workers) rates_.Set(w.worker_id, static_cast<double>(w.samples));
  }
}

absl::Status InProcessControlPlane::Reallocate(const Action& a, uint64_t shard_size) {
  for (const auto& al : a.allocations) {
    if (!state_.FindWorker(al.worker_id)) continue;
    Update u;
    auto* s = u.mutable_set_allocation();
    s->set_worker_id(al.worker_id);
    s->set_weight(al.weight > 0 ? al.weight : 1.0);
    s->set_shard_size(std::max<uint64_t>(
        1, static_cast<uint64_t>(std::llround(al.shard_scale * static_cast<double>(shard_size)))));
    if (absl::Status st = Apply(std::move(u)); !st.ok()) return st;
  }
  if (a.tail_backups) {
    Update u;
    u.mutable_set_tail_backup()->set_dataset(job_.dataset);
    u.mutable_set_tail_backup()->set_enabled(*a.tail_backups);
    if (absl::Status st = Apply(std::move(u)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::vector<Decision> InProcessControlPlane::Decisions() const {
  std::vector<Decision> out;
  for (const AuditRecord& r : controller_->history().audit()) {
    if (r.outcome == AuditRecord::Outcome::kPolicy) continue;
    Decision d;
    d.time_ms = r.time_ms;
    d.outcome = AuditOutcomeName(r.outcome);
    d.kind = ActionKindName(r.action.kind);
    d.target = r.action.target;
    d.detail = DescribeAction(r.action);
    d.reason = r.action.reason;
    d.veto_reason = r.veto_reason;
    d.predicted_gain = r.action.predicted_gain;
    d.repeats = r.repeats;
    d.rolled_back = r.rolled_back;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace pacer::sim
