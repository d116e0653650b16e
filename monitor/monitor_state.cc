#include "monitor/monitor_state.h"

#include <cmath>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "monitor/robust_stats.h"

namespace pacer {
namespace {

constexpr uint64_t kDedupSpan = 64;
constexpr uint64_t kRestartJump = 4096;

bool ValidId(absl::string_view id, uint32_t max_len) {
  if (id.empty() || id.size() > max_len) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
}

}  // namespace

ReportIssue MonitorState::StepDedup::Accept(uint64_t step) {
  if (!any || (step < newest && newest - step > kRestartJump)) {
    any = true;
    newest = step;
    seen = 1;
    return ReportIssue::kNone;
  }
  if (step > newest) {
    const uint64_t shift = step - newest;
    seen = shift >= kDedupSpan ? 1 : (seen << shift) | 1;
    newest = step;
    return ReportIssue::kNone;
  }
  const uint64_t d = newest - step;
  if (d >= kDedupSpan) return ReportIssue::kStale;
  const uint64_t bit = uint64_t{1} << d;
  if (seen & bit) return ReportIssue::kDuplicateStep;
  seen |= bit;
  return ReportIssue::kNone;
}

absl::StatusOr<std::unique_ptr<MonitorState>> MonitorState::Create(const MonitorOptions& options,
                                                                   const Clock* clock) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (clock == nullptr) return absl::InvalidArgumentError("monitor: clock is required");
  return std::unique_ptr<MonitorState>(new MonitorState(options, clock));
}

MonitorState::MonitorState(const MonitorOptions& options, const Clock* clock)
    : options_(options),
      clock_(clock),
      open_window_(clock->NowMs() / options.window_ms),
      speed_(options),
      node_signals_(options),
      server_latency_(options),
      worker_classifier_(options, ENTITY_WORKER),
      server_classifier_(options, ENTITY_SERVER) {}

void MonitorState::NoteRunningStep(absl::string_view worker_id, uint64_t samples, double compute_s,
                                   uint64_t samples_done, double done_compute_s) {
  if (!options_.running_step_bound || samples == 0 || samples > options_.max_samples_per_step ||
      !std::isfinite(compute_s) || !(compute_s > 0) || compute_s > options_.max_step_s)
    return;
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return;
  if (samples_done > samples || !std::isfinite(done_compute_s) || !(done_compute_s > 0) ||
      done_compute_s > compute_s) {
    samples_done = 0;  // not this step's progress: the bound alone
    done_compute_s = 0;
  }
  speed_.NoteRunning(it->second, samples, compute_s, samples_done, done_compute_s);
}

absl::Status MonitorState::UpdateDetection(const MonitorOptions& o) {
  if (absl::Status s = o.Validate(); !s.ok()) return s;
  MonitorOptions next = options_;  // input limits and estimator settings stay as started
  next.straggler_threshold = o.straggler_threshold;
  next.leader_threshold = o.leader_threshold;
  next.hysteresis = o.hysteresis;
  next.persistent_k = o.persistent_k;
  next.persistent_w = o.persistent_w;
  next.running_step_bound = o.running_step_bound;
  next.stale_after_windows = o.stale_after_windows;
  next.smoothed_windows = o.smoothed_windows;
  next.stable_smoothed_windows = o.stable_smoothed_windows;
  next.steal_threshold = o.steal_threshold;
  next.throttle_threshold = o.throttle_threshold;
  next.other_cpu_threshold = o.other_cpu_threshold;
  next.load_per_cpu_threshold = o.load_per_cpu_threshold;
  next.deterministic_max_cv = o.deterministic_max_cv;
  next.node_metrics_max_age_ms = o.node_metrics_max_age_ms;
  next.node_level_fraction = o.node_level_fraction;
  next.node_level_min_workers = o.node_level_min_workers;
  next.hot_server_ratio = o.hot_server_ratio;
  next.hot_server_min_latency_ms = o.hot_server_min_latency_ms;
  if (o.window_ms != options_.window_ms || o.history_ms != options_.history_ms ||
      next.HistoryWindows() != options_.HistoryWindows()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "monitor: window_s / history changes need a restart (running ", options_.window_ms,
        " ms windows, ", options_.HistoryWindows(), " kept; asked ", o.window_ms, " ms, ",
        next.HistoryWindows(), ")"));
  }
  if (absl::Status s = next.Validate(); !s.ok()) return s;
  options_ = next;
  node_signals_.SetOptions(next);
  worker_classifier_.SetOptions(next);
  server_classifier_.SetOptions(next);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> MonitorState::NodeIndex(absl::string_view node) {
  if (node.empty()) return StragglerClassifier::kNoNode;
  if (!ValidId(node, options_.max_id_length)) {
    return absl::InvalidArgumentError("monitor: node name is empty, too long or not printable");
  }
  auto it = node_index_.find(node);
  if (it != node_index_.end()) return it->second;
  uint32_t index;
  if (!free_nodes_.empty()) {
    index = free_nodes_.back();
    free_nodes_.pop_back();
    node_signals_.Reset(index);
    nodes_[index] = NodeRecord{std::string(node)};
  } else if (nodes_.size() >= options_.max_nodes) {
    return absl::ResourceExhaustedError(absl::StrCat("monitor: node table full (", options_.max_nodes,
                                                     " nodes, MonitorOptions::max_nodes): cannot add node '",
                                                     node, "'"));
  } else {
    index = node_signals_.AddNode();
    nodes_.push_back(NodeRecord{std::string(node)});
  }
  node_index_.emplace(std::string(node), index);
  return index;
}

