#include "sim/job_simulation.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <map>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "controller/action_sink.h"
#include "controller/batch_plan.h"
#include "controller/controller.h"
#include "sim/data_ledger.h"
#include "sim/in_process_control_plane.h"

namespace pacer::sim {

MonitorOptions MonitorOptionsForPolicy(const PolicyConfig& policy) {
  // pacerd's mapping (controller/view_builder.h), on a base that keeps ten windows of history
  // (every rule reads fewer: stable_smoothed_windows, the policy's history_windows), so
  // 4 096 workers × 6 policies stay small.
  MonitorOptions base;
  base.history_ms = std::max<int64_t>(10, policy.detection.history_windows) *
                    static_cast<int64_t>(std::llround(policy.detection.window_s * 1000));
  return MonitorOptionsFromPolicy(policy, base);
}

namespace {

// CPU seconds of the calling thread: a policy's own cost, whatever else the machine runs.
double ThreadCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}


// pacer-train-mlp's --probe-ms default: how often an excluded worker times a probe step.
constexpr double kProbeIntervalS = 2.0;
// How often a worker heartbeats (the SDK's default): step timings arrive with it, and the
// step path's decisions go out in its replies.
constexpr double kHeartbeatS = 1.0;
// pacer-train-mlp computes a micro-batch in this many slices while a step line is in force,
// checking the line between them (sim.trainer_deadline).
constexpr double kLineSlices = 4;

constexpr char kDataset[] = "train";
constexpr int64_t kStartMs = kSimStartMs;
constexpr double kServerLatencyMs = 5.0;
constexpr double kReportLeadS = 0.002;  // reports leave this long before a window ends

struct SimWorker {
  // The fields ChunkAsync / ChunkSync touch for every worker of every chunk come first, so a
  // worker's hot state spans two cache lines, not four (at 4 096 workers the chunk loop walked
  // ~1 MB per chunk, most of it ids and fields it never reads).
  bool down = false;
  bool excluded = false;
  // Batch (sync): samples per step and micro-batches per step.
  int64_t batch = 0;
  // Data: the lease held, its positions, what was consumed and what was acknowledged.
  uint64_t lease = 0, begin = 0, end = 0, consumed = 0;
  double carry = 0;  // async: fractional steps carried over
  // Report accumulators since the last report.
  double rep_compute = 0, rep_wall = 0, rep_steps = 0;
  uint64_t acked = 0, token = 0, incarnation = 0;
  int64_t accumulation = 1;
  double up_at = 0;
  uint64_t pair_key = 0;
  double lease_start = 0;
  double retry_fetch_at = 0;
  uint64_t report_seq = 0;
  uint32_t monitor_index = 0;  // the monitor's dense index (MonitorState::WorkerIndex)
  uint64_t lease_begin = 0;    // the lease's first position (begin is the first undone one)
  std::string id, node_name;
  LeaseGrant grant() const {
    LeaseGrant g;
    g.id = lease;
    g.token = token;
    g.lease_begin = lease_begin;
    g.begin = begin;
    g.end = end;
    return g;
  }
};

int64_t IndexOf(const std::string& id, char prefix_len) {
  int64_t i = -1;
  if (id.size() > static_cast<size_t>(prefix_len) &&
      absl::SimpleAtoi(id.substr(static_cast<size_t>(prefix_len)), &i))
    return i;
  return -1;
}

class JobSimulation : public ActionSink {
 public:
  JobSimulation(const SpeedModel& model, const PolicyConfig& policy, std::string name,
                double max_sim_s, ControlPlane* control_plane)
      : model_(model), sc_(model.scenario()), policy_(policy), max_sim_s_(max_sim_s),
        speed_(&model), cp_(control_plane), rng_{MixSeed(sc_.seed, 77)} {
    run_.name = std::move(name);
    run_.policy = policy.policy;
  }

  absl::StatusOr<PolicyRun> Run();

 private:
  bool sync() const { return sc_.job.mode == SimJobMode::kSync; }
  absl::Status Init();
  void SetClock(double t) { cp_->SetTime(t); }
  // What the control plane is told at a decision point that it learns from heartbeats and
  // agents (the workers' facts, the job's step).
  ModelFacts Facts() const;
  absl::Status Consume(SimWorker& w, int64_t w_index, uint64_t want, uint64_t* got);
  // Consume() with its common case inline (the chunk loops call it for every worker of every
  // chunk): the samples lie within the worker's lease, short of its end.
  absl::Status Take(SimWorker& w, int64_t w_index, uint64_t want, uint64_t* got) {
    if (w.lease != 0 && want < (w.end - w.begin) - w.consumed) {
      w.consumed += want;
      *got = want;
      return absl::OkStatus();
    }
    return Consume(w, w_index, want, got);
  }
  absl::Status Fetch(SimWorker& w);
  absl::Status Acknowledge(SimWorker& w, bool complete);
  absl::Status Release(SimWorker& w);
  absl::Status Down(int64_t w, double cost, int64_t migrate_to);
  absl::Status Up(int64_t w);
  absl::Status Report();
  absl::Status Reconcile();
  absl::Status Dispatch(const Action& a);
  // The burst rule's step path (policies with burst_exclusion.step_factor): at each heartbeat
  // (every kHeartbeatS) the timings of the steps each worker finished by then reach the
  // controller; its decision reaches the workers in the next heartbeat's replies.
  absl::Status Heartbeat();
  void NoteStepTimings(const std::vector<double>& compute, int64_t k, double per_step_s);
  // sim.trainer_deadline: the workers whose drawn step passes `line` (over_line_: counted, not
  // down) report at t_ + line, the rule decides inside, and those it excludes stop at the line
  // (stop_at_).
  absl::Status DecideAtTheLine(const std::vector<double>& compute, double line);
  std::vector<int64_t> over_line_;
  std::vector<StepTiming> heartbeat_timings_;  // Heartbeat()'s, kept for its capacity
  // ActionSink: the model carries the action out (Dispatch); the note is what it did.
  absl::StatusOr<std::string> Carry(const Action& a, const CarryContext&) override {
    if (absl::Status s = Dispatch(a); !s.ok()) return s;
    return std::string("carried out by the model");
  }
  struct PendingPlan;
  void ApplyPlan(const PendingPlan& plan);
  int64_t PickNode(int64_t w, const std::vector<std::string>& avoid);
  absl::Status ChunkSync(double boundary);
  absl::Status ChunkAsync(double boundary);
  double Noise() {
    switch (sc_.noise_dist) {
      case NoiseDist::kUniform: break;
      case NoiseDist::kLognormal: {
        const double sigma = std::sqrt(std::log1p(sc_.noise * sc_.noise));
        return std::exp(sigma * rng_.Normal() - 0.5 * sigma * sigma);
      }
      case NoiseDist::kExponential: return 1.0 + sc_.noise * (rng_.Exponential(1.0) - 1.0);
    }
    return 1.0 + sc_.noise * (2.0 * rng_.Uniform() - 1.0);
  }
  uint64_t DoneTotal() const { return cp_->RecordsDone(); }

