#include "monitor/monitor_service.h"

#include "absl/strings/str_cat.h"
#include "common/step_number.h"

namespace pacer {

absl::StatusOr<std::unique_ptr<MonitorServiceImpl>> MonitorServiceImpl::Create(
    const MonitorOptions& options, const Clock* clock, MetricsRegistry* metrics) {
  auto state = MonitorState::Create(options, clock);
  if (!state.ok()) return state.status();
  return std::unique_ptr<MonitorServiceImpl>(new MonitorServiceImpl(std::move(*state), metrics));
}

namespace {
MetricsRegistry* OrOwn(MetricsRegistry* given, std::unique_ptr<MetricsRegistry>& own) {
  if (given != nullptr) return given;
  own = std::make_unique<MetricsRegistry>();
  return own.get();
}
}  // namespace

MonitorServiceImpl::MonitorServiceImpl(std::unique_ptr<MonitorState> state, MetricsRegistry* metrics)
    : bound_running_(state->options().running_step_bound),
      state_(std::move(state)),
      metrics_(OrOwn(metrics, own_metrics_)) {}

void MonitorServiceImpl::AdvanceLocked() {
  const size_t before = pending_.size();
  const int closed = state_->AdvanceWindows(&pending_);
  if (closed == 0) return;
  metrics_.CountWindows(closed, pending_.size() - before);
  metrics_.Publish(state_->median_speed(), state_->Workers(), state_->Servers(),
                   state_->options().window_ms);
}

void MonitorServiceImpl::DeliverEvents() {
  absl::MutexLock deliver(&listener_mu_);
  std::vector<ClassificationEvent> batch;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(pending_);
  }
  if (!batch.empty() && listener_) listener_(batch);
}

void MonitorServiceImpl::Tick() {
  {
    absl::MutexLock lock(&mu_);
    AdvanceLocked();
  }
  DeliverEvents();
}

MonitorOptions MonitorServiceImpl::Options() const {
  absl::MutexLock l(&mu_);
  return state_->options();
}

absl::Status MonitorServiceImpl::UpdateDetection(const MonitorOptions& options) {
  absl::MutexLock l(&mu_);
  absl::Status s = state_->UpdateDetection(options);
  bound_running_.store(state_->options().running_step_bound, std::memory_order_relaxed);
  return s;
}