void MonitorState::FreeNodeIfUnused(uint32_t node) {
  if (node == StragglerClassifier::kNoNode) return;
  NodeRecord& n = nodes_[node];
  if (n.workers > 0 || n.reported || n.name.empty()) return;
  node_index_.erase(n.name);
  n = NodeRecord();
  node_signals_.Reset(node);
  free_nodes_.push_back(node);
}

void MonitorState::MoveWorkerNode(uint32_t worker, uint32_t from, uint32_t to) {
  if (from == to) return;
  if (to != StragglerClassifier::kNoNode) ++nodes_[to].workers;
  if (from != StragglerClassifier::kNoNode) --nodes_[from].workers;
  workers_[worker].node = to;
  worker_classifier_.SetNode(worker, to);
  FreeNodeIfUnused(from);
}

absl::StatusOr<uint32_t> MonitorState::AddWorker(absl::string_view worker_id, uint32_t node) {
  if (workers_.size() >= options_.max_workers) {
    return absl::ResourceExhaustedError(absl::StrCat("monitor: more than ", options_.max_workers, " workers"));
  }
  const uint32_t index = speed_.AddWorker();
  worker_classifier_.AddEntity(node);  // same index as the estimator's
  WorkerRecord rec;
  rec.id = std::string(worker_id);
  rec.node = node;
  rec.model = StepTimeModel(options_.model_forgetting);
  workers_.push_back(std::move(rec));
  worker_index_.emplace(std::string(worker_id), index);
  if (node != StragglerClassifier::kNoNode) ++nodes_[node].workers;
  return index;
}

absl::Status MonitorState::RegisterWorker(absl::string_view worker_id, absl::string_view node) {
  if (!ValidId(worker_id, options_.max_id_length)) {
    return absl::InvalidArgumentError("monitor: worker_id is empty, too long or not printable");
  }
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) {
    ASSIGN_OR_RETURN(uint32_t node_index, NodeIndex(node));
    absl::StatusOr<uint32_t> added = AddWorker(worker_id, node_index);
    if (!added.ok()) FreeNodeIfUnused(node_index);  // a row added for nobody
    return added.status();
  }
  const uint32_t w = it->second;
  WorkerRecord& rec = workers_[w];
  const uint32_t old = rec.node;
  uint32_t node_index = StragglerClassifier::kNoNode;
  if (old != StragglerClassifier::kNoNode && nodes_[old].name == node) {
    node_index = old;
  } else if (!node.empty() && !node_index_.contains(node) && old != StragglerClassifier::kNoNode &&
             nodes_[old].workers == 1 && !nodes_[old].reported) {
    // A new name for the row only this worker is on: the worker takes its row along.
    if (!ValidId(node, options_.max_id_length)) {
      return absl::InvalidArgumentError("monitor: node name is empty, too long or not printable");
    }
    node_index_.erase(nodes_[old].name);
    nodes_[old].name = std::string(node);
    node_index_.emplace(std::string(node), old);
    node_signals_.Reset(old);
    node_index = old;
  } else {
    ASSIGN_OR_RETURN(node_index, NodeIndex(node));
  }
  MoveWorkerNode(w, old, node_index);
  workers_[w].dedup = StepDedup();
  return absl::OkStatus();
}

