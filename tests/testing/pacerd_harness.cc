#include "tests/testing/pacerd_harness.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/auth.h"

namespace pacer::testing {

namespace {
// Whole seconds on a round epoch, so windows (aligned to multiples of window_ms) start at the
// test's time zero.
constexpr int64_t kEpochMs = 1'700'000'000'000;

LocalBatch InitialBatch(uint32_t batch) {
  LocalBatch b;
  b.micro_batch = batch;
  return b;
}
}  // namespace

std::string TestPolicy(const std::string& name) {
  return std::string(PACER_TEST_POLICY_DIR) + "/" + name + ".yaml";
}

PacerdHarness::PacerdHarness(HarnessOptions options)
    : clock_(options.start_ms > 0 ? options.start_ms : kEpochMs),
      harness_options_(std::move(options)) {
  options_.data_dir =
      harness_options_.data_dir.empty() ? dir_.Sub("data") : harness_options_.data_dir;
  options_.listen = "127.0.0.1:0";
  options_.metrics_listen = "";
  const std::string& p = harness_options_.policy;
  if (!p.empty()) {
    const std::string source = p.find('/') != std::string::npos ? p : TestPolicy(p);
    std::ifstream in(source);
    if (!in) ADD_FAILURE() << "no test policy " << source;
    options_.policy_file = dir_.Sub("policy.yaml");
    std::ofstream(options_.policy_file) << in.rdbuf();
  }
  if (harness_options_.reconcile_interval_ms > 0) {
    options_.reconciler.interval_ms = harness_options_.reconcile_interval_ms;
  } else if (!harness_options_.real_clock) {
    options_.reconciler.interval_ms = 1000;
  }
  options_.housekeeping = harness_options_.real_clock;
  if (harness_options_.adjust) harness_options_.adjust(options_);
  if (harness_options_.start) Start();
}

PacerdHarness::~PacerdHarness() { Stop(); }

const Clock* PacerdHarness::clock() const {
  return harness_options_.real_clock ? static_cast<const Clock*>(RealClock::Get()) : &clock_;
}

void PacerdHarness::Start() {
  if (absl::Status s = TryStart(); !s.ok()) ADD_FAILURE() << "pacerd did not start: " << s;
}

absl::Status PacerdHarness::TryStart() {
  Stop();
  auto d = Pacerd::Start(options_, clock());
  if (!d.ok()) return d.status();
  pacerd_ = std::move(*d);
  // The next start keeps the port (clients keep their address).
  options_.listen = pacerd_->address();
  channel_ = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
  return absl::OkStatus();
}

void PacerdHarness::Stop() {
  if (pacerd_) pacerd_->Shutdown();
  pacerd_.reset();
}

void PacerdHarness::Restart() {
  Stop();
  Start();
}

void PacerdHarness::Advance(int64_t ms) {
  clock_.AdvanceMs(ms);
  pacerd_->HousekeepingStep();
}

ListActionsResponse PacerdHarness::Actions(uint32_t limit) {
  auto stub = ControllerService::NewStub(channel_);
  grpc::ClientContext ctx;
  AttachToken(&ctx, pacerd_->admin_token());
  ListActionsRequest req;
  req.set_limit(limit);
  ListActionsResponse resp;
  grpc::Status s = stub->ListActions(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

ScriptedWorker::ScriptedWorker(PacerdHarness& harness, Options options)
    : h_(harness), options_(std::move(options)), plan_(InitialBatch(options_.batch)) {
  if (options_.node.empty()) options_.node = "n-" + options_.id;
}

absl::Status ScriptedWorker::Connect() {
  auto cred = MintCredential(h_.job_token(), CredentialKind::kWorker, options_.id);
  if (!cred.ok()) return cred.status();
  credential_ = *cred;
  ShardingClientOptions co;
  co.address = h_.address();
  co.token = credential_;
  co.worker_id = options_.id;
  co.node = options_.node;
  co.run_id = options_.run_id;
  auto c = ShardingClient::Connect(co);
  if (!c.ok()) return c.status();
  sharding_ = std::move(*c);
  monitor_ = Monitor::NewStub(h_.channel());
  grpc::ClientContext ctx;
  AttachToken(&ctx, credential_);
  MonitorRegisterRequest req;
  req.set_worker_id(options_.id);
  req.set_node(options_.node);
  MonitorRegisterResponse resp;
  grpc::Status s = monitor_->RegisterWorker(&ctx, req, &resp);
  return s.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

int64_t ScriptedWorker::batch() { return static_cast<int64_t>(plan_.ForStep(step_).samples()); }

absl::Status ScriptedWorker::Step(double compute_s, double wall_s, double comm_s, int64_t samples) {
  ++step_;
  const LocalBatch& b = plan_.ForStep(step_);
  ReportStepsRequest req;
  StepReport* r = req.add_steps();
  r->set_worker_id(options_.id);
  r->set_step(step_);
  r->set_local_batch(b.micro_batch);
  r->set_samples(samples >= 0 ? static_cast<uint64_t>(samples) : b.samples());
  r->set_compute_s(compute_s);
  r->set_comm_s(comm_s >= 0 ? comm_s : std::max(0.0, wall_s - compute_s));
  r->set_wall_s(wall_s);
  r->set_time_ms(h_.clock()->NowMs());
  grpc::ClientContext ctx;
  AttachToken(&ctx, credential_);
  ReportStepsResponse resp;
  grpc::Status s = monitor_->ReportSteps(&ctx, req, &resp);
  return s.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::StatusOr<HeartbeatResponse> ScriptedWorker::Heartbeat() { return Heartbeat({}); }

absl::StatusOr<HeartbeatResponse> ScriptedWorker::Heartbeat(
    const std::vector<HeartbeatStepTiming>& timings) {
  HeartbeatRequest hb;
  for (const HeartbeatStepTiming& t : timings) *hb.add_step_timings() = t;
  hb.set_step(step_);
  hb.set_plan_version(plan_.newest_version());
  hb.set_exclusion_version(exclusion_version_);
  hb.set_honors_exclusion(options_.honors_exclusion);
  hb.set_max_local_batch(options_.max_local_batch);
  auto r = sharding_->Heartbeat(hb);
  if (!r.ok()) return r.status();
  for (const WorkerCommand& c : r->commands()) {
    if (c.has_batch_plan()) plan_.Offer(c.batch_plan());
    if (c.has_exclusion()) received_.push_back({exclusion_version_, options_.honors_exclusion, c.exclusion()});
    if (c.has_exclusion() && c.exclusion().version() > exclusion_version_) {
      exclusion_version_ = c.exclusion().version();
      excluded_ = c.exclusion().excluded();
    }
  }
  return r;
}

ScriptedJob::ScriptedJob(PacerdHarness& harness, Options options) : h_(harness), o_(options) {
  for (int i = 0; i < o_.workers; ++i) {
    ScriptedWorker::Options wo;
    wo.id = "w" + std::to_string(i);
    wo.node = "n" + std::to_string(i);
    wo.batch = o_.batch;
    wo.honors_exclusion = o_.honors_exclusion;
    workers_.push_back(std::make_unique<ScriptedWorker>(h_, wo));
  }
}

absl::Status ScriptedJob::Connect() {
  for (auto& w : workers_) {
    if (absl::Status s = w->Connect(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

ScriptedWorker& ScriptedJob::worker(const std::string& id) {
  for (auto& w : workers_)
    if (w->id() == id) return *w;
  ADD_FAILURE() << "no scripted worker " << id;
  return *workers_.front();
}

absl::Status ScriptedJob::Run(int64_t ms) {
  for (int64_t t = 0; t < ms; t += o_.tick_ms) {
    h_.Advance(o_.tick_ms);
    elapsed_ms_ += o_.tick_ms;
    ++step_;
    auto speed = [&](const ScriptedWorker& w) {
      auto it = speed_.find(w.id());
      return it == speed_.end() ? 1.0 : it->second;
    };
    double slowest = 0;
    for (auto& w : workers_) {
      if (dead_.count(w->id()) || w->excluded()) continue;
      slowest = std::max(slowest, static_cast<double>(w->batch()) * o_.per_sample_s / speed(*w));
    }
    for (auto& w : workers_) {
      if (dead_.count(w->id())) continue;
      const int64_t samples = w->excluded() ? std::max<int64_t>(1, w->batch() / 4) : w->batch();
      const double compute = static_cast<double>(samples) * o_.per_sample_s / speed(*w);
      const double wall = std::max(slowest, compute) + o_.comm_s;
      w->set_step(step_ - 1);
      if (absl::Status s = w->Step(compute, wall, wall - compute, samples); !s.ok()) return s;
    }
    if (elapsed_ms_ % o_.heartbeat_ms == 0) {
      if (absl::Status s = Heartbeats(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ScriptedJob::Heartbeats() {
  for (auto& w : workers_) {
    if (dead_.count(w->id())) continue;
    if (auto r = w->Heartbeat(); !r.ok()) return r.status();
  }
  return absl::OkStatus();
}

}  // namespace pacer::testing