void MonitorServiceImpl::SetEventListener(EventListener listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

absl::Status MonitorServiceImpl::RegisterWorker(const MonitorRegisterRequest& req,
                                                MonitorRegisterResponse* resp) {
  absl::MutexLock lock(&mu_);
  return state_->RegisterWorker(req.worker_id(), req.node());
}

void MonitorServiceImpl::ForgetWorkerHistories() {
  absl::MutexLock lock(&mu_);
  state_->ForgetWorkerHistories();
}

void MonitorServiceImpl::NoteRunningStep(absl::string_view worker_id, uint64_t samples, double compute_s,
                                         uint64_t samples_done, double done_compute_s) {
  // Every heartbeat of every worker comes here: without the setting, not even the lock.
  if (!bound_running_.load(std::memory_order_relaxed)) return;
  {
    absl::MutexLock lock(&mu_);
    if (!state_->options().running_step_bound) return;
    AdvanceLocked();
    state_->NoteRunningStep(worker_id, samples, compute_s, samples_done, done_compute_s);
  }
  DeliverEvents();
}

absl::Status MonitorServiceImpl::ReportSteps(const ReportStepsRequest& req, ReportStepsResponse* resp) {
  std::vector<StepReport> accepted_steps;
  {
    absl::MutexLock lock(&mu_);
    const uint32_t limit = state_->options().max_reports_per_request;
    if (static_cast<uint32_t>(req.steps_size()) > limit ||
        static_cast<uint32_t>(req.server_latency_size()) > limit) {
      state_->CountIssue(ReportIssue::kRequestTooLarge, req.steps_size() + req.server_latency_size());
      metrics_.CountReports(state_->accepted(), state_->issues());
      return absl::InvalidArgumentError(absl::StrCat(
          "monitor: ", req.steps_size(), " steps / ", req.server_latency_size(),
          " latency samples in one request; the limit is ", limit, " each"));
    }
    for (const StepReport& step : req.steps()) {
      if (absl::Status s = CheckStepNumber(step.step(), step.worker_id(), "monitor: report steps"); !s.ok()) {
        return s;
      }
    }
    AdvanceLocked();
    const uint64_t clamped_before = state_->issues().Get(ReportIssue::kClampedComm) +
                                    state_->issues().Get(ReportIssue::kClampedDataWait) +
                                    state_->issues().Get(ReportIssue::kClampedWall);
    uint32_t accepted = 0, rejected = 0;
    auto count = [&](ReportIssue issue) {
      if (issue == ReportIssue::kNone) {
        ++accepted;
      } else {
        ++rejected;
        (*resp->mutable_rejected_by_reason())[ReportIssueName(issue)] += 1;
      }
    };
    StepObserver* observer = step_observer_.load();
    for (const StepReport& step : req.steps()) {
      const ReportIssue issue = state_->IngestStep(step);
      count(issue);
      if (observer && issue == ReportIssue::kNone) accepted_steps.push_back(step);
    }
    for (const ServerLatency& sample : req.server_latency()) count(state_->IngestServerLatency(sample));
    const uint64_t clamped_after = state_->issues().Get(ReportIssue::kClampedComm) +
                                   state_->issues().Get(ReportIssue::kClampedDataWait) +
                                   state_->issues().Get(ReportIssue::kClampedWall);
    resp->set_accepted(accepted);
    resp->set_rejected(rejected);
    resp->set_clamped(static_cast<uint32_t>(clamped_after - clamped_before));
    metrics_.CountReports(state_->accepted(), state_->issues());
  }
  if (StepObserver* observer = step_observer_.load(); observer && !accepted_steps.empty()) {
    observer->OnAcceptedSteps(accepted_steps);
  }
  DeliverEvents();
  return absl::OkStatus();
}

absl::Status MonitorServiceImpl::ReportNode(const ReportNodeRequest& req, ReportNodeResponse* resp) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    AdvanceLocked();
    const ReportIssue issue = state_->IngestNodeMetrics(req.metrics());
    metrics_.CountReports(state_->accepted(), state_->issues());
    if (issue != ReportIssue::kNone) {
      status = issue == ReportIssue::kTooManyEntities
                   ? absl::ResourceExhaustedError("monitor: node table is full")
                   : absl::InvalidArgumentError(
                         absl::StrCat("monitor: node metrics refused: ", ReportIssueName(issue)));
    }
  }
  DeliverEvents();
  return status;
}

absl::Status MonitorServiceImpl::ListWorkers(const ListWorkersRequest& req, ListWorkersResponse* resp) {
  {
    absl::MutexLock lock(&mu_);
    AdvanceLocked();
    resp->set_window(state_->last_closed_window());
    resp->set_window_ms(state_->options().window_ms);
    resp->set_median_speed(state_->median_speed());
    for (WorkerStatus& w : state_->Workers()) *resp->add_workers() = std::move(w);
    for (WorkerStatus& s : state_->Servers()) *resp->add_servers() = std::move(s);
    for (NodeStatus& n : state_->Nodes()) *resp->add_nodes() = std::move(n);
    for (ClassificationEvent& e : state_->EventsAfter(req.events_after_seq(), req.max_events())) {
      *resp->add_events() = std::move(e);
    }
    for (const auto& [reason, n] : state_->issues().ToMap()) (*resp->mutable_rejected_by_reason())[reason] = n;
    resp->set_reports_accepted(state_->accepted());
  }
  DeliverEvents();
  return absl::OkStatus();
}

absl::StatusOr<WorkerStatus> MonitorServiceImpl::Worker(absl::string_view worker_id) const {
  absl::MutexLock lock(&mu_);
  return state_->Worker(worker_id);
}

absl::StatusOr<double> MonitorServiceImpl::PredictStepSeconds(absl::string_view worker_id,
                                                              uint32_t batch) const {
  absl::MutexLock lock(&mu_);
  return state_->PredictStepSeconds(worker_id, batch);
}

absl::StatusOr<std::vector<WindowSummary>> MonitorServiceImpl::History(absl::string_view worker_id) const {
  absl::MutexLock lock(&mu_);
  return state_->History(worker_id);
}

size_t MonitorServiceImpl::MemoryBytes() const {
  absl::MutexLock lock(&mu_);
  return state_->MemoryBytes();
}

}  // namespace pacer