void MonitorState::ForgetWorkerHistories() {
  for (uint32_t i = 0; i < workers_.size(); ++i) {
    speed_.Forget(i);
    worker_classifier_.Forget(i);
    WorkerRecord& rec = workers_[i];
    rec.model = StepTimeModel(options_.model_forgetting);
    rec.last_batch = 0;
    rec.class_since_ms = 0;
  }
}

ReportIssue MonitorState::IngestStep(StepReport report) {
  const int64_t now = clock_->NowMs();
  RejectionCounts repairs;  // counted only if the report is used
  ReportIssue issue = CheckStepReport(options_, now, &report, &repairs);
  uint32_t index = 0;
  if (issue == ReportIssue::kNone) {
    auto it = worker_index_.find(report.worker_id());
    if (it != worker_index_.end()) {
      index = it->second;
    } else if (!options_.admit_unknown_workers) {
      issue = ReportIssue::kUnknownWorker;
    } else if (!ValidId(report.worker_id(), options_.max_id_length)) {
      issue = ReportIssue::kMissingId;
    } else if (auto added = AddWorker(report.worker_id(), StragglerClassifier::kNoNode); added.ok()) {
      index = *added;
    } else {
      issue = ReportIssue::kTooManyEntities;
    }
  }
  if (issue != ReportIssue::kNone) {
    issues_.Add(issue);
    return issue;
  }
  return Accept(index, StepSample::Of(report), repairs, now);
}

ReportIssue MonitorState::IngestStepAt(uint32_t worker, StepSample sample) {
  const int64_t now = clock_->NowMs();
  RejectionCounts repairs;
  const ReportIssue issue = worker < workers_.size()
                                ? CheckStepSample(options_, now, &sample, &repairs)
                                : ReportIssue::kUnknownWorker;
  if (issue != ReportIssue::kNone) {
    issues_.Add(issue);
    return issue;
  }
  return Accept(worker, sample, repairs, now);
}

ReportIssue MonitorState::Accept(uint32_t index, const StepSample& report,
                                 const RejectionCounts& repairs, int64_t now) {
  // The flood check first, so a flood does not fill the de-duplication window.
  const ReportIssue issue =
      !speed_.HasRoom(index) ? ReportIssue::kFlood : workers_[index].dedup.Accept(report.step);
  if (issue != ReportIssue::kNone) {
    issues_.Add(issue);
    return issue;
  }
  for (ReportIssue r : {ReportIssue::kClampedComm, ReportIssue::kClampedDataWait, ReportIssue::kClampedWall}) {
    issues_.Add(r, repairs.Get(r));
  }
  speed_.Add(index, report.samples, report.compute_s, report.comm_s, report.data_wait_s,
             report.wall_s);
  WorkerRecord& rec = workers_[index];
  rec.model.Add(report.local_batch, report.compute_s);
  rec.last_batch = report.local_batch;
  rec.last_report_ms = now;
  ++rec.reports;
  ++accepted_;
  return ReportIssue::kNone;
}

std::optional<uint32_t> MonitorState::WorkerIndex(absl::string_view worker_id) const {
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return std::nullopt;
  return it->second;
}

