#include "controller/reconciler.h"

#include <algorithm>
#include <future>
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
namespace {

// Calls an async sharding method and waits for its reply (the housekeeping thread only).
template <typename Req, typename Resp, typename Method>
absl::Status CallSharding(ShardingServiceImpl* s, Method method, const Req& req, Resp* resp) {
  std::promise<absl::Status> p;
  auto f = p.get_future();
  (s->*method)(req, resp, [&p](absl::Status st) { p.set_value(st); });
  return f.get();
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

}  // namespace

MonitorOptions MonitorOptionsFromPolicy(const DetectionConfig& d, MonitorOptions base) {
  base.straggler_threshold = d.straggler_threshold;
  base.leader_threshold = d.leader_threshold;
  base.window_ms = static_cast<int64_t>(d.window_s * 1000);
  base.persistent_k = static_cast<uint32_t>(d.persistent_windows);
  base.persistent_w = static_cast<uint32_t>(d.history_windows);
  return base;
}

Reconciler::Reconciler(std::unique_ptr<Controller> controller, MonitorServiceImpl* monitor,
                       ShardingServiceImpl* sharding, const Clock* clock,
                       ReconcilerOptions options)
    : clock_(clock),
      monitor_(monitor),
      sharding_(sharding),
      options_(options),
      controller_(std::move(controller)),
      runs_(options.run_gap_ms > 0
                ? options.run_gap_ms
                : std::max<int64_t>(2'000, static_cast<int64_t>(5'000 * options.heartbeat_interval_s))) {}

void Reconciler::SetAgentDispatcher(AgentDispatcher dispatcher) {
  absl::MutexLock l(&mu_);
  agents_ = std::move(dispatcher);
}

void Reconciler::OnRegister(const RegisterWorkerRequest& req) {
  absl::MutexLock l(&mu_);
  if (auto why = runs_.OnRegister(req.worker_id(), req.run_id(), clock_->NowMs())) {
    StartRunLocked(*why);
  }
}

std::pair<uint64_t, int64_t> Reconciler::Run() const {
  absl::MutexLock l(&mu_);
  return {runs_.generation(), runs_.CurrentStep(clock_->NowMs())};
}

void Reconciler::StartRunLocked(const std::string& why) {
  plan_commands_.clear();
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

void Reconciler::OnHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp) {
  absl::MutexLock l(&mu_);
  if (auto why = runs_.OnStep(req.worker_id(), static_cast<int64_t>(req.step()), clock_->NowMs())) {
    StartRunLocked(*why);
  }
  honors_exclusion_[req.worker_id()] = req.honors_exclusion();
  if (req.honors_exclusion() && exclusion_version_ > req.exclusion_version()) {
    WorkerCommand* cmd = resp->add_commands();
    cmd->set_command_id(exclusion_version_);
    cmd->mutable_exclusion()->set_version(exclusion_version_);
    cmd->mutable_exclusion()->set_excluded(excluded_.count(req.worker_id()) > 0);
  }
  auto it = plan_commands_.find(req.worker_id());
  if (it == plan_commands_.end() || req.plan_version() >= it->second.version()) return;
  WorkerCommand* cmd = resp->add_commands();
  cmd->set_command_id(it->second.version());
  *cmd->mutable_batch_plan() = it->second;
}

std::optional<BatchPlanCommand> Reconciler::PlanFor(const std::string& worker) const {
  absl::MutexLock l(&mu_);
  auto it = plan_commands_.find(worker);
  if (it == plan_commands_.end()) return std::nullopt;
  return it->second;
}

