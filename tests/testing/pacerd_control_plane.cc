#include "tests/testing/pacerd_control_plane.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "proto/pacer/agent.pb.h"

namespace pacer::testing {

PacerdControlPlane::PacerdControlPlane(const std::string& policy_file, const sim::ControlPlaneJob& job,
                                       int64_t start_ms)
    : job_(job), start_ms_(start_ms) {
  HarnessOptions o;
  o.policy = policy_file;
  o.start_ms = start_ms;
  o.reconcile_interval_ms = 1;  // due at every housekeeping step: the model says when
  o.adjust = [this](PacerdOptions& p) {
    p.sharding.sync = false;  // the journal's fsync is not what this test is about
    p.sharding.heartbeat_interval_ms = static_cast<int64_t>(std::llround(job_.heartbeat_interval_s * 1000));
    p.reconciler.mode = job_.mode;
    p.reconciler.restart_cost_s = job_.restart_cost_s;
    p.reconciler.migrate_cost_s = job_.migrate_cost_s;
    p.also_carry = this;
  };
  harness_ = std::make_unique<PacerdHarness>(std::move(o));
  if (harness_->ok()) {
    // The burst rule's timings come through DecideBursts (see the header).
    harness_->pacerd().monitor()->SetStepObserver(nullptr);
  }
}

PacerdControlPlane::~PacerdControlPlane() { harness_.reset(); }

void PacerdControlPlane::Note(const absl::Status& s, const std::string& what) {
  if (!s.ok()) errors_.push_back(absl::StrCat(what, ": ", s.ToString()));
}

absl::Status PacerdControlPlane::Start(const DatasetSpec& spec) {
  Sync();
  RegisterDatasetRequest req;
  *req.mutable_spec() = spec;
  RegisterDatasetResponse resp;
  records_total_ = spec.num_records() * std::max<uint32_t>(1, spec.num_epochs());
  return CallAndWait(*harness_->pacerd().sharding(), &ShardingServiceImpl::RegisterDataset, req, &resp);
}

void PacerdControlPlane::SetTime(double t) {
  target_ns_ = std::max(target_ns_, static_cast<int64_t>(std::llround(t * 1e9)));
}

void PacerdControlPlane::AdvanceTo(int64_t ns) {
  if (ns > clock_ns_) {
    harness_->sim_clock().AdvanceNs(ns - clock_ns_);
    clock_ns_ = ns;
  }
  const int64_t now = harness_->clock()->NowMs();
  if (now >= next_heartbeat_ms_) {
    // The workers' and agents' once-a-second heartbeats (they keep leases and sessions alive).
    HeartbeatRound();
    for (const auto& [node, ids] : node_workers_) AgentHeartbeat(node, nullptr);
    next_heartbeat_ms_ = (now / 1000 + 1) * 1000;
  }
}

void PacerdControlPlane::HeartbeatRound() {
  for (auto& [id, w] : workers_) {
    if (w.down) continue;
    HeartbeatRequest req;
    req.set_worker_id(id);
    req.set_incarnation(w.incarnation);
    req.set_step(static_cast<uint64_t>(std::max<int64_t>(0, step_)));
    req.set_plan_version(w.plan_version);
    req.set_exclusion_version(w.exclusion_version);
    req.set_honors_exclusion(w.honors_exclusion);
    req.set_max_local_batch(static_cast<uint32_t>(std::max<int64_t>(0, w.max_local_batch)));
    HeartbeatResponse resp;
    absl::Status s = CallAndWait(*harness_->pacerd().worker_sessions(), &WorkerSessionService::Heartbeat, req, &resp);
    Note(s, "heartbeat " + id);
    // The worker holds what the reply carried (the model carries the decision out itself).
    for (const WorkerCommand& c : resp.commands()) {
      if (c.has_batch_plan()) w.plan_version = std::max(w.plan_version, c.batch_plan().version());
      if (c.has_exclusion()) w.exclusion_version = std::max(w.exclusion_version, c.exclusion().version());
    }
  }
}

void PacerdControlPlane::AgentHeartbeat(const std::string& node, const NodeMetrics* metrics) {
  pacer::AgentHeartbeat req;
  req.set_node(node);
  req.set_agent_id("agent-" + node);
  req.set_incarnation(1);
  if (metrics) *req.mutable_node_metrics() = *metrics;
  for (const std::string& id : node_workers_[node]) {
    const Worker& w = workers_[id];
    WorkerProcess* p = req.add_workers();
    p->set_worker_id(id);
    p->set_pid(w.down ? 0 : 1000);
    p->set_state(w.down ? WORKER_STATE_BACKOFF : WORKER_STATE_RUNNING);
  }
  AgentHeartbeatReply reply;
  Note(harness_->pacerd().agents()->Heartbeat(req, &reply), "agent heartbeat " + node);
}

absl::StatusOr<uint64_t> PacerdControlPlane::RegisterWorker(const std::string& id, const std::string& node,
                                                            uint32_t* monitor_index) {
  Sync();
  RegisterWorkerRequest req;
  req.set_worker_id(id);
  req.set_node(node);
  RegisterWorkerResponse resp;
  if (absl::Status s = CallAndWait(*harness_->pacerd().worker_sessions(), &WorkerSessionService::RegisterWorker, req, &resp);
      !s.ok()) {
    return s;
  }
  MonitorRegisterRequest mreq;
  mreq.set_worker_id(id);
  mreq.set_node(node);
  MonitorRegisterResponse mresp;
  if (absl::Status s = harness_->pacerd().monitor()->RegisterWorker(mreq, &mresp); !s.ok()) return s;
  Worker& w = workers_[id];
  if (!w.node.empty() && w.node != node) {
    // Migrated: the old node's agent stopped the process and no longer supervises it (an agent
    // may claim a worker only once no live agent does).
    node_workers_[w.node].erase(id);
    AgentHeartbeat(w.node, nullptr);
  }
  w.node = node;
  w.incarnation = resp.incarnation();
  w.down = false;
  w.plan_version = w.exclusion_version = 0;  // a new process holds no command
  node_workers_[node].insert(id);
  AgentHeartbeat(node, nullptr);  // its agent sees the process running
  *monitor_index = 0;
  return resp.incarnation();
}

absl::Status PacerdControlPlane::WorkerDown(const std::string& id) {
  Sync();
  // The process is gone: no more heartbeats; its agent reports it relaunching. Its leases end
  // as pacerd ends them: at its next registration, or when they expire.
  Worker& w = workers_[id];
  w.down = true;
  AgentHeartbeat(w.node, nullptr);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<sim::LeaseGrant>> PacerdControlPlane::Fetch(const std::string& id,
                                                                         uint64_t incarnation) {
  Sync();
  FetchShardRequest req;
  req.set_worker_id(id);
  req.set_incarnation(incarnation);
  req.set_dataset(job_.dataset);
  FetchShardResponse resp;
  if (absl::Status s = CallAndWait(*harness_->pacerd().sharding(), &ShardingServiceImpl::FetchShard, req, &resp);
      !s.ok()) {
    return s;
  }
  if (resp.outcome() != FetchShardResponse::LEASED) return std::nullopt;
  const Lease& l = resp.lease();
  sim::LeaseGrant g;
  g.id = l.lease_id();
  g.token = l.fencing_token();
  g.lease_begin = l.begin();
  g.begin = l.begin() + l.records_done();
  g.end = l.end();
  g.backup = l.backup();
  if (l.backup()) {
    auto p = primary_of_shard_.find(l.shard_id());
    g.partner = p == primary_of_shard_.end() ? 0 : p->second;
  } else {
    primary_of_shard_[l.shard_id()] = l.lease_id();
  }
  return g;
}

void PacerdControlPlane::RefreshRecordsDone() {
  ListDatasetsRequest req;
  req.set_name(job_.dataset);
  ListDatasetsResponse resp;
  absl::Status s = CallAndWait(*harness_->pacerd().sharding(), &ShardingServiceImpl::ListDatasets, req, &resp);
  Note(s, "list datasets");
  for (const DatasetInfo& d : resp.datasets()) {
    records_done_ = d.finished() ? records_total_
                                 : d.completed_epochs() * d.records_per_epoch() + d.records_done_current_epoch();
  }
}

absl::StatusOr<sim::AckOutcome> PacerdControlPlane::Acknowledge(const std::string& id, uint64_t incarnation,
                                                                const sim::LeaseGrant& lease,
                                                                uint64_t records_done, bool complete, bool) {
  Sync();
  absl::Status s;
  if (complete) {
    CompleteShardRequest req;
    req.set_worker_id(id);
    req.set_incarnation(incarnation);
    req.set_lease_id(lease.id);
    req.set_fencing_token(lease.token);
    CompleteShardResponse resp;
    s = CallAndWait(*harness_->pacerd().sharding(), &ShardingServiceImpl::CompleteShard, req, &resp);
  } else {
    ProgressRequest req;
    req.set_worker_id(id);
    req.set_incarnation(incarnation);
    req.set_lease_id(lease.id);
    req.set_fencing_token(lease.token);
    req.set_records_done(records_done);
    ProgressResponse resp;
    s = CallAndWait(*harness_->pacerd().sharding(), &ShardingServiceImpl::ReportProgress, req, &resp);
  }
  if (absl::IsFailedPrecondition(s)) return sim::AckOutcome::kFenced;
  if (!s.ok()) return s;
  RefreshRecordsDone();
  return sim::AckOutcome::kCounted;
}

absl::Status PacerdControlPlane::Release(const std::string& id, uint64_t incarnation,
                                         const sim::LeaseGrant& lease, uint64_t records_done) {
  Sync();
  ReleaseShardRequest req;
  req.set_worker_id(id);
  req.set_incarnation(incarnation);
  req.set_lease_id(lease.id);
  req.set_fencing_token(lease.token);
  req.set_records_done(records_done);
  ReleaseShardResponse resp;
  absl::Status s = CallAndWait(*harness_->pacerd().sharding(), &ShardingServiceImpl::ReleaseShard, req, &resp);
  if (absl::IsFailedPrecondition(s)) return absl::OkStatus();  // ended meanwhile
  RefreshRecordsDone();
  return s;
}

void PacerdControlPlane::ReportStep(uint32_t, const std::string& id, const StepSample& r) {
  Sync();
  ReportStepsRequest req;
  StepReport* s = req.add_steps();
  s->set_worker_id(id);
  s->set_step(r.step);
  s->set_local_batch(r.local_batch);
  s->set_samples(r.samples);
  s->set_compute_s(r.compute_s);
  s->set_comm_s(r.comm_s);
  s->set_data_wait_s(r.data_wait_s);
  s->set_wall_s(r.wall_s);
  s->set_time_ms(r.time_ms);
  ReportStepsResponse resp;
  Note(harness_->pacerd().monitor()->ReportSteps(req, &resp), "report steps " + id);
  if (resp.rejected() > 0) errors_.push_back("step report of " + id + " rejected");
}

void PacerdControlPlane::ReportNode(const NodeMetrics& m) {
  Sync();
  AgentHeartbeat(m.node(), &m);
}

void PacerdControlPlane::ReportServerLatency(const ServerLatency& l) {
  Sync();
  ReportStepsRequest req;
  *req.add_server_latency() = l;
  ReportStepsResponse resp;
  Note(harness_->pacerd().monitor()->ReportSteps(req, &resp), "server latency " + l.server_id());
}

absl::Status PacerdControlPlane::CloseWindows() {
  Sync();
  harness_->pacerd().monitor()->Tick();
  return absl::OkStatus();
}

void PacerdControlPlane::Learn(const sim::ModelFacts& facts) {
  step_ = facts.current_step;
  for (const sim::WorkerReport& r : facts.workers) {
    auto it = workers_.find(r.id);
    if (it == workers_.end()) continue;
    it->second.honors_exclusion = r.honors_exclusion;
    it->second.max_local_batch = r.max_local_batch;
  }
  // What the decision reads is fresh: every live worker and every agent heard just now.
  HeartbeatRound();
  for (const auto& [node, ids] : node_workers_) AgentHeartbeat(node, nullptr);
}

std::vector<Action> PacerdControlPlane::TakeCarried() {
  std::vector<Action> out;
  out.swap(carried_);
  return out;
}

absl::StatusOr<std::vector<Action>> PacerdControlPlane::Reconcile(const sim::ModelFacts& facts) {
  Sync();
  Learn(facts);
  harness_->Housekeep();  // production's step: lease expiry, windows, bursts when due, reconcile
  return TakeCarried();
}

absl::StatusOr<std::vector<Action>> PacerdControlPlane::DecideBursts(const std::vector<StepTiming>& timings,
                                                                     int64_t decide_ms,
                                                                     const sim::ModelFacts& facts) {
  // The model's heartbeat is on the 1 s grid, at or just before the model's time: pacerd decides
  // then (its once-a-heartbeat gate sees the same spacing the model's heartbeats have).
  AdvanceTo(std::min(target_ns_, (decide_ms - start_ms_) * 1'000'000));
  Learn(facts);
  std::vector<StepReport> steps;
  steps.reserve(timings.size());
  for (const StepTiming& t : timings) {
    if (t.in_progress) {
      // A step still running at the heartbeat: what the SDK's heartbeat says of it
      // (HeartbeatRequest.step_timings), observed by the heartbeat path; the decision is taken
      // below on the model's grid (see the header).
      HeartbeatRequest hb;
      hb.set_worker_id(t.worker_id);
      HeartbeatStepTiming* h = hb.add_step_timings();
      h->set_step(static_cast<uint64_t>(t.step));
      h->set_compute_s(t.compute_s);
      h->set_samples(static_cast<uint64_t>(t.samples));
      h->set_wall_s(t.wall_s);
      h->set_in_progress(true);
      harness_->pacerd().reconciler()->OnHeartbeatSteps(hb, /*decide=*/false);
      continue;
    }
    StepReport r;
    r.set_worker_id(t.worker_id);
    r.set_step(static_cast<uint64_t>(t.step));
    r.set_compute_s(t.compute_s);
    r.set_samples(static_cast<uint64_t>(t.samples));
    r.set_wall_s(t.wall_s);
    r.set_time_ms(t.time_ms);
    steps.push_back(std::move(r));
  }
  harness_->pacerd().reconciler()->OnAcceptedSteps(steps);
  harness_->pacerd().reconciler()->MaybeDecideBursts();
  return TakeCarried();
}

std::vector<sim::Decision> PacerdControlPlane::Decisions() const {
  ListActionsRequest req;
  ListActionsResponse resp;
  harness_->pacerd().reconciler()->ListActions(req, &resp);
  std::vector<sim::Decision> out;
  for (auto it = resp.actions().rbegin(); it != resp.actions().rend(); ++it) {
    if (it->kind() == "POLICY") continue;
    sim::Decision d;
    d.time_ms = it->time_ms();
    d.outcome = it->outcome();
    d.kind = it->kind();
    d.target = it->target();
    d.detail = it->detail();
    d.reason = it->reason();
    d.veto_reason = it->veto_reason();
    d.predicted_gain = it->predicted_gain();
    d.repeats = it->repeats();
    d.rolled_back = it->rolled_back();
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace pacer::testing