ReportIssue MonitorState::IngestServerLatency(const ServerLatency& sample) {
  const int64_t now = clock_->NowMs();
  ReportIssue issue = CheckServerLatency(options_, now, sample);
  if (issue == ReportIssue::kNone && !ValidId(sample.server_id(), options_.max_id_length)) {
    issue = ReportIssue::kMissingId;
  }
  uint32_t reporter = 0;
  if (issue == ReportIssue::kNone) {
    auto it = worker_index_.find(sample.reporter());
    if (it != worker_index_.end()) {
      reporter = it->second;
    } else if (!options_.admit_unknown_workers) {
      issue = ReportIssue::kUnknownWorker;
    } else if (!ValidId(sample.reporter(), options_.max_id_length)) {
      issue = ReportIssue::kMissingId;
    } else if (auto added = AddWorker(sample.reporter(), StragglerClassifier::kNoNode); added.ok()) {
      reporter = *added;
    } else {
      issue = ReportIssue::kTooManyEntities;
    }
  }
  uint32_t index = 0;
  if (issue == ReportIssue::kNone) {
    auto it = server_index_.find(sample.server_id());
    if (it != server_index_.end()) {
      index = it->second;
    } else if (servers_.size() >= options_.max_servers ||
               workers_[reporter].servers_added >= options_.max_servers_per_reporter) {
      issue = ReportIssue::kTooManyEntities;
    } else {
      index = server_latency_.AddServer();
      server_classifier_.AddEntity();
      servers_.push_back(ServerRecord{sample.server_id()});
      server_index_.emplace(sample.server_id(), index);
      ++workers_[reporter].servers_added;
    }
  }
  if (issue != ReportIssue::kNone) {
    issues_.Add(issue);
    return issue;
  }
  server_latency_.Add(index, reporter, sample.mean_latency_ms());
  servers_[index].last_report_ms = now;
  ++servers_[index].reports;
  ++accepted_;
  return ReportIssue::kNone;
}

ReportIssue MonitorState::IngestNodeMetrics(const NodeMetrics& metrics) {
  const int64_t now = clock_->NowMs();
  ReportIssue issue = CheckNodeMetrics(options_, now, metrics);
  if (issue == ReportIssue::kNone && !ValidId(metrics.node(), options_.max_id_length)) {
    issue = ReportIssue::kMissingId;
  }
  uint32_t index = 0;
  if (issue == ReportIssue::kNone) {
    // Agents report nodes that workers named; an unknown node is admitted only while the node
    // table has room (an agent may start before its workers register).
    auto found = NodeIndex(metrics.node());
    if (!found.ok()) {
      issue = ReportIssue::kTooManyEntities;
    } else {
      index = *found;
      nodes_[index].reported = true;
    }
  }
  if (issue != ReportIssue::kNone) {
    issues_.Add(issue);
    return issue;
  }
  node_signals_.Update(index, metrics, now);
  ++accepted_;
  return ReportIssue::kNone;
}

int MonitorState::AdvanceWindows(std::vector<ClassificationEvent>* events) {
  const int64_t now_window = clock_->NowMs() / options_.window_ms;
  int closed = 0;
  // After a long silence, closing every empty window one by one is pointless: enough of them to
  // mark everyone stale is the same result.
  const int64_t max_empty = options_.stale_after_windows + 1;
  if (now_window - open_window_ > max_empty + 1) {
    CloseWindow(open_window_, events);
    ++closed;
    open_window_ = now_window - max_empty;
  }
  while (open_window_ < now_window) {
    CloseWindow(open_window_, events);
    ++open_window_;
    ++closed;
  }
  return closed;
}