  const SpeedModel& model_;
  const Scenario& sc_;
  const PolicyConfig policy_;
  const double max_sim_s_;
  SpeedState speed_;
  ControlPlane* cp_;  // the sharding service, monitor and controller the job talks to
  SplitMix rng_;
  DataLedger ledger_;
  std::vector<SimWorker> w_;
  absl::flat_hash_map<std::string, int64_t> index_;
  std::vector<std::string> node_names_;
  std::vector<std::string> server_ids_;
  std::map<std::string, int64_t> caps_;
  uint64_t shard_size_ = 0;
  double t_ = 0;
  int64_t step_ = 0;
  double next_report_ = 0, next_reconcile_ = 0, last_report_t_ = 0;
  double next_window_ = 0;
  double next_progress_ = 0, progress_interval_s_ = 0, next_node_report_ = 0;
  double stall_until_ = 0;
  int64_t down_ = 0;  // workers down (relaunching)  // job-wide stall (sync relaunch, PS server restart)
  std::vector<std::pair<double, int64_t>> pending_relief_;  // (at, server)
  // A plan dispatched but not in force yet: what ApplyPlan needs of it (each planned worker's
  // index, batch and accumulation), not a copy of its 4 096-worker BatchPlan.
  struct PendingPlan {
    int64_t effective_step = 0;
    struct Batch {
      int64_t index, samples, accumulation;
    };
    std::vector<Batch> batches;
  };
  std::optional<PendingPlan> pending_plan_;
  // ChunkSync held a drawn step back so that the report due before the window's end goes out
  // first (report_now_); the next ChunkSync runs it.
  bool held_step_ = false, report_now_ = false;
  std::vector<double> held_compute_;
  // Per worker, when the drawn step stopped past the step line (DecideAtTheLine; 0: it did not).
  std::vector<double> stop_at_;
  // The workers excluded now (those with SimWorker::excluded), ascending: an exclusion names
  // a few dozen of 4 096 workers, and what changes with it is found here, not by a pass over
  // every worker (Dispatch, ProbeNewlyExcluded, ChunkSync's probe delay).
  std::vector<int64_t> excluded_;
  std::vector<int64_t> excluded_before_;  // excluded_ before the actions being carried out
  std::vector<int64_t> newly_excluded_;   // ProbeNewlyExcluded's
  // The workers excluded now that were not before (excluded_before_) go to newly_excluded_,
  // their next probe due at `at`; then excluded_before_ = excluded_.
  void ProbeNewlyExcluded(double at);
  uint64_t interval_samples_ = 0;
  double last_throughput_ = 0, last_step_wall_ = 0;
  // Step path (Heartbeat): per worker, the newest step timing due at the next heartbeat and
  // the newest one that ends after it; the next probe of an excluded worker; decisions on
  // their way to the workers.
  struct Timing {
    bool set = false;
    StepTiming t;  // its worker_id and worker_index are the worker's for good (Run)
    double end_s = 0;
  };
  // Every field of `t` but its worker's id and index.
  static void SetTiming(StepTiming* t, int64_t step, double compute_s, int64_t samples,
                        int64_t time_ms, bool probe, bool in_progress, double wall_s) {
    t->step = step;
    t->compute_s = compute_s;
    t->samples = samples;
    t->time_ms = time_ms;
    t->probe = probe;
    t->in_progress = in_progress;
    t->wall_s = wall_s;
  }
  bool step_rule_ = false;
  double next_heartbeat_ = kForever;
  std::vector<Timing> due_, later_, running_;
  std::vector<double> next_probe_;
  std::vector<Action> in_flight_;
  NodeMetrics node_metrics_;
  ServerLatency server_latency_;
  PolicyRun run_;
};

absl::Status JobSimulation::Init() {
  const int64_t n = model_.workers();
  const int64_t B = sc_.job.global_batch;
  node_names_.resize(static_cast<size_t>(model_.nodes()));
  for (int64_t i = 0; i < model_.nodes(); ++i) node_names_[i] = absl::StrCat("n", i);
  for (int64_t s = 0; s < sc_.job.servers; ++s) server_ids_.push_back(absl::StrCat("ps", s));
  // Shard size: ~30 s of a median worker's work unless the scenario says.
  const double local = static_cast<double>(B) / static_cast<double>(n);
  shard_size_ = sc_.sim.shard_size > 0
                    ? static_cast<uint64_t>(sc_.sim.shard_size)
                    : static_cast<uint64_t>(std::max(local, std::round(sc_.speeds.median * 30)));
  DatasetSpec spec;
  spec.set_name(kDataset);
  spec.set_num_records(static_cast<uint64_t>(sc_.job.total_samples));
  spec.set_shard_size(shard_size_);
  spec.set_batch_size(static_cast<uint64_t>(std::max<double>(1, local)));
  spec.set_num_epochs(1);
  if (absl::Status s = cp_->Start(spec); !s.ok()) return s;

  w_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    SimWorker& w = w_[i];
    w.id = absl::StrCat("w", i);
    w.node_name = node_names_[speed_.node(i)];
    index_[w.id] = i;
    // Even split of B (the plan in force before any controller plan), micro-batches ≤ cap.
    w.batch = B / n + (i < B % n ? 1 : 0);
    w.accumulation = sc_.job.batch_cap > 0 ? std::max<int64_t>(1, (w.batch + sc_.job.batch_cap - 1) / sc_.job.batch_cap) : 1;
    if (sc_.job.batch_cap > 0) caps_[w.id] = sc_.job.batch_cap;
    if (absl::Status s = Up(i); !s.ok()) return s;
  }
  next_report_ = sc_.sim.report_interval_s - kReportLeadS;
  progress_interval_s_ = std::max(sc_.sim.report_interval_s, sc_.sim.progress_interval_s);
  next_progress_ = progress_interval_s_;
  return absl::OkStatus();
}

