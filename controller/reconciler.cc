#include "controller/reconciler.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "controller/policies/policy.h"
#include "controller/policy_loader.h"

namespace pacer {

std::string PolicyDigest(const std::string& yaml) {
  // FNV-1a 64: identifies the --policy file's text, not a security boundary.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : yaml) h = (h ^ c) * 1099511628211ull;
  return absl::StrFormat("%016x", h);
}
std::string DescribeAction(const Action& a) {
  std::string out;
  if (a.plan) {
    out = absl::StrFormat("plan v%d @step %d B=%d:", a.plan->version, a.plan->effective_step,
                          a.plan->global_batch);
    for (const auto& w : a.plan->workers) {
      absl::StrAppendFormat(&out, " %s=%dx%d", w.worker_id, w.micro_batch, w.accumulation);
    }
  }
  for (const auto& al : a.allocations) {
    absl::StrAppendFormat(&out, " %s(weight %.2f, shard x%.2f)", al.worker_id, al.weight,
                          al.shard_scale);
  }
  if (a.tail_backups) absl::StrAppend(&out, " tail_backups=", *a.tail_backups ? "on" : "off");
  if (!a.node.empty()) absl::StrAppend(&out, " node=", a.node);
  if (!a.avoid_nodes.empty()) {
    absl::StrAppend(&out, " avoid=");
    for (const auto& n : a.avoid_nodes) absl::StrAppend(&out, n, ",");
  }
  if (a.cost_s > 0 || a.saved_s > 0) {
    absl::StrAppendFormat(&out, " saves %.0fs for cost %.0fs", a.saved_s, a.cost_s);
  }
  return out;
}

Reconciler::Reconciler(std::unique_ptr<Controller> controller, ReconcilerParts parts,
                       const Clock* clock, ReconcilerOptions options)
    : clock_(clock),
      parts_(parts),
      options_(options),
      controller_(std::move(controller)),
      runs_(options.run_gap_ms > 0
                ? options.run_gap_ms
                : std::max<int64_t>(2'000, static_cast<int64_t>(5'000 * options.heartbeat_interval_s))) {}

void Reconciler::OnRegister(const RegisterWorkerRequest& req) {
  bool new_run = false;
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    if (auto why = runs_.OnRegister(req.worker_id(), req.run_id(), clock_->NowMs())) {
      StartRunLocked(*why);
      journaled = AppendLocked();
      new_run = true;
    }
  }
  if (new_run) {
    WaitDurable(journaled, "the new run's withdrawn plan");
    ForgetLastRunsSpeeds();
  }
}

void Reconciler::ForgetLastRunsSpeeds() {
  if (parts_.speeds != nullptr) parts_.speeds->ForgetWorkerHistories();
}

std::pair<uint64_t, int64_t> Reconciler::Run() const {
  absl::MutexLock l(&mu_);
  return {runs_.generation(), runs_.CurrentStep(clock_->NowMs())};
}

void Reconciler::StartRunLocked(const std::string& why) {
  parts_.sessions->WithdrawPlans();
  const auto& plan = controller_->history().plan();
  std::string what = absl::StrCat("run ", runs_.generation(),
                                  runs_.run_id().empty() ? "" : " ('" + runs_.run_id() + "')",
                                  " began: ", why);
  if (!plan) {
    PACER_LOG(INFO) << what;
    return;
  }
  // Its effective step counts the old run's steps: withdrawn, not re-sent. The workers of the
  // new run train on their own batches until the controller plans for this run, above every
  // version issued so far.
  last_plan_version_ = std::max(last_plan_version_, plan->version);
  absl::StrAppend(&what, "; batch plan v", plan->version, " @step ", plan->effective_step,
                  " of the previous run withdrawn");
  controller_->mutable_history()->ClearPlan();
  PACER_LOG(WARNING) << what;
  RecordOperatorEventLocked(what);
}

bool Reconciler::OnHeartbeat(const HeartbeatRequest& req) {
  bool new_run = false, in_run = true;
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    if (auto why = runs_.OnStep(req.worker_id(), static_cast<int64_t>(req.step()), clock_->NowMs())) {
      StartRunLocked(*why);
      journaled = AppendLocked();
      new_run = true;
    }
    in_run = runs_.InRun(req.worker_id());
  }
  if (new_run) {
    // Rare (a new run of the job): this reply waits for the journal, never the lock's holders.
    WaitDurable(journaled, "the new run's withdrawn plan");
    ForgetLastRunsSpeeds();
  }
  OnHeartbeatSteps(req);
  return in_run;
}