std::pair<uint64_t, std::vector<std::string>> Reconciler::Exclusion() const {
  absl::MutexLock l(&mu_);
  return {exclusion_version_, std::vector<std::string>(excluded_.begin(), excluded_.end())};
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

absl::Status Reconciler::ReconcileNow() {
  poked_ = false;
  // Inputs gathered outside mu_ (the sharding call waits for its journal).
  ListWorkersResponse workers;
  if (absl::Status s = monitor_->ListWorkers(ListWorkersRequest(), &workers); !s.ok()) return s;
  ListDatasetsResponse datasets;
  if (absl::Status s = CallSharding(sharding_, &ShardingServiceImpl::ListDatasets,
                                    ListDatasetsRequest(), &datasets);
      !s.ok()) {
    return s;
  }

  std::vector<Action> to_dispatch;
  std::vector<std::pair<uint64_t, Action>> remote;  // sharding / agent actions, by audit id
  // REALLOCATE: workers that had an allocation the action drops, by audit id.
  std::map<uint64_t, std::vector<std::string>> reset;
  {
    absl::MutexLock l(&mu_);
    const int64_t now = clock_->NowMs();
    last_reconcile_ms_ = now;
    ClusterView v;
    v.now_ms = now;
    v.job.mode = options_.mode;
    v.job.current_step = runs_.CurrentStep(now);
    v.job.last_plan_version = last_plan_version_;
    v.job.heartbeat_interval_s = options_.heartbeat_interval_s;
    // Exclusion needs every live worker's trainer to carry it out (decided below, per worker).
    bool all_honor = true;
    int live = 0;
    v.job.restart_cost_s = options_.restart_cost_s;
    v.job.migrate_cost_s = options_.migrate_cost_s;
    std::vector<double> walls;
    int64_t batch_sum = 0;
    double throughput = 0;
    const int64_t stale_ms = 3 * std::max<int64_t>(workers.window_ms(), 1);
    for (const auto& w : workers.workers()) {
      WorkerView wv;
      wv.id = w.id();
      wv.node = w.node();
      // Only reports of the current run count: a worker last heard in an earlier run is gone.
      wv.alive = w.reports() > 0 && now - w.last_report_ms() <= stale_ms &&
                 w.last_report_ms() >= runs_.started_ms();
      wv.speed = w.smoothed_speed() > 0 ? w.smoothed_speed() : w.speed();
      wv.last_window_speed = w.speed();
      wv.relative_speed = w.relative_speed() > 0 ? w.relative_speed() : 1.0;
      const auto& c = w.classification();
      wv.straggler = c.worker_class() == WORKER_CLASS_STRAGGLER;
      wv.leader = c.worker_class() == WORKER_CLASS_LEADER;
      wv.persistent = c.persistence() == PERSISTENCE_PERSISTENT;
      wv.contention = c.cause() == CAUSE_CONTENTION;
      wv.level = !wv.straggler                    ? SlowLevel::kNone
                 : c.scope() == SCOPE_NODE        ? SlowLevel::kNode
                 : c.scope() == SCOPE_SERVER      ? SlowLevel::kServer
                                                  : SlowLevel::kWorker;
      wv.confidence = c.confidence();
      wv.local_batch = w.local_batch();
      wv.step_fixed_s = w.model_fixed_s();
      wv.step_per_sample_s = w.model_per_sample_s();
      if (wv.alive) {
        ++live;
        auto h = honors_exclusion_.find(w.id());
        all_honor = all_honor && h != honors_exclusion_.end() && h->second;
        batch_sum += w.local_batch();
        if (w.wall_s() > 0) walls.push_back(w.wall_s());
      }
      v.workers.push_back(std::move(wv));
    }
    if (!walls.empty()) {
      std::nth_element(walls.begin(), walls.begin() + walls.size() / 2, walls.end());
      v.job.step_time_s = walls[walls.size() / 2];
      throughput = static_cast<double>(batch_sum) / v.job.step_time_s;
    }
    v.job.throughput = throughput;
    v.job.can_exclude_workers = live > 0 && all_honor;
    const auto& plan = controller_->history().plan();
    v.job.global_batch = plan ? plan->global_batch : batch_sum;
    for (const auto& n : workers.nodes()) {
      NodeView nv;
      nv.name = n.node();
      nv.slow = n.workers() > 0 && n.stragglers() == n.workers();
      nv.contention = n.contention_score() >= 1.0;
      nv.cpu_steal = n.last_metrics().cpu_steal_frac();
      v.nodes.push_back(std::move(nv));
    }
    for (const auto& s : workers.servers()) {
      ServerView sv;
      sv.id = s.id();
      sv.node = s.node();
      sv.latency_ms = s.latency_ms();
      sv.relative_latency = s.relative_speed() > 0 ? 1.0 / s.relative_speed() : 1.0;
      sv.hot = s.classification().worker_class() == WORKER_CLASS_STRAGGLER;
      sv.persistent = s.classification().persistence() == PERSISTENCE_PERSISTENT;
      v.servers.push_back(std::move(sv));
    }
    int64_t remaining = 0;
    for (const auto& d : datasets.datasets()) {
      if (d.spec().num_epochs() == 0 || d.records_per_epoch() == 0) continue;
      const int64_t total = static_cast<int64_t>(d.records_per_epoch() * d.spec().num_epochs());
      const int64_t done = static_cast<int64_t>(d.completed_epochs() * d.records_per_epoch() +
                                                (d.finished() ? 0 : d.records_done_current_epoch()));
      remaining += std::max<int64_t>(0, total - done);
      if (v.job.epoch_progress == 0 && !d.finished()) {
        v.job.epoch_progress =
            static_cast<double>(d.records_done_current_epoch()) / d.records_per_epoch();
      }
    }
    v.job.remaining_samples = remaining;

    // The allocation in force before this reconcile: a REALLOCATE that leaves a worker out of
    // its list (a rollback to "no allocation", a worker no longer live) must reset that worker
    // in the sharding service, which otherwise keeps its old shard scale.
    std::vector<WorkerAllocation> in_force = controller_->history().allocations();
    auto result = controller_->Reconcile(v);
    if (!result.ok()) return result.status();
    // Decisions are durable before they are carried out (a restarted pacerd knows them).
    PersistLocked();
    for (Action& a : result->dispatch) {
      switch (a.kind) {
        case ActionKind::kAdjustBatch:
          if (a.plan) DispatchPlan(*a.plan);
          NoteDispatchLocked(a.id, "plan sent in heartbeat replies");
          break;
        case ActionKind::kExcludeWorkers:
          excluded_ = std::set<std::string>(a.excluded_workers.begin(), a.excluded_workers.end());
          exclusion_version_ = a.id;
          NoteDispatchLocked(a.id, excluded_.empty()
                                       ? "sent in heartbeat replies: every worker counted"
                                       : absl::StrCat("sent in heartbeat replies: excluded ",
                                                      absl::StrJoin(excluded_, ",")));
          break;
        case ActionKind::kReallocate: {
          // Executed in order, each replaces the whole allocation (Controller::Execute).
          for (const auto& before : in_force) {
            const bool kept = std::any_of(
                a.allocations.begin(), a.allocations.end(),
                [&](const WorkerAllocation& al) { return al.worker_id == before.worker_id; });
            if (!kept) reset[a.id].push_back(before.worker_id);
          }
          in_force = a.allocations;
          remote.emplace_back(a.id, a);
          break;
        }
        default:
          remote.emplace_back(a.id, a);
          break;
      }
      PACER_LOG(INFO) << "controller: " << ActionKindName(a.kind) << " " << a.target << " — "
                      << a.reason << " (predicted gain " << a.predicted_gain << ")";
    }
  }
  // Dispatch to the sharding service and the agents outside mu_.
  for (auto& [id, a] : remote) {
    std::string note;
    if (a.kind == ActionKind::kReallocate) {
      int failed = 0;
      for (const auto& al : a.allocations) {
        SetAllocationRequest req;
        req.mutable_allocation()->set_worker_id(al.worker_id);
        req.mutable_allocation()->set_weight(std::clamp(al.shard_scale, 0.01, 1000.0));
        SetAllocationResponse resp;
        if (!CallSharding(sharding_, &ShardingServiceImpl::SetAllocation, req, &resp).ok()) ++failed;
      }
      // Back to the default (SetAllocationUpdate: weight 1, no absolute shard size, no lease
      // limit); a worker the sharding service no longer knows has nothing to reset.
      for (const auto& worker : reset[id]) {
        SetAllocationRequest req;
        req.mutable_allocation()->set_worker_id(worker);
        req.mutable_allocation()->set_weight(1.0);
        SetAllocationResponse resp;
        absl::Status s = CallSharding(sharding_, &ShardingServiceImpl::SetAllocation, req, &resp);
        if (!s.ok() && !absl::IsNotFound(s)) ++failed;
      }
      if (a.tail_backups) {
        for (const auto& d : datasets.datasets()) {
          SetTailBackupRequest req;
          req.set_dataset(d.spec().name());
          req.set_enabled(*a.tail_backups);
          SetTailBackupResponse resp;
          if (!CallSharding(sharding_, &ShardingServiceImpl::SetTailBackup, req, &resp).ok()) ++failed;
        }
      }
      note = failed ? absl::StrCat("sharding allocation: ", failed, " calls failed")
                    : "applied to the sharding service";
    } else {
      AgentDispatcher agents;
      {
        absl::MutexLock l(&mu_);
        agents = agents_;
      }
      if (!agents) {
        note = "not dispatched: no agent connected";
      } else {
        auto r = agents(a);
        note = r.ok() ? *r : absl::StrCat("agent dispatch failed: ", r.status().message());
      }
    }
    absl::MutexLock l(&mu_);
    NoteDispatchLocked(id, note);
  }
  absl::MutexLock l(&mu_);
  PersistLocked();
  return absl::OkStatus();
}

absl::Status Reconciler::ValidateAndNotify(const PolicyConfig& config) {
  // The controller validates too, but the listener must not see a policy it would refuse.
  if (absl::Status s = ValidatePolicyConfig(config); !s.ok()) return s;
  if (auto decide = FindPolicy(config.policy); !decide.ok()) return decide.status();
  return on_policy_ ? on_policy_(config) : absl::OkStatus();
}

void Reconciler::NoteDispatchLocked(uint64_t id, const std::string& note) {
  dispatch_notes_[id] = note;
  unsaved_.records.push_back(id);
}

void Reconciler::PersistLocked() {
  History::Changes c = controller_->mutable_history()->TakeChanges();
  unsaved_.records.insert(unsaved_.records.end(), c.records.begin(), c.records.end());
  unsaved_.state = unsaved_.state || c.state;
  if (!store_ || unsaved_.empty()) {
    if (!store_) unsaved_ = {};
    return;
  }
  std::sort(unsaved_.records.begin(), unsaved_.records.end());
  unsaved_.records.erase(std::unique(unsaved_.records.begin(), unsaved_.records.end()), unsaved_.records.end());
  if (absl::Status s = store_->Save(controller_->history(), unsaved_, dispatch_notes_); !s.ok()) {
    // Kept and retried at the next reconcile; the sharding journal shares the disk, so this
    // is loud.
    PACER_LOG(ERROR) << "controller decisions not persisted (retried at the next reconcile): " << s;
    return;
  }
  unsaved_ = {};
}

absl::Status Reconciler::AttachStore(std::unique_ptr<ControllerStore> store,
                                     const std::string& base_policy_yaml) {
  ASSIGN_OR_RETURN(ControllerStore::Loaded loaded, store->Load());
  absl::MutexLock l(&mu_);
  store_ = std::move(store);
  base_policy_digest_ = PolicyDigest(base_policy_yaml);
  if (loaded.empty) return absl::OkStatus();
  RestoreHistory(loaded, controller_->mutable_history());
  dispatch_notes_ = std::move(loaded.dispatch);
  // Versions only grow across runs: a plan withdrawn at a new run is in the audit trail.
  for (const AuditRecord& r : controller_->history().audit()) {
    if (r.action.plan) last_plan_version_ = std::max(last_plan_version_, r.action.plan->version);
  }
  if (const auto& plan = controller_->history().plan()) DispatchPlan(*plan);
  // The exclusion in force goes out again under the newest audit id: above any version a
  // worker may hold, or equal to it with the same state.
  bool excluded_before = !controller_->history().excluded_workers().empty();
  for (const AuditRecord& r : controller_->history().audit()) {
    excluded_before = excluded_before || r.action.kind == ActionKind::kExcludeWorkers;
  }
  if (excluded_before) {
    for (const AuditRecord& r : controller_->history().audit()) {
      exclusion_version_ = std::max(exclusion_version_, r.id);
    }
    const auto& ex = controller_->history().excluded_workers();
    excluded_ = std::set<std::string>(ex.begin(), ex.end());
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
  PersistLocked();
  return absl::OkStatus();
}

void Reconciler::DispatchPlan(const BatchPlan& plan) {
  last_plan_version_ = std::max(last_plan_version_, plan.version);
  for (const auto& w : plan.workers) {
    BatchPlanCommand cmd;
    cmd.set_version(plan.version);
    cmd.set_effective_step(static_cast<uint64_t>(std::max<int64_t>(0, plan.effective_step)));
    cmd.set_micro_batch(static_cast<uint32_t>(w.micro_batch));
    cmd.set_accumulation_steps(static_cast<uint32_t>(std::max<int64_t>(1, w.accumulation)));
    cmd.set_global_batch(static_cast<uint64_t>(plan.global_batch));
    cmd.set_samples(static_cast<uint64_t>(w.samples));
    plan_commands_[w.worker_id] = cmd;
  }
}

absl::Status Reconciler::ApplyPolicy(const std::string& yaml, const std::string& file_name,
                                     ApplyPolicyResponse* resp) {
  auto config = ParsePolicy(yaml, file_name);
  if (!config.ok()) return config.status();
  absl::MutexLock l(&mu_);
  if (absl::Status s = ValidateAndNotify(*config); !s.ok()) return s;
  if (absl::Status s = controller_->ApplyPolicy(*config, clock_->NowMs()); !s.ok()) return s;
  if (store_) {
    AppliedPolicy applied;
    applied.set_yaml(yaml);
    applied.set_file_name(file_name);
    applied.set_applied_ms(clock_->NowMs());
    applied.set_base_digest(base_policy_digest_);
    if (absl::Status s = store_->SavePolicy(applied); !s.ok()) {
      PACER_LOG(ERROR) << "applied policy not persisted (a restart goes back to --policy): " << s;
    }
  }
  PersistLocked();
  resp->set_policy_name(controller_->policy().name);
  resp->set_policy(controller_->policy().policy);
  PACER_LOG(INFO) << "policy applied: " << config->name << " (" << config->policy << ")";
  return absl::OkStatus();
}

void Reconciler::RecordOperatorEvent(const std::string& what) {
  absl::MutexLock l(&mu_);
  RecordOperatorEventLocked(what);
}

void Reconciler::RecordOperatorEventLocked(const std::string& what) {
  AuditRecord r;
  r.time_ms = clock_->NowMs();
  r.policy = "operator";
  r.outcome = AuditRecord::Outcome::kPolicy;  // not an action; listed as kind POLICY
  r.action.reason = what;
  controller_->mutable_history()->Record(std::move(r), controller_->policy().audit.max_records);
  PersistLocked();
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