void MonitorState::CloseWindow(int64_t window, std::vector<ClassificationEvent>* events) {
  const int64_t end_ms = (window + 1) * options_.window_ms;
  SpeedEstimator::Closed closed =
      speed_.CloseWindow(window, options_.running_step_bound, reference_speed_,
                         options_.straggler_threshold * reference_speed_);
  median_speed_ = closed.median_speed;
  reference_speed_ = closed.reference_speed;
  last_closed_ = window;

  // Evidence text only for contended nodes: the classifier quotes it for their stragglers.
  std::vector<Contention>& contention = contention_scratch_;
  contention.resize(nodes_.size());
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    contention[n] = node_signals_.Assess(n, end_ms, /*with_evidence=*/false);
    if (contention[n].contended()) contention[n] = node_signals_.Assess(n, end_ms);
  }

  std::vector<StragglerClassifier::Observation>& observed = observed_scratch_;
  observed.clear();
  if (closed.reference_speed > 0) {
    observed.reserve(closed.estimated.size());
    for (uint32_t w : closed.estimated) observed.push_back({w, speed_.Last(w)->relative});
  }
  std::vector<StragglerClassifier::Change>& changes = changes_scratch_;
  changes.clear();
  worker_classifier_.Classify(observed, contention, &changes);
  for (uint32_t w : closed.estimated) {
    const Classification& c = worker_classifier_.Current(w);
    WindowSummary* s = speed_.Last(w);
    s->worker_class = static_cast<uint8_t>(c.worker_class());
    s->persistence = static_cast<uint8_t>(c.persistence());
  }
  for (const auto& change : changes) {
    WorkerRecord& rec = workers_[change.entity];
    rec.class_since_ms = end_ms;
    // A worker that became (or stopped being) a persistent straggler runs in a new regime:
    // its step-time fit starts again from the new regime's steps. Kept, the fit would follow a
    // sudden slowdown over ~1 / (1 - model_forgetting) reports (50 steps) while the windows
    // already show it, and the batch planner, which predicts a plan's gain from the fits,
    // would predict almost none for the plan the window speeds call for. Until the next
    // report the planner uses the window speed (WorkerView: no model).
    auto persistent_straggler = [](const Classification& c) {
      return c.worker_class() == WORKER_CLASS_STRAGGLER && c.persistence() == PERSISTENCE_PERSISTENT;
    };
    if (persistent_straggler(change.previous) != persistent_straggler(change.current))
      rec.model = StepTimeModel(options_.model_forgetting);
    Emit(window, ENTITY_WORKER, rec.id, change, events);
  }

  ServerLatencyTracker::Closed servers = server_latency_.CloseWindow();
  std::vector<StragglerClassifier::Observation> server_obs;
  if (servers.median_latency_ms > 0) {
    for (const auto& sw : servers.servers) {
      // Below the absolute floor no server is hot, whatever the ratio.
      const double r = sw.latency_ms < options_.hot_server_min_latency_ms ? std::max(sw.relative, 1.0)
                                                                           : sw.relative;
      server_obs.push_back({sw.server, r});
    }
  }
  changes.clear();
  server_classifier_.Classify(server_obs, {}, &changes);
  for (const auto& change : changes) {
    servers_[change.entity].class_since_ms = end_ms;
    Emit(window, ENTITY_SERVER, servers_[change.entity].id, change, events);
  }
}

void MonitorState::Emit(int64_t window, EntityKind kind, const std::string& id,
                        const StragglerClassifier::Change& change,
                        std::vector<ClassificationEvent>* events) {
  ClassificationEvent ev;
  ev.set_seq(next_event_seq_++);
  ev.set_time_ms((window + 1) * options_.window_ms);
  ev.set_window(window);
  ev.set_id(id);
  ev.set_kind(kind);
  *ev.mutable_previous() = change.previous;
  *ev.mutable_current() = change.current;
  ev.set_relative_speed(change.relative);
  if (events != nullptr) events->push_back(ev);
  events_.push_back(std::move(ev));
  while (events_.size() > options_.events_kept) events_.pop_front();
}

uint32_t MonitorState::SmoothingWindows(uint32_t w) const {
  // Only a persistent straggler: a normal worker's speed must follow a change (a relaunch that
  // cured it, a burst under the threshold), and the simulator's contention scenarios lose up
  // to 10 % of their gain when every steady worker is smoothed over 10 windows.
  const Classification& c = worker_classifier_.Current(w);
  if (c.worker_class() != WORKER_CLASS_STRAGGLER || c.persistence() != PERSISTENCE_PERSISTENT)
    return options_.smoothed_windows;
  // Windows closed since the classification last changed (class_since_ms is a window's end).
  const int64_t closed_end_ms = (last_closed_ + 1) * options_.window_ms;
  const int64_t held = std::max<int64_t>(0, closed_end_ms - workers_[w].class_since_ms) /
                       options_.window_ms;
  return static_cast<uint32_t>(std::clamp<int64_t>(held, options_.smoothed_windows,
                                                   options_.stable_smoothed_windows));
}