// A step timing (a StepReport or a heartbeat's HeartbeatStepTiming) as the burst rule reads it:
// stamped with its arrival, a probe when it is a step an excluded worker began after a
// heartbeat reply carried it the exclusion -- not any step of a worker decided excluded: until
// the reply reaches it, it trains (and once let back in, its step still running is a probe).
// `ended_ms`: when the step ended (0: not known), the sessions' lock, not ours.
template <typename Step>
StepTiming Reconciler::ArrivedTiming(const std::string& worker, const Step& s, int64_t arrived_ms,
                                     int64_t ended_ms) const {
  StepTiming t;
  t.worker_id = worker;
  t.step = static_cast<int64_t>(s.step());
  t.compute_s = s.compute_s();
  t.samples = static_cast<int64_t>(s.samples());
  t.time_ms = arrived_ms;
  t.wall_s = s.wall_s();
  const int64_t start_ms =
      ended_ms > 0 ? ended_ms - static_cast<int64_t>(std::llround(s.wall_s() * 1000)) : 0;
  t.probe = parts_.sessions->ProbeStep(worker, start_ms);
  return t;
}

bool Reconciler::OnHeartbeatSteps(const HeartbeatRequest& req, bool decide) {
  if (req.step_timings_size() == 0) return false;
  // The burst rule's evidence, stamped with its arrival; probes told as OnAcceptedSteps does
  // (the sessions' lock, not ours).
  std::vector<StepTiming> timings;
  const int64_t arrived = clock_->NowMs();
  timings.reserve(static_cast<size_t>(req.step_timings_size()));
  for (const HeartbeatStepTiming& h : req.step_timings()) {
    // A step still running began its wall time before the heartbeat.
    timings.push_back(ArrivedTiming(req.worker_id(), h, arrived, h.in_progress() ? arrived : h.time_ms()));
    timings.back().in_progress = h.in_progress();
  }
  std::vector<std::pair<Action, CarryContext>> to_carry;
  Pending decided;
  {
    absl::MutexLock l(&mu_);
    const int64_t now = clock_->NowMs();
    if (!controller_->ObserveHeartbeatSteps(timings, now) || !decide) return false;
    if (!RecoverLocked().ok()) return false;  // logged
    // Decided here, so that this heartbeat's reply carries it (a decision a heartbeat later
    // costs every step of that second the burst's pace). Decide is O(workers log workers); the
    // journal append is queued (no I/O under the lock).
    last_burst_decision_ms_ = now;
    absl::StatusOr<ReconcileResult> result = controller_->DecideBursts(now);
    if (!result.ok()) {
      PACER_LOG(WARNING) << "burst rule (heartbeat): " << result.status();
      return false;
    }
    decided = AppendLocked();
    for (Action& a : result->dispatch) {
      PACER_LOG(INFO) << "controller (step rule, heartbeat of " << req.worker_id()
                      << "): " << ActionKindName(a.kind) << " — " << a.reason;
      to_carry.emplace_back(std::move(a), CarryContext{controller_->history().allocations()});
    }
  }
  // A decision is durable before it is carried out (a restarted pacerd re-sends the exclusion
  // in force under its audit id): this reply waits for that append, outside the lock.
  if (to_carry.empty() || !WaitDurable(decided, "burst decisions (heartbeat)").ok()) return true;
  CarryOut(to_carry);
  return true;
}

double Reconciler::StepLineS(const std::string& worker_id) const {
  absl::MutexLock l(&mu_);
  return controller_->StepLineS(worker_id, clock_->NowMs());
}

bool Reconciler::MaybeReconcile() {
  {
    absl::MutexLock l(&mu_);
    const bool due = clock_->NowMs() - last_reconcile_ms_ >= options_.interval_ms;
    if (!due && !poked_) return false;
  }
  absl::Status s = ReconcileNow();
  if (!s.ok()) PACER_LOG(WARNING) << "reconcile: " << s;
  return true;
}