absl::Status JobSimulation::Up(int64_t i) {
  SimWorker& w = w_[i];
  if (w.down) --down_;
  w.down = false;
  w.node_name = node_names_[speed_.node(i)];
  absl::StatusOr<uint64_t> incarnation = cp_->RegisterWorker(w.id, w.node_name, &w.monitor_index);
  if (!incarnation.ok()) return incarnation.status();
  w.incarnation = *incarnation;
  // A relaunched process starts on the initial batch (the SDK's, until pacerd's plan reaches it).
  if (sync()) {
    const int64_t B = sc_.job.global_batch, n = model_.workers();
    w.batch = B / n + (i < B % n ? 1 : 0);
    w.accumulation = sc_.job.batch_cap > 0 ? std::max<int64_t>(1, (w.batch + sc_.job.batch_cap - 1) / sc_.job.batch_cap) : 1;
  }
  w.rep_compute = w.rep_wall = w.rep_steps = 0;
  w.carry = 0;
  return absl::OkStatus();
}

absl::Status JobSimulation::Down(int64_t i, double cost, int64_t migrate_to) {
  SimWorker& w = w_[i];
  if (w.down) return absl::OkStatus();
  if (w.lease != 0) {
    run_.wasted_samples += w.consumed - w.acked;
    w.lease = 0;
  }
  if (absl::Status s = cp_->WorkerDown(w.id); !s.ok()) return s;
  w.down = true;
  ++down_;
  w.up_at = t_ + cost;
  if (migrate_to >= 0) speed_.Migrate(i, migrate_to);
  else speed_.Restart(i);
  if (sync()) stall_until_ = std::max(stall_until_, w.up_at);  // the ring waits for it
  return absl::OkStatus();
}

absl::Status JobSimulation::Fetch(SimWorker& w) {
  absl::StatusOr<std::optional<LeaseGrant>> g = cp_->Fetch(w.id, w.incarnation);
  if (!g.ok()) return g.status();
  if (!g->has_value()) {
    w.retry_fetch_at = t_ + sc_.sim.report_interval_s;  // the SDK backs off until its next heartbeat
    return absl::OkStatus();
  }
  const LeaseGrant& l = **g;
  w.lease = l.id;
  w.token = l.token;
  w.lease_begin = l.lease_begin;
  w.begin = l.begin;
  w.end = l.end;
  w.consumed = w.acked = 0;
  w.lease_start = t_;
  w.pair_key = 0;
  if (l.backup) {
    w.pair_key = l.partner;  // the primary's id tags both copies in the ledger
    // The primary's acknowledgements from now on belong to the pair; its earlier ones (all
    // before the backup's start) stay ordinary.
    for (auto& o : w_)
      if (o.lease == l.partner) o.pair_key = l.partner;
  }
  return absl::OkStatus();
}

absl::Status JobSimulation::Acknowledge(SimWorker& w, bool complete) {
  if (w.lease == 0 || (!complete && w.consumed == w.acked)) return absl::OkStatus();
  const uint64_t offset = w.begin - w.lease_begin;  // a backup starts inside its range
  absl::StatusOr<AckOutcome> r = cp_->Acknowledge(w.id, w.incarnation, w.grant(), offset + w.consumed,
                                                  complete, /*may_be_fenced=*/w.pair_key != 0);
  if (!r.ok()) return r.status();
  if (*r == AckOutcome::kFenced) {
    // Fenced off (the backup partner completed first): the un-acknowledged work is wasted.
    ++run_.fenced_reports;
    run_.wasted_samples += w.consumed - w.acked;
    w.lease = 0;
    return absl::OkStatus();
  }
  ledger_.Acknowledge(w.begin + w.acked, w.begin + w.consumed, w.pair_key);
  w.acked = w.consumed;
  if (complete) w.lease = 0;
  return absl::OkStatus();
}

absl::Status JobSimulation::Release(SimWorker& w) {
  if (absl::Status s = Acknowledge(w, false); !s.ok()) return s;
  if (w.lease == 0) return absl::OkStatus();  // fenced meanwhile
  const LeaseGrant g = w.grant();
  w.lease = 0;
  return cp_->Release(w.id, w.incarnation, g, (g.begin - g.lease_begin) + w.consumed);
}