WorkerStatus MonitorState::StatusOf(uint32_t w, bool with_evidence) const {
  WorkerStatus st;
  StatusInto(w, with_evidence, &st);
  return st;
}

void MonitorState::StatusInto(uint32_t w, bool with_evidence, WorkerStatus* out) const {
  const WorkerRecord& rec = workers_[w];
  WorkerStatus& st = *out;
  st.set_id(rec.id);
  st.set_kind(ENTITY_WORKER);
  if (rec.node != StragglerClassifier::kNoNode) st.set_node(nodes_[rec.node].name);
  *st.mutable_classification() =
      with_evidence ? worker_classifier_.Get(w) : worker_classifier_.Current(w);
  if (const WindowSummary* s = speed_.Last(w)) {
    st.set_speed(s->speed);
    st.set_relative_speed(s->relative);
    st.set_compute_s(s->compute_s);
    st.set_comm_s(s->comm_s);
    st.set_data_wait_s(s->data_wait_s);
    st.set_wall_s(s->wall_s);
    const Classification& c = worker_classifier_.Current(w);
    const bool persistent = c.worker_class() == WORKER_CLASS_STRAGGLER &&
                            c.persistence() == PERSISTENCE_PERSISTENT;
    st.set_smoothed_speed(persistent ? speed_.StragglerSpeed(w, SmoothingWindows(w))
                                     : speed_.SmoothedSpeed(w, SmoothingWindows(w)));
  }
  st.set_windows_flagged(worker_classifier_.WindowsFlagged(w));
  st.set_local_batch(rec.last_batch);
  const StepTimeModel::Fit fit = rec.model.Current();
  st.set_model_fixed_s(fit.fixed_s);
  st.set_model_per_sample_s(fit.per_sample_s);
  st.set_last_report_ms(rec.last_report_ms);
  st.set_reports(rec.reports);
  st.set_class_since_ms(rec.class_since_ms);
}

absl::StatusOr<WorkerStatus> MonitorState::Worker(absl::string_view worker_id) const {
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return absl::NotFoundError(absl::StrCat("monitor: unknown worker '", worker_id, "'"));
  return StatusOf(it->second);
}

std::vector<WorkerStatus> MonitorState::Workers(bool with_evidence) const {
  std::vector<WorkerStatus> out;
  out.reserve(workers_.size());
  for (uint32_t w = 0; w < workers_.size(); ++w) out.push_back(StatusOf(w, with_evidence));
  return out;
}

void MonitorState::Workers(std::vector<WorkerStatus>* out, bool with_evidence) const {
  out->resize(workers_.size());
  for (uint32_t w = 0; w < workers_.size(); ++w) {
    (*out)[w].Clear();
    StatusInto(w, with_evidence, &(*out)[w]);
  }
}

std::vector<WorkerStatus> MonitorState::Servers() const {
  std::vector<WorkerStatus> out;
  for (uint32_t s = 0; s < servers_.size(); ++s) {
    WorkerStatus st;
    st.set_id(servers_[s].id);
    st.set_kind(ENTITY_SERVER);
    *st.mutable_classification() = server_classifier_.Get(s);
    st.set_latency_ms(server_latency_.LastLatency(s));
    st.set_windows_flagged(server_classifier_.WindowsFlagged(s));
    st.set_last_report_ms(servers_[s].last_report_ms);
    st.set_reports(servers_[s].reports);
    st.set_class_since_ms(servers_[s].class_since_ms);
    out.push_back(std::move(st));
  }
  // relative_speed of a server = median latency over servers / its latency (1 = typical,
  // below 1 = slower than its peers), as WorkerStatus documents.
  std::vector<double> latencies;
  for (const auto& st : out) {
    if (st.latency_ms() > 0) latencies.push_back(st.latency_ms());
  }
  if (!latencies.empty()) {
    std::nth_element(latencies.begin(), latencies.begin() + latencies.size() / 2, latencies.end());
    const double median = latencies[latencies.size() / 2];
    for (auto& st : out) {
      if (st.latency_ms() > 0) st.set_relative_speed(median / st.latency_ms());
    }
  }
  return out;
}