absl::StatusOr<ViewInputs> Reconciler::GatherInputs() {
  ViewInputs in;
  ListWorkersResponse workers;
  RETURN_IF_ERROR(parts_.speeds->ListWorkers(&workers));
  ListDatasetsResponse datasets;
  RETURN_IF_ERROR(parts_.leases->ListDatasets(&datasets));
  const LeaseFacts leases = parts_.leases->WorkerLeaseFacts();
  const auto reports = parts_.sessions->Reports();
  in.window_ms = std::max<int64_t>(workers.window_ms(), 1);
  in.workers.assign(workers.workers().begin(), workers.workers().end());
  in.nodes.assign(workers.nodes().begin(), workers.nodes().end());
  in.servers.assign(workers.servers().begin(), workers.servers().end());
  for (const WorkerStatus& w : in.workers) {
    WorkerFacts& f = in.facts[w.id()];
    if (auto r = reports.find(w.id()); r != reports.end()) {
      f.honors_exclusion = r->second.honors_exclusion;
      f.max_local_batch = r->second.max_local_batch;
    }
    if (auto a = leases.oldest_lease_age_s.find(w.id()); a != leases.oldest_lease_age_s.end()) {
      f.shard_elapsed_s = a->second;
    }
  }
  if (parts_.restarts) {
    for (const std::string& worker : parts_.restarts->RestartingWorkers()) {
      if (auto f = in.facts.find(worker); f != in.facts.end()) f->second.restarting = true;
    }
  }
  in.job.typical_shard_time_s = leases.typical_shard_time_s;
  for (const auto& d : datasets.datasets()) {
    DatasetProgress p;
    p.records_per_epoch = d.records_per_epoch();
    p.num_epochs = d.spec().num_epochs();
    p.completed_epochs = d.completed_epochs();
    p.records_done_current_epoch = d.records_done_current_epoch();
    p.finished = d.finished();
    in.job.datasets.push_back(p);
  }
  return in;
}

void Reconciler::FillJobFactsLocked(ViewInputs* in) {
  in->now_ms = clock_->NowMs();
  in->hot_threshold = controller_->policy().server.hot_threshold;
  JobFacts& j = in->job;
  j.mode = options_.mode;
  j.current_step = runs_.CurrentStep(in->now_ms);
  j.run_started_ms = runs_.started_ms();
  j.last_plan_version = last_plan_version_;
  j.heartbeat_interval_s = options_.heartbeat_interval_s;
  j.progress_interval_s = options_.heartbeat_interval_s;  // progress rides on heartbeats
  j.restart_cost_s = options_.restart_cost_s;
  j.migrate_cost_s = options_.migrate_cost_s;
  const auto& plan = controller_->history().plan();
  j.global_batch = plan ? plan->global_batch : 0;
}

absl::StatusOr<ClusterView> Reconciler::CurrentView() {
  ASSIGN_OR_RETURN(ViewInputs in, GatherInputs());
  absl::MutexLock l(&mu_);
  FillJobFactsLocked(&in);
  return BuildClusterView(in);
}

absl::Status Reconciler::ReconcileNow() {
  poked_ = false;
  // 1. Inputs, outside mu_ (the sharding call waits for its journal).
  ASSIGN_OR_RETURN(ViewInputs in, GatherInputs());
  std::vector<std::pair<Action, CarryContext>> to_carry;
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(RecoverLocked());
    last_reconcile_ms_ = clock_->NowMs();
    // 2. The view.
    FillJobFactsLocked(&in);
    const ClusterView view = BuildClusterView(in);
    // 3. Decide; journaled now, durable (waited for below, outside mu_) before anything is
    // carried out.
    std::vector<WorkerAllocation> in_force = controller_->history().allocations();
    auto result = controller_->Reconcile(view);
    if (!result.ok()) return result.status();
    journaled = AppendLocked();
    for (Action& a : result->dispatch) {
      if (a.kind == ActionKind::kAdjustBatch && a.plan) {
        last_plan_version_ = std::max(last_plan_version_, a.plan->version);
      }
      CarryContext c;
      c.allocation_before = in_force;
      if (a.kind == ActionKind::kReallocate) in_force = a.allocations;  // each replaces the whole
      PACER_LOG(INFO) << "controller: " << ActionKindName(a.kind) << " " << a.target << " — "
                      << a.reason << " (predicted gain " << a.predicted_gain << ")";
      to_carry.emplace_back(std::move(a), std::move(c));
    }
  }
  RETURN_IF_ERROR(WaitDurable(journaled, "decisions"));
  // 4. Carry out, in order, outside mu_.
  CarryOut(to_carry);
  return absl::OkStatus();
}