absl::Status JobSimulation::Consume(SimWorker& w, int64_t, uint64_t want, uint64_t* got) {
  *got = 0;
  while (want > 0) {
    if (w.lease == 0) {
      if (t_ < w.retry_fetch_at) return absl::OkStatus();
      if (absl::Status s = Fetch(w); !s.ok()) return s;
      if (w.lease == 0) return absl::OkStatus();
    }
    const uint64_t left = (w.end - w.begin) - w.consumed;
    const uint64_t take = std::min(left, want);
    w.consumed += take;
    want -= take;
    *got += take;
    if (w.consumed == w.end - w.begin) {
      if (absl::Status s = Acknowledge(w, /*complete=*/true); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status JobSimulation::ChunkSync(double boundary) {
  const int64_t n = model_.workers();
  if (pending_plan_ && step_ >= pending_plan_->effective_step) {
    ApplyPlan(*pending_plan_);
    pending_plan_.reset();
  }
  // sim.trainer_deadline (what pacer-train-mlp does): a counted worker whose step passes the
  // rule's line (pacerd hands it in heartbeat replies) reports at once; the rule decides inside
  // that report, and a worker it excludes stops at the line and joins the all-reduce with
  // weight 0 -- it trains none of the step's records (they go back uncounted with its leases).
  // One the rule leaves in (its cap is full) finishes the step. Decided once per drawn step (a
  // step held back for an early report keeps its decision). stop_at_[i]: when worker i stopped
  // (0: it did not).
  const double line = step_rule_ && sc_.sim.trainer_deadline ? cp_->BurstStepLineS() : 0;
  static thread_local std::vector<double> compute;
  const bool drawn = held_step_;  // the step held back for an early report (below)
  if (held_step_) {
    compute.swap(held_compute_);
    held_step_ = false;
  } else {
    compute.resize(static_cast<size_t>(n));
    over_line_.clear();
    for (int64_t i = 0; i < n; ++i) {
      const SimWorker& w = w_[i];
      compute[i] = 0;
      if (w.batch <= 0) continue;
      compute[i] = static_cast<double>(w.batch) / speed_.Speed(i) * Noise();
      // A counted worker past the line (DecideAtTheLine), noted while its record is at hand.
      if (line > 0 && compute[i] > line && !w.excluded && !w.down) over_line_.push_back(i);
    }
  }
  if (!drawn) {
    stop_at_.assign(static_cast<size_t>(n), 0);
    if (line > 0) {
      if (absl::Status s = DecideAtTheLine(compute, line); !s.ok()) return s;
    }
  }
  double slowest = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (stop_at_[i] > 0) slowest = std::max(slowest, stop_at_[i]);
    else if (!w_[i].excluded && w_[i].batch > 0) slowest = std::max(slowest, compute[i]);
  }
  const double step_s = slowest + sc_.job.sync_cost_s;
  // An excluded worker (pacer-train-mlp) times half its batch every kProbeIntervalS so the
  // monitor keeps seeing its speed; that one step waits for the probe. Charged as an expected
  // delay per second of the chunk (deterministic).
  double probe_delay = 0;
  for (const int64_t i : excluded_) {
    if (!(stop_at_[i] > 0) && w_[i].batch > 0)
      probe_delay = std::max(probe_delay, 0.5 * compute[i] - slowest);
  }
  const double per_step_s = step_s * (1 + std::max(0.0, probe_delay) / kProbeIntervalS);
  // A report due before the monitor's window ends must arrive before that end: pacerd's monitor
  // closes the windows due before it takes a report in, so one sent after a window's end counts
  // in the next window. When this step would end past the window's end, the report goes out
  // now (the last step boundary before it) and the step, as drawn, runs right after.
  if (!drawn && t_ < next_report_ && next_report_ < next_window_ && t_ + per_step_s > next_window_) {
    held_compute_.swap(compute);
    held_step_ = true;
    report_now_ = true;
    return absl::OkStatus();
  }
  int64_t k = std::max<int64_t>(1, static_cast<int64_t>((boundary - t_) / per_step_s));
  if (pending_plan_) k = std::max<int64_t>(1, std::min(k, pending_plan_->effective_step - step_));
  uint64_t samples = 0;  // summed here, not in the member (as ChunkAsync)
  for (int64_t i = 0; i < n; ++i) {
    SimWorker& w = w_[i];
    if (w.batch <= 0) continue;
    w.rep_compute += static_cast<double>(k) * compute[i];
    w.rep_wall += static_cast<double>(k) * per_step_s;
    w.rep_steps += static_cast<double>(k);
    if (w.excluded) continue;  // its gradient is dropped (or it stopped at the line): no data
    uint64_t got = 0;
    if (absl::Status s = Take(w, i, static_cast<uint64_t>(k * w.batch), &got); !s.ok()) return s;
    samples += got;
  }
  interval_samples_ += samples;
  if (step_rule_) NoteStepTimings(compute, k, per_step_s);
  t_ += static_cast<double>(k) * per_step_s;
  step_ += k;
  last_step_wall_ = per_step_s;
  return absl::OkStatus();
}

absl::Status JobSimulation::DecideAtTheLine(const std::vector<double>& compute, double line) {
  // Every counted worker whose step passes the line reports at the trainer's first check past
  // it: pacer-train-mlp checks between kLineSlices slices of its batch, so on average half a
  // slice past the line (never past the step's end). The reports arrive together (the model's
  // step begins at t_ for everyone).
  std::vector<StepTiming> crossed;
  for (const int64_t i : over_line_) {  // in the workers' order
    const SimWorker& w = w_[i];
    StepTiming t;
    t.worker_id = w.id;
    t.worker_index = static_cast<uint32_t>(i + 1);
    t.step = step_ + 1;
    t.in_progress = true;
    t.samples = w.batch;
    const double at = std::min(compute[i], line + compute[i] / (2 * kLineSlices));
    t.compute_s = at;  // the report's compute so far
    t.wall_s = at;
    t.time_ms = kStartMs + static_cast<int64_t>(std::llround((t_ + at) * 1000));
    crossed.push_back(std::move(t));
  }
  if (crossed.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<Action>> r = cp_->DecideBursts(
      crossed, crossed.front().time_ms, cp_->DecideBurstsReadsFacts() ? Facts() : ModelFacts());
  if (!r.ok()) return r.status();
  excluded_before_ = excluded_;
  for (const Action& a : *r)
    if (absl::StatusOr<std::string> note = Carry(a, CarryContext()); !note.ok()) return note.status();
  ProbeNewlyExcluded(t_ + line + kProbeIntervalS);
  for (const int64_t i : newly_excluded_) {
    // Stopped at the line only when its step passed it; one excluded by the same decision for
    // another reason (the rule's view of it) is excluded from the next step, as at a heartbeat.
    if (compute[i] > line) stop_at_[i] = std::min(compute[i], line + compute[i] / (2 * kLineSlices));
  }
  return absl::OkStatus();
}

void JobSimulation::ProbeNewlyExcluded(double at) {
  newly_excluded_.clear();
  for (const int64_t i : excluded_) {
    if (std::binary_search(excluded_before_.begin(), excluded_before_.end(), i)) continue;
    next_probe_[i] = at;
    newly_excluded_.push_back(i);
  }
  excluded_before_ = excluded_;
}

void JobSimulation::NoteStepTimings(const std::vector<double>& compute, int64_t k,
                                    double per_step_s) {
  // The chunk's k steps are alike; the newest is what the rule reads. A worker in training
  // reports its step; an excluded one only its probe (half its batch, every kProbeIntervalS).
  const double end = t_ + static_cast<double>(k) * per_step_s;
  const int64_t end_ms = kStartMs + static_cast<int64_t>(std::llround(end * 1000));
  for (size_t i = 0; i < w_.size(); ++i) {
    const SimWorker& w = w_[i];
    if (w.down || w.batch <= 0) continue;
    // Written into the worker's slots, whose ids are set once (Run): no StepTiming is built and
    // moved per worker and chunk.
    int64_t samples = w.batch;
    double compute_s = compute[i];
    bool probe = false;
    // A worker stopped at the line reports the step it abandoned (what it computed, at the
    // burst's pace), not a probe.
    if (w.excluded && !(stop_at_[i] > 0)) {
      if (end < next_probe_[i]) continue;
      next_probe_[i] = end + kProbeIntervalS;
      probe = true;
      samples = std::max<int64_t>(1, w.batch / 2);
      compute_s = compute[i] * static_cast<double>(samples) / static_cast<double>(w.batch);
    }
    if (sc_.sim.step_deadline && end > next_heartbeat_ && k == 1 && !w.excluded &&
        t_ + compute[i] > next_heartbeat_) {
      // Still computing at the heartbeat: the heartbeat says how long the step has run (the
      // SDK's wall seconds since the step began).
      Timing& r = running_[i];
      r.set = true;
      SetTiming(&r.t, step_ + 1, next_heartbeat_ - t_, samples,
                kStartMs + static_cast<int64_t>(std::llround(next_heartbeat_ * 1000)),
                /*probe=*/false, /*in_progress=*/true, next_heartbeat_ - t_);
    }
    Timing& slot = end <= next_heartbeat_ ? due_[i] : later_[i];
    slot.set = true;
    SetTiming(&slot.t, step_ + k, compute_s, samples, end_ms, probe, /*in_progress=*/false,
              per_step_s);
    slot.end_s = end;
  }
}

absl::Status JobSimulation::Heartbeat() {
  // The heartbeat on the 1 s grid that t_ has passed (a long step may pass several: the
  // workers heartbeat while they compute, with nothing new to say).
  const double hb = std::floor(t_ / kHeartbeatS) * kHeartbeatS;
  next_heartbeat_ = hb + kHeartbeatS;
  // The replies of this heartbeat carry the previous one's decisions.
  excluded_before_ = excluded_;
  std::vector<Action> carry;
  carry.swap(in_flight_);
  for (const Action& a : carry)
    if (absl::StatusOr<std::string> note = Carry(a, CarryContext()); !note.ok()) return note.status();
  ProbeNewlyExcluded(t_ + kProbeIntervalS);
  // Reused: its entries are overwritten in place. The same workers report in the same order
  // heartbeat after heartbeat: an entry already the worker's keeps its id (every timing here
  // carries its worker's index, set with the id in Run).
  std::vector<StepTiming>& timings = heartbeat_timings_;
  size_t n = 0;
  auto put = [&](const StepTiming& t) {
    if (n == timings.size()) timings.push_back(t);
    StepTiming& e = timings[n++];
    if (e.worker_index != t.worker_index) {
      e.worker_id = t.worker_id;
      e.worker_index = t.worker_index;
    }
    SetTiming(&e, t.step, t.compute_s, t.samples, t.time_ms, t.probe, t.in_progress, t.wall_s);
  };
  for (size_t i = 0; i < w_.size(); ++i) {
    if (running_[i].set) {
      put(running_[i].t);
      running_[i].set = false;
    }
    if (due_[i].set) {
      put(due_[i].t);
      due_[i].set = false;
    }
    if (later_[i].set && later_[i].end_s <= next_heartbeat_) {
      // Both slots hold the worker's id: the rest moves.
      Timing& d = due_[i];
      const StepTiming& l = later_[i].t;
      d.set = true;
      d.end_s = later_[i].end_s;
      SetTiming(&d.t, l.step, l.compute_s, l.samples, l.time_ms, l.probe, l.in_progress, l.wall_s);
      later_[i].set = false;
    }
  }
  timings.resize(n);
  absl::StatusOr<std::vector<Action>> r =
      cp_->DecideBursts(timings, kStartMs + static_cast<int64_t>(std::llround(hb * 1000)),
                        cp_->DecideBurstsReadsFacts() ? Facts() : ModelFacts());
  if (!r.ok()) return r.status();
  for (Action& a : *r) in_flight_.push_back(std::move(a));
  if (sc_.sim.decision_heartbeats == 0) {
    // pacerd deciding inside the heartbeat handler: the reply to the heartbeat that brought
    // the timings carries the worker's exclusion (only it needs to know: weight 0).
    carry.clear();
    carry.swap(in_flight_);
    for (const Action& a : carry)
      if (absl::StatusOr<std::string> note = Carry(a, CarryContext()); !note.ok()) return note.status();
    ProbeNewlyExcluded(t_ + kProbeIntervalS);
  }
  return absl::OkStatus();
}

absl::Status JobSimulation::ChunkAsync(double boundary) {
  const int64_t n = model_.workers();
  const double dt = boundary - t_;
  const double comm = sc_.job.sync_cost_s / std::max(1e-9, speed_.MinServerFactor());
  uint64_t samples = 0;
  int64_t steps_done = 0;
  double last_wall = 0;
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    SimWorker& w = w_[i];
    if (w.down) continue;
    const double compute = static_cast<double>(w.batch) / speed_.Speed(i) * Noise();
    const double steps = dt / (compute + comm) + w.carry;
    // floor() of a non-negative value; the integer conversion is the same number and much
    // cheaper than the libm call in this loop over every worker of every chunk.
    const double whole = static_cast<double>(static_cast<int64_t>(steps));
    w.carry = steps - whole;
    w.rep_compute += whole * compute;
    w.rep_wall += whole * (compute + comm);
    w.rep_steps += whole;
    uint64_t got = 0;
    const uint64_t want = static_cast<uint64_t>(whole) * static_cast<uint64_t>(w.batch);
    if (absl::Status s = Take(w, i, want, &got); !s.ok()) return s;
    // Summed in locals (the same integer sums, the same last value): as members they were
    // loaded and stored for every worker, the compiler unable to tell them from w's fields.
    samples += got;
    steps_done += static_cast<int64_t>(whole);
    last_wall = compute + comm;
    any = true;
  }
  interval_samples_ += samples;
  step_ += steps_done;
  if (any) last_step_wall_ = last_wall;
  t_ = boundary;
  return absl::OkStatus();
}

absl::Status JobSimulation::Report() {
  SetClock(t_);
  const int64_t now_ms = cp_->NowMs();
  const int64_t n = model_.workers();
  const bool progress_due = t_ >= next_progress_;
  if (progress_due)
    while (next_progress_ <= t_) next_progress_ += progress_interval_s_;
  for (int64_t i = 0; i < n; ++i) {
    SimWorker& w = w_[i];
    if (w.down) continue;
    if (progress_due)
      if (absl::Status s = Acknowledge(w, false); !s.ok()) return s;
    if (w.rep_steps <= 0 || w.rep_compute <= 0) continue;
    // A StepReport's numbers, handed over by the worker's monitor index (the monitor's
    // checks and effects are those of IngestStep; no message, no id lookup).
    StepSample r;
    r.step = ++w.report_seq;
    const int64_t micro = (w.batch + w.accumulation - 1) / w.accumulation;
    r.local_batch = static_cast<uint32_t>(std::max<int64_t>(1, micro));
    r.samples = static_cast<uint64_t>(w.batch);
    r.compute_s = w.rep_compute / w.rep_steps;
    r.wall_s = std::max(w.rep_wall, w.rep_compute) / w.rep_steps;
    r.comm_s = r.wall_s - r.compute_s;
    r.time_ms = now_ms;
    ++run_.monitor_reports;
    cp_->ReportStep(w.monitor_index, w.id, r);
    w.rep_compute = w.rep_wall = w.rep_steps = 0;
  }
  // Node agents: CPU steal shows contention (hardware slowness leaves no trace). They report
  // every 20 s (within the monitor's node_metrics_max_age_ms of 30 s) or every interval when
  // reports are rarer.
  const bool nodes_due = t_ >= next_node_report_;
  if (nodes_due)
    while (next_node_report_ <= t_) next_node_report_ += std::max(20.0, sc_.sim.report_interval_s);
  NodeMetrics& m = node_metrics_;  // one message reused: no allocation per node
  for (int64_t nd = 0; nodes_due && nd < model_.nodes(); ++nd) {
    if (speed_.workers_on(nd).empty()) continue;
    m.set_node(node_names_[nd]);
    m.set_time_ms(now_ms);
    m.set_interval_s(sc_.sim.report_interval_s);
    m.set_num_cpus(16);
    const double c = speed_.NodeContention(nd);
    m.set_cpu_steal_frac(c > 0 ? std::min(0.9, 0.05 + 0.5 * c) : 0.01);
    m.set_cpu_busy_frac(0.8);
    cp_->ReportNode(m);
  }
  // PS jobs: up to 16 workers report the latency they saw to each server (a sample is enough:
  // the monitor takes the median over reporters).
  if (!sync()) {
    const int64_t stride = std::max<int64_t>(1, n / 16);
    for (int64_t i = 0; i < n; i += stride) {
      if (w_[i].down) continue;
      ServerLatency& l = server_latency_;  // reused, as node_metrics_
      for (int64_t s = 0; s < sc_.job.servers; ++s) {
        l.set_server_id(server_ids_[s]);
        l.set_reporter(w_[i].id);
        l.set_requests(100);
        l.set_mean_latency_ms(kServerLatencyMs / speed_.ServerFactor(s));
        l.set_p99_latency_ms(2 * l.mean_latency_ms());
        l.set_time_ms(now_ms);
        cp_->ReportServerLatency(l);
      }
    }
  }
  const double span = t_ - last_report_t_;
  last_throughput_ = span > 0 ? static_cast<double>(interval_samples_) / span : 0;
  run_.throughput.emplace_back(t_, last_throughput_);
  interval_samples_ = 0;
  last_report_t_ = t_;
  return absl::OkStatus();
}

ModelFacts JobSimulation::Facts() const {
  ModelFacts f;
  f.current_step = step_;
  f.workers.reserve(w_.size());
  for (const SimWorker& w : w_) {
    WorkerReport r;
    r.id = w.id;
    r.node = w.node_name;
    r.down = w.down;
    r.honors_exclusion = true;  // modelled: a step does not wait for excluded workers (ChunkSync)
    r.max_local_batch = sc_.job.batch_cap;
    r.incarnation = w.incarnation;
    f.workers.push_back(std::move(r));
  }
  return f;
}

absl::Status JobSimulation::Reconcile() {
  ++run_.reconciles;
  absl::StatusOr<std::vector<Action>> r = cp_->Reconcile(Facts());
  if (!r.ok()) return r.status();
  for (const Action& a : *r) {
    if (absl::StatusOr<std::string> note = Carry(a, CarryContext()); !note.ok()) return note.status();
  }
  return absl::OkStatus();
}

void JobSimulation::ApplyPlan(const PendingPlan& plan) {
  // A worker the plan leaves out (it was not live when the plan was made) keeps its batch, as a
  // pacerd worker keeps the command it holds; the next plan counts it once it reports again.
  for (const auto& b : plan.batches) {
    w_[b.index].batch = b.samples;
    w_[b.index].accumulation = b.accumulation;
  }
}

int64_t JobSimulation::PickNode(int64_t i, const std::vector<std::string>& avoid) {
  const int64_t wpn = sc_.job.workers_per_node;
  auto ok = [&](int64_t nd) {
    if (nd == speed_.node(i) || static_cast<int64_t>(speed_.workers_on(nd).size()) >= wpn) return false;
    return std::find(avoid.begin(), avoid.end(), node_names_[nd]) == avoid.end();
  };
  // Spare nodes first (the scheduler's free capacity), then any node with a free slot.
  for (int64_t nd = model_.job_nodes(); nd < model_.nodes(); ++nd)
    if (ok(nd)) return nd;
  for (int64_t nd = 0; nd < model_.job_nodes(); ++nd)
    if (ok(nd)) return nd;
  return -1;
}

absl::Status JobSimulation::Dispatch(const Action& a) {
  run_.actions.push_back({t_, ActionKindName(a.kind), a.target});
  if (a.rollback_of != 0) ++run_.rollbacks;
  switch (a.kind) {
    case ActionKind::kAdjustBatch: {
      ++run_.plans;
      if (!a.plan || !CheckBatchPlan(*a.plan, caps_).ok()) {
        ++run_.invalid_plans;
        return absl::OkStatus();
      }
      pending_plan_.emplace();
      pending_plan_->effective_step = a.plan->effective_step;
      pending_plan_->batches.reserve(a.plan->workers.size());
      for (const auto& wb : a.plan->workers) {
        auto it = index_.find(wb.worker_id);
        if (it == index_.end()) continue;  // not one of the model's workers
        pending_plan_->batches.push_back(
            {it->second, wb.samples, std::max<int64_t>(1, wb.accumulation)});
      }
      if (step_ >= pending_plan_->effective_step) {
        ApplyPlan(*pending_plan_);
        pending_plan_.reset();
      }
      return absl::OkStatus();
    }
    case ActionKind::kExcludeWorkers:
      ++run_.exclusions;
      // The action names the whole set out from now on.
      for (const int64_t i : excluded_) w_[i].excluded = false;
      excluded_.clear();
      for (const auto& id : a.excluded_workers)
        if (auto it = index_.find(id); it != index_.end()) excluded_.push_back(it->second);
      std::sort(excluded_.begin(), excluded_.end());
      excluded_.erase(std::unique(excluded_.begin(), excluded_.end()), excluded_.end());
      for (const int64_t i : excluded_) w_[i].excluded = true;
      // An excluded worker's gradients are dropped, so it trains on no data: it hands back
      // the unconsumed rest of its lease (acknowledging what it did) for others to take, in
      // the workers' order.
      for (const int64_t i : excluded_) {
        if (w_[i].lease == 0) continue;
        if (absl::Status s = Release(w_[i]); !s.ok()) return s;
      }
      return absl::OkStatus();
    case ActionKind::kReallocate: {
      ++run_.reallocations;
      return cp_->Reallocate(a, shard_size_);
    }
    case ActionKind::kRestart:
    case ActionKind::kMigrate: {
      auto it = index_.find(a.target);
      if (it == index_.end() || w_[it->second].down) return absl::OkStatus();
      int64_t to = -1;
      if (a.kind == ActionKind::kMigrate) {
        to = PickNode(it->second, a.avoid_nodes);
        if (to < 0) return absl::OkStatus();  // no free node: the agent cannot carry it out
        ++run_.migrations;
      } else {
        ++run_.restarts;
      }
      return Down(it->second, a.kind == ActionKind::kMigrate ? sc_.migrate_cost_s() : sc_.job.restart_cost_s, to);
    }
    case ActionKind::kRestartServer:
    case ActionKind::kRelieveServer: {
      const int64_t s = IndexOf(a.target, 2);
      if (s < 0 || s >= sc_.job.servers) return absl::OkStatus();
      ++run_.server_actions;
      if (a.kind == ActionKind::kRestartServer) {
        // Every worker waits on the restarting server (its shard of the parameters).
        stall_until_ = std::max(stall_until_, t_ + sc_.job.restart_cost_s);
        pending_relief_.emplace_back(t_ + sc_.job.restart_cost_s, s);
      } else {
        pending_relief_.emplace_back(t_ + sc_.job.restart_cost_s, s);  // keys move meanwhile
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PolicyRun> JobSimulation::Run() {
  const auto wall0 = std::chrono::steady_clock::now();
  const double cpu0 = ThreadCpuSeconds();
  if (absl::Status s = Init(); !s.ok()) return s;
  const uint64_t total = static_cast<uint64_t>(sc_.job.total_samples);
  const double reconcile_s = sc_.sim.reconcile_s > 0 ? sc_.sim.reconcile_s : policy_.detection.window_s;
  next_reconcile_ = reconcile_s;
  const double window_s = policy_.detection.window_s;
  next_window_ = window_s;
  std::vector<int64_t> failed;
  uint64_t timeline_changes = 0;
  step_rule_ = sync() && UsesStepTimings(policy_);
  if (step_rule_) {
    next_heartbeat_ = kHeartbeatS;
    due_.resize(w_.size());
    later_.resize(w_.size());
    running_.resize(w_.size());
    for (size_t i = 0; i < w_.size(); ++i) {
      for (Timing* slot : {&due_[i], &later_[i], &running_[i]}) {
        slot->t.worker_id = w_[i].id;
        slot->t.worker_index = static_cast<uint32_t>(i + 1);  // a lookup hint
      }
    }
    next_probe_.assign(w_.size(), 0);
  }
  while (t_ < max_sim_s_) {
    SetClock(t_);
    failed.clear();
    const double before = speed_.NextChange();
    speed_.AdvanceTo(t_, &failed);
    if (before <= t_) ++timeline_changes;
    for (int64_t i : failed) {
      if (w_[i].down) continue;
      ++run_.failures;
      run_.actions.push_back({t_, "failure", w_[i].id});
      if (absl::Status s = Down(i, sc_.job.restart_cost_s, -1); !s.ok()) return s;
    }
    for (size_t k = 0; k < pending_relief_.size();) {
      if (pending_relief_[k].first <= t_) {
        speed_.RelieveServer(pending_relief_[k].second);
        pending_relief_.erase(pending_relief_.begin() + static_cast<long>(k));
      } else {
        ++k;
      }
    }
    double next_up = kForever;
    for (int64_t i = 0; down_ > 0 && i < model_.workers(); ++i) {
      if (!w_[i].down) continue;
      if (w_[i].up_at <= t_) {
        if (absl::Status s = Up(i); !s.ok()) return s;
      } else {
        next_up = std::min(next_up, w_[i].up_at);
      }
    }
    // Reports go out just before a window ends (kReportLeadS), so each lands in the window it
    // describes, as a real SDK's per-second reports would; the window then closes and the
    // controller reconciles on fresh data.
    if (t_ >= next_heartbeat_)
      if (absl::Status s = Heartbeat(); !s.ok()) return s;
    if (t_ >= next_report_ || report_now_) {
      if (absl::Status s = Report(); !s.ok()) return s;
      if (report_now_ && next_report_ > t_) next_report_ += sc_.sim.report_interval_s;  // sent early
      report_now_ = false;
      while (next_report_ <= t_) next_report_ += sc_.sim.report_interval_s;
    }
    if (t_ >= next_window_) {
      if (absl::Status s = cp_->CloseWindows(); !s.ok()) return s;
      while (next_window_ <= t_) next_window_ += window_s;
      if (t_ >= next_reconcile_) {
        if (absl::Status s = Reconcile(); !s.ok()) return s;
        while (next_reconcile_ <= t_) next_reconcile_ += reconcile_s;
      }
    }
    if (DoneTotal() >= total) break;
    double boundary =
        std::min({next_report_, next_window_, speed_.NextChange(), next_up, t_ + sc_.sim.tick_s,
                  next_heartbeat_});
    for (const auto& r : pending_relief_) boundary = std::min(boundary, r.first);
    ++run_.chunks;
    if (t_ < stall_until_) {
      t_ = std::min(boundary, stall_until_);
      continue;
    }
    absl::Status s = sync() ? ChunkSync(boundary) : ChunkAsync(boundary);
    if (!s.ok()) return s;
    if (DoneTotal() >= total) break;
  }
  SetClock(t_);
  if (getenv("PACER_SIM_DEBUG")) {
    for (const Decision& d : cp_->Decisions())
      fprintf(stderr, "[%s] t=%.0f %s %s %s gain=%.3f x%ld %s | %s\n", run_.name.c_str(),
              (d.time_ms - kStartMs) / 1000.0, d.outcome.c_str(), d.kind.c_str(), d.target.c_str(),
              d.predicted_gain, (long)d.repeats, d.veto_reason.c_str(), d.reason.substr(0, 200).c_str());
  }
  run_.finished = DoneTotal() >= total;
  run_.jct_s = run_.finished ? t_ : kForever;
  run_.records_duplicated = ledger_.duplicated();
  run_.backup_overlap = ledger_.backup_overlap();
  run_.records_lost = run_.finished ? ledger_.Lost(total) : 0;
  const uint64_t done = DoneTotal();
  run_.state_done_mismatch = done > ledger_.covered() ? done - ledger_.covered() : ledger_.covered() - done;
  run_.sharding_updates = cp_->sharding_updates();
  run_.model_events = run_.chunks + run_.monitor_reports + run_.sharding_updates + run_.reconciles + timeline_changes;
  run_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  run_.cpu_s = ThreadCpuSeconds() - cpu0;
  return run_;
}

}  // namespace

ControlPlaneJob ControlPlaneJobFor(const Scenario& sc) {
  ControlPlaneJob j;
  j.mode = sc.job.mode == SimJobMode::kSync ? JobMode::kSync : JobMode::kAsync;
  j.global_batch = sc.job.mode == SimJobMode::kSync ? sc.job.global_batch : 0;
  j.heartbeat_interval_s = kHeartbeatS;
  j.progress_interval_s = std::max(sc.sim.report_interval_s, sc.sim.progress_interval_s);
  j.restart_cost_s = sc.job.restart_cost_s;
  j.migrate_cost_s = sc.migrate_cost_s();
  j.dataset = kDataset;
  return j;
}

absl::StatusOr<PolicyRun> RunPolicy(const SpeedModel& model, const PolicyConfig& policy,
                                    const std::string& display_name, double max_sim_s) {
  absl::StatusOr<std::unique_ptr<InProcessControlPlane>> cp = InProcessControlPlane::Create(
      policy, MonitorOptionsForPolicy(policy), ControlPlaneJobFor(model.scenario()), kSimStartMs);
  if (!cp.ok()) return cp.status();
  return RunPolicyOn(model, policy, display_name, max_sim_s, **cp);
}

absl::StatusOr<PolicyRun> RunPolicyOn(const SpeedModel& model, const PolicyConfig& policy,
                                      const std::string& display_name, double max_sim_s,
                                      ControlPlane& control_plane) {
  JobSimulation sim(model, policy, display_name, max_sim_s, &control_plane);
  return sim.Run();
}

}  // namespace pacer::sim