std::vector<NodeStatus> MonitorState::Nodes(bool with_evidence) const {
  std::vector<NodeStatus> out(nodes_.size());
  std::vector<std::vector<double>> rel(nodes_.size());
  for (uint32_t n = 0; n < nodes_.size(); ++n) out[n].set_node(nodes_[n].name);
  for (uint32_t w = 0; w < workers_.size(); ++w) {
    const uint32_t n = workers_[w].node;
    if (n == StragglerClassifier::kNoNode) continue;
    NodeStatus& ns = out[n];
    ns.set_workers(ns.workers() + 1);
    if (worker_classifier_.Current(w).worker_class() == WORKER_CLASS_STRAGGLER) ns.set_stragglers(ns.stragglers() + 1);
    if (const WindowSummary* s = speed_.Last(w); s != nullptr && s->window == last_closed_) {
      ns.set_total_speed(ns.total_speed() + s->speed);
      if (s->relative > 0) rel[n].push_back(s->relative);
    }
  }
  const int64_t now = clock_->NowMs();
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    out[n].set_median_relative_speed(MedianInPlace(rel[n]));
    const Contention c = node_signals_.Assess(n, now, with_evidence);
    out[n].set_contention_score(c.score);
    if (with_evidence) out[n].set_contention_evidence(c.evidence);
    *out[n].mutable_last_metrics() = node_signals_.Latest(n);
  }
  std::erase_if(out, [](const NodeStatus& n) { return n.node().empty(); });  // free rows
  return out;
}

std::vector<ClassificationEvent> MonitorState::EventsAfter(uint64_t seq, size_t max) const {
  std::vector<ClassificationEvent> out;
  auto it = std::upper_bound(events_.begin(), events_.end(), seq,
                             [](uint64_t s, const ClassificationEvent& e) { return s < e.seq(); });
  for (; it != events_.end() && out.size() < max; ++it) out.push_back(*it);
  return out;
}

absl::StatusOr<std::vector<WindowSummary>> MonitorState::History(absl::string_view worker_id) const {
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return absl::NotFoundError(absl::StrCat("monitor: unknown worker '", worker_id, "'"));
  return speed_.History(it->second);
}

absl::StatusOr<StepTimeModel::Fit> MonitorState::StepModel(absl::string_view worker_id) const {
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return absl::NotFoundError(absl::StrCat("monitor: unknown worker '", worker_id, "'"));
  return workers_[it->second].model.Current();
}

absl::StatusOr<double> MonitorState::PredictStepSeconds(absl::string_view worker_id, uint32_t batch) const {
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return absl::NotFoundError(absl::StrCat("monitor: unknown worker '", worker_id, "'"));
  const StepTimeModel& model = workers_[it->second].model;
  if (model.Current().observations == 0) {
    return absl::FailedPreconditionError(absl::StrCat("monitor: no step reports from '", worker_id, "' yet"));
  }
  return model.Predict(batch);
}

size_t MonitorState::MemoryBytes() const {
  size_t bytes = sizeof(*this) + speed_.MemoryBytes() + node_signals_.MemoryBytes() +
                 server_latency_.MemoryBytes() + worker_classifier_.MemoryBytes() +
                 server_classifier_.MemoryBytes();
  bytes += workers_.capacity() * sizeof(WorkerRecord) + servers_.capacity() * sizeof(ServerRecord);
  for (const WorkerRecord& w : workers_) bytes += w.id.capacity();
  // flat_hash_map: one slot (key + value) plus a control byte per bucket.
  bytes += worker_index_.bucket_count() * (sizeof(std::pair<std::string, uint32_t>) + 1);
  bytes += server_index_.bucket_count() * (sizeof(std::pair<std::string, uint32_t>) + 1);
  bytes += node_index_.bucket_count() * (sizeof(std::pair<std::string, uint32_t>) + 1);
  for (const ClassificationEvent& e : events_) bytes += e.SpaceUsedLong();
  return bytes;
}

}  // namespace pacer