void Reconciler::CarryOut(const std::vector<std::pair<Action, CarryContext>>& actions) {
  for (const auto& [a, context] : actions) {
    absl::StatusOr<std::string> note =
        parts_.sink ? parts_.sink->Carry(a, context) : absl::StatusOr<std::string>("not carried out: no action sink");
    absl::MutexLock l(&mu_);
    NoteDispatchLocked(a.id, note.ok() ? *note : absl::StrCat("not carried out: ", note.status().message()));
    if (!note.ok()) PACER_LOG(ERROR) << "carrying out action " << a.id << ": " << note.status();
  }
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    journaled = AppendLocked();
  }
  WaitDurable(journaled, "dispatch notes").IgnoreError();  // logged; the next append retries
}

void Reconciler::OnAcceptedSteps(const std::vector<StepReport>& steps) {
  std::vector<StepTiming> timings;
  timings.reserve(steps.size());
  const int64_t now = clock_->NowMs();
  for (const StepReport& r : steps) timings.push_back(ArrivedTiming(r.worker_id(), r, now, r.time_ms()));
  absl::MutexLock l(&mu_);
  controller_->ObserveSteps(timings);
}

bool Reconciler::MaybeDecideBursts() {
  std::vector<std::pair<Action, CarryContext>> to_carry;
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    if (!RecoverLocked().ok()) return true;  // logged
    const int64_t now = clock_->NowMs();
    const int64_t every = std::max<int64_t>(1, static_cast<int64_t>(options_.heartbeat_interval_s * 1000));
    if (now - last_burst_decision_ms_ < every || !controller_->StepRuleActive(now)) return false;
    last_burst_decision_ms_ = now;
    auto result = controller_->DecideBursts(now);
    if (!result.ok()) {
      PACER_LOG(WARNING) << "burst rule: " << result.status();
      return true;
    }
    journaled = AppendLocked();
    for (Action& a : result->dispatch) {
      PACER_LOG(INFO) << "controller (step rule): " << ActionKindName(a.kind) << " — " << a.reason;
      to_carry.emplace_back(std::move(a), CarryContext{controller_->history().allocations()});
    }
  }
  if (!WaitDurable(journaled, "burst decisions").ok()) return true;
  CarryOut(to_carry);
  return true;
}

absl::Status Reconciler::ValidateAndNotify(const PolicyConfig& config) {
  // The controller validates too, but the listener must not see a policy it would refuse.
  if (absl::Status s = ValidatePolicyConfig(config); !s.ok()) return s;
  if (auto decide = FindPolicy(config.policy); !decide.ok()) return decide.status();
  return on_policy_ ? on_policy_(config) : absl::OkStatus();
}

void Reconciler::NoteDispatchLocked(uint64_t id, const std::string& note) {
  dispatch_notes_[id] = note;
  DispatchNote* n = outbox_.emplace_back().mutable_dispatch();
  n->set_id(id);
  n->set_note(note);
}

Reconciler::Pending Reconciler::AppendLocked() {
  std::vector<ControllerUpdate> updates = controller_->mutable_history()->TakeUpdates();
  for (ControllerUpdate& u : outbox_) updates.push_back(std::move(u));
  outbox_.clear();
  if (!store_) return {};
  // Without recovery a failed journal takes nothing: what was applied in memory is rebuilt from
  // the journal at the next RecoverLocked() (before the next decision).
  absl::StatusOr<uint64_t> seq = store_->Append(std::move(updates));
  if (!seq.ok()) return {store_.get(), 0, seq.status()};
  return {store_.get(), *seq, absl::OkStatus()};
}

absl::Status Reconciler::WaitDurable(const Pending& pending, const char* what) {
  absl::Status s = pending.status;
  if (s.ok() && pending.store != nullptr) s = pending.store->WaitDurable(pending.seq);
  if (!s.ok()) {
    PACER_LOG(ERROR) << "controller " << what
                     << " not journaled, so not carried out (the controller's memory is "
                        "rebuilt from its journal and it decides again): " << s;
  }
  return s;
}

absl::Status Reconciler::RecoverLocked() {
  if (!store_) return absl::OkStatus();
  absl::StatusOr<bool> recovered = store_->RecoverIfFailed();
  if (!recovered.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "controller journal failed and does not recover, no decision is made: ", recovered.status().message()));
  }
  if (!*recovered) return absl::OkStatus();
  RestoreHistory(store_->state(), controller_->mutable_history());
  controller_->mutable_history()->TakeUpdates();  // nothing to journal: it is the journal
  dispatch_notes_ = store_->state().dispatch();
  outbox_.clear();
  PACER_LOG(WARNING) << "controller journal recovered after a failed write: the controller's "
                        "memory is rebuilt from it (up to update " << store_->state().last_seq() << ")";
  return absl::OkStatus();
}

absl::Status Reconciler::AttachStore(std::unique_ptr<ControllerStore> store,
                                     const std::string& base_policy_yaml) {
  ASSIGN_OR_RETURN(ControllerStore::Loaded loaded, store->Load());
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    store_ = std::move(store);
    base_policy_digest_ = PolicyDigest(base_policy_yaml);
    // Drop what was decided before (nothing, in pacerd: attached before serving); from now on
    // every change of the History is journaled.
    controller_->mutable_history()->TakeUpdates();
    controller_->mutable_history()->set_journaled(true);
    if (loaded.empty) return absl::OkStatus();
    RestoreHistory(store_->state(), controller_->mutable_history());
    dispatch_notes_ = std::move(loaded.dispatch);
    // Versions only grow across runs: a plan withdrawn at a new run is in the audit trail.
    for (const AuditRecord& r : controller_->history().audit()) {
      if (r.action.plan) last_plan_version_ = std::max(last_plan_version_, r.action.plan->version);
    }
    if (const auto& plan = controller_->history().plan()) {
      last_plan_version_ = std::max(last_plan_version_, plan->version);
      parts_.sessions->SetPlan(*plan, "restored after a pacerd restart");
    }
    // The exclusion in force goes out again as it was decided: the deciding audit id (the newest
    // version any worker can hold) and its reason, held until the controller has seen the job
    // again (Controller::HoldRestoredExclusion).
    const ExclusionState& exclusion = loaded.exclusion;
    if (exclusion.version() > 0) {
      parts_.sessions->SetExclusion(
          exclusion.version(),
          std::set<std::string>(exclusion.excluded().begin(), exclusion.excluded().end()),
          exclusion.reason());
      if (exclusion.excluded_size() > 0) controller_->HoldRestoredExclusion(clock_->NowMs());
    }
    // A store migrated from before the journal knows who but not which decision: the newest
    // audit id is above any version a worker may hold, or equal to it with the same state.
    bool excluded_before = !controller_->history().excluded_workers().empty();
    for (const AuditRecord& r : controller_->history().audit()) {
      excluded_before = excluded_before || r.action.kind == ActionKind::kExcludeWorkers;
    }
    if (exclusion.version() == 0 && excluded_before) {
      if (!controller_->history().excluded_workers().empty()) {
        controller_->HoldRestoredExclusion(clock_->NowMs());
      }
      // The journal names the decision from now on.
      const ExclusionState named = NameExclusionInForce(controller_->history());
      if (named.version() != 0) {
        controller_->mutable_history()->SetExcluded(controller_->history().excluded_workers(),
                                                    named.version(), named.reason(), named.step_rule());
      }
      uint64_t version = 0;
      for (const AuditRecord& r : controller_->history().audit()) version = std::max(version, r.id);
      const auto& ex = controller_->history().excluded_workers();
      parts_.sessions->SetExclusion(version, std::set<std::string>(ex.begin(), ex.end()),
                                    "restored after a pacerd restart");
    }
    PACER_LOG(INFO) << "controller state restored: " << controller_->history().audit().size()
                    << " audit records, plan v"
                    << (controller_->history().plan() ? controller_->history().plan()->version : 0)
                    << ", " << controller_->history().nodes().size() << " node(s) with incidents";
    if (loaded.policy) {
      if (loaded.policy->base_digest() != base_policy_digest_) {
        PACER_LOG(WARNING) << "policy '" << loaded.policy->file_name()
                           << "' applied before the restart is not restored: pacerd was started "
                              "with a different --policy file since";
      } else {
        auto config = ParsePolicy(loaded.policy->yaml(), loaded.policy->file_name());
        if (!config.ok()) {
          PACER_LOG(WARNING) << "policy applied before the restart no longer loads, --policy stays: "
                             << config.status();
        } else if (absl::Status s = ValidateAndNotify(*config); !s.ok()) {
          PACER_LOG(WARNING) << "policy applied before the restart refused, --policy stays: " << s;
        } else if (absl::Status s = controller_->ApplyPolicy(*config, clock_->NowMs()); !s.ok()) {
          PACER_LOG(WARNING) << "policy applied before the restart refused, --policy stays: " << s;
        } else {
          PACER_LOG(INFO) << "policy '" << config->name << "' (" << loaded.policy->file_name()
                          << ", applied before the restart) restored";
        }
      }
    }
    journaled = AppendLocked();
  }
  return WaitDurable(journaled, "restored state");
}

absl::Status Reconciler::ApplyPolicy(const std::string& yaml, const std::string& file_name,
                                     ApplyPolicyResponse* resp) {
  auto config = ParsePolicy(yaml, file_name);
  if (!config.ok()) return config.status();
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(RecoverLocked());
    if (absl::Status s = ValidateAndNotify(*config); !s.ok()) return s;
    if (absl::Status s = controller_->ApplyPolicy(*config, clock_->NowMs()); !s.ok()) return s;
    AppliedPolicy* applied = outbox_.emplace_back().mutable_policy();
    applied->set_yaml(yaml);
    applied->set_file_name(file_name);
    applied->set_applied_ms(clock_->NowMs());
    applied->set_base_digest(base_policy_digest_);
    journaled = AppendLocked();
    resp->set_policy_name(controller_->policy().name);
    resp->set_policy(controller_->policy().policy);
  }
  if (absl::Status s = WaitDurable(journaled, "applied policy"); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("policy '", config->name,
                                               "' is in force but not journaled (a restart goes "
                                               "back to --policy): ", s.message()));
  }
  PACER_LOG(INFO) << "policy applied: " << config->name << " (" << config->policy << ")";
  return absl::OkStatus();
}

void Reconciler::RecordOperatorEvent(const std::string& what) {
  Pending journaled;
  {
    absl::MutexLock l(&mu_);
    RecordOperatorEventLocked(what);
    journaled = AppendLocked();
  }
  WaitDurable(journaled, "operator event").IgnoreError();  // logged
}

void Reconciler::RecordOperatorEventLocked(const std::string& what) {
  AuditRecord r;
  r.time_ms = clock_->NowMs();
  r.policy = "operator";
  r.outcome = AuditRecord::Outcome::kPolicy;  // not an action; listed as kind POLICY
  r.action.reason = what;
  controller_->mutable_history()->Record(std::move(r), controller_->policy().audit.max_records);
}

void Reconciler::ListActions(const ListActionsRequest& req, ListActionsResponse* resp) const {
  absl::MutexLock l(&mu_);
  const auto& audit = controller_->history().audit();
  resp->set_policy_name(controller_->policy().name);
  resp->set_policy(controller_->policy().policy);
  resp->set_dry_run(controller_->policy().dry_run);
  if (const auto& plan = controller_->history().plan()) resp->set_plan_version(plan->version);
  for (auto it = audit.rbegin(); it != audit.rend(); ++it) {
    if (req.limit() && resp->actions_size() >= static_cast<int>(req.limit())) break;
    ActionRecord* r = resp->add_actions();
    r->set_id(it->id);
    r->set_time_ms(it->time_ms);
    r->set_last_seen_ms(it->last_seen_ms);
    r->set_repeats(it->repeats);
    r->set_policy(it->policy);
    r->set_outcome(AuditOutcomeName(it->outcome));
    r->set_veto_reason(it->veto_reason);
    r->set_inputs(it->inputs);
    r->set_kind(it->outcome == AuditRecord::Outcome::kPolicy ? "POLICY"
                                                             : ActionKindName(it->action.kind));
    r->set_target(it->action.target);
    r->set_reason(it->action.reason);
    r->set_predicted_gain(it->action.predicted_gain);
    r->set_measured(it->measured_gain.has_value());
    r->set_measured_gain(it->measured_gain.value_or(0));
    r->set_rolled_back(it->rolled_back);
    r->set_detail(DescribeAction(it->action));
    if (auto n = dispatch_notes_.find(it->id); n != dispatch_notes_.end()) r->set_dispatch(n->second);
  }
}

}  // namespace pacer
