// MonitorServiceImpl and its gRPC adapter: authentication, request limits, listing, events
// delivered in order, Prometheus series. The server binds port 0 on loopback.
#include "monitor/monitor_service.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/auth.h"
#include "monitor/grpc_monitor_service.h"
#include "monitor/synthetic_trace.h"

namespace pacer {
namespace {

constexpr int64_t kStart = 1'700'000'000'000;

class MonitorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    svc_ = std::move(MonitorServiceImpl::Create(MonitorOptions(), &clock_, &metrics_).value());
  }
  // Feeds `seconds` of a synthetic trace through the service, one request per tick.
  void Feed(SyntheticTrace& trace, int seconds) {
    for (int t = 0; t < seconds; ++t) {
      SyntheticTrace::Batch b = trace.Next();
      ReportStepsRequest req;
      for (auto& s : b.steps) *req.add_steps() = s;
      for (auto& l : b.latency) *req.add_server_latency() = l;
      ReportStepsResponse resp;
      ASSERT_TRUE(svc_->ReportSteps(req, &resp).ok());
      for (auto& m : b.nodes) {
        ReportNodeRequest nreq;
        *nreq.mutable_metrics() = m;
        ReportNodeResponse nresp;
        ASSERT_TRUE(svc_->ReportNode(nreq, &nresp).ok());
      }
    }
  }
  void RegisterAll(const SyntheticTrace& trace) {
    for (size_t i = 0; i < trace.num_workers(); ++i) {
      MonitorRegisterRequest req;
      req.set_worker_id(trace.worker_id(i));
      req.set_node(trace.node_of(i));
      MonitorRegisterResponse resp;
      ASSERT_TRUE(svc_->RegisterWorker(req, &resp).ok());
    }
  }

  SimulatedClock clock_{kStart};
  MetricsRegistry metrics_;
  std::unique_ptr<MonitorServiceImpl> svc_;
};

TEST_F(MonitorServiceTest, ListsWorkersNodesEventsAndPublishesMetrics) {
  SyntheticTraceOptions o;
  o.workers = 12;
  o.servers = 3;
  SyntheticTrace trace(o, &clock_);
  RegisterAll(trace);
  trace.AddSlowdown({SyntheticTrace::SlowdownKind::kHardware, "w4", 1.5, 0});
  std::vector<uint64_t> delivered;
  svc_->SetEventListener([&](const std::vector<ClassificationEvent>& events) {
    for (const auto& e : events) delivered.push_back(e.seq());
  });
  Feed(trace, 70);

  ListWorkersRequest req;
  req.set_max_events(1000);
  ListWorkersResponse resp;
  ASSERT_TRUE(svc_->ListWorkers(req, &resp).ok());
  EXPECT_EQ(resp.workers_size(), 12);
  EXPECT_EQ(resp.servers_size(), 3);
  EXPECT_EQ(resp.nodes_size(), 3);
  EXPECT_EQ(resp.window_ms(), 10'000);
  EXPECT_GT(resp.median_speed(), 0);
  EXPECT_GT(resp.reports_accepted(), 0u);
  for (const WorkerStatus& w : resp.workers()) {
    const WorkerClass want = w.id() == "w4" ? WORKER_CLASS_STRAGGLER : WORKER_CLASS_NORMAL;
    EXPECT_EQ(w.classification().worker_class(), want) << w.id() << ": " << w.classification().evidence();
    EXPECT_GT(w.compute_s(), 0);
    EXPECT_GE(w.wall_s(), w.compute_s());
    EXPECT_GT(w.model_per_sample_s(), 0);
  }
  // Every event was delivered to the listener exactly once and in order.
  ASSERT_FALSE(delivered.empty());
  for (size_t i = 1; i < delivered.size(); ++i) EXPECT_EQ(delivered[i], delivered[i - 1] + 1);
  EXPECT_EQ(static_cast<size_t>(resp.events_size()), delivered.size());
  // Step-time prediction for the planner.
  auto predicted = svc_->PredictStepSeconds("w4", 32);
  ASSERT_TRUE(predicted.ok());
  EXPECT_NEAR(*predicted, 1.5, 0.15);
  EXPECT_EQ(svc_->PredictStepSeconds("nobody", 32).status().code(), absl::StatusCode::kNotFound);

  const std::string text = metrics_.RenderText();
  for (const char* series : {"pacer_monitor_worker_relative_speed{worker=\"w4\"}",
                             "pacer_monitor_worker_class{worker=\"w4\"} 2",
                             "pacer_monitor_worker_step_seconds{phase=\"compute\",worker=\"w0\"}",
                             "pacer_monitor_worker_speed_samples_per_second{worker=\"w1\"}",
                             "pacer_monitor_server_latency_milliseconds{server=\"ps1\"}",
                             "pacer_monitor_workers{class=\"straggler\"} 1",
                             "pacer_monitor_reports_accepted_total"}) {
    EXPECT_NE(text.find(series), std::string::npos) << series;
  }
}

// pacerd's reconciler calls ForgetWorkerHistories when a new run of the job begins
// (controller/run_tracker.h): the last run's straggler must not be this run's.
TEST_F(MonitorServiceTest, ANewRunForgetsTheLastRunsSpeedsAndClassifications) {
  SyntheticTraceOptions o;
  o.workers = 12;
  SyntheticTrace trace(o, &clock_);
  RegisterAll(trace);
  const int64_t run2 = trace.start_ms() + 70'000;
  trace.AddSlowdown({SyntheticTrace::SlowdownKind::kHardware, "w4", 1.5, 0, run2});  // run 1
  trace.AddSlowdown({SyntheticTrace::SlowdownKind::kHardware, "w7", 1.5, run2});     // run 2
  Feed(trace, 70);
  auto classes = [&] {
    ListWorkersRequest req;
    ListWorkersResponse resp;
    EXPECT_TRUE(svc_->ListWorkers(req, &resp).ok());
    std::map<std::string, WorkerStatus> by_id;
    for (const WorkerStatus& w : resp.workers()) by_id[w.id()] = w;
    return by_id;
  };
  ASSERT_EQ(classes()["w4"].classification().worker_class(), WORKER_CLASS_STRAGGLER);

  svc_->ForgetWorkerHistories();
  auto forgotten = classes();
  ASSERT_EQ(forgotten.size(), 12u) << "the roster stays";
  for (const auto& [id, w] : forgotten) {
    EXPECT_EQ(w.classification().worker_class(), WORKER_CLASS_UNKNOWN) << id;
    EXPECT_EQ(w.speed(), 0) << id;
    EXPECT_EQ(w.smoothed_speed(), 0) << id;
    EXPECT_EQ(w.windows_flagged(), 0u) << id;
  }
  // The next run's reports are taken in, and judged on their own.
  Feed(trace, 12);
  auto first = classes();
  EXPECT_NE(first["w4"].classification().worker_class(), WORKER_CLASS_STRAGGLER);
  EXPECT_GT(first["w4"].speed(), 0);
  Feed(trace, 60);
  auto later = classes();
  EXPECT_EQ(later["w7"].classification().worker_class(), WORKER_CLASS_STRAGGLER);
  EXPECT_EQ(later["w4"].classification().worker_class(), WORKER_CLASS_NORMAL);
}

TEST_F(MonitorServiceTest, OversizedRequestIsRefusedWholeAndCounted) {
  ASSERT_TRUE(svc_->RegisterWorker([] {
    MonitorRegisterRequest r;
    r.set_worker_id("w0");
    return r;
  }(), nullptr).ok());
  ReportStepsRequest req;
  for (int i = 0; i < 20'000; ++i) {
    StepReport* s = req.add_steps();
    s->set_worker_id("w0");
    s->set_step(i);
    s->set_local_batch(1);
    s->set_samples(1);
    s->set_compute_s(1);
  }
  ReportStepsResponse resp;
  EXPECT_EQ(svc_->ReportSteps(req, &resp).code(), absl::StatusCode::kInvalidArgument);
  ListWorkersResponse list;
  ASSERT_TRUE(svc_->ListWorkers(ListWorkersRequest(), &list).ok());
  EXPECT_EQ(list.reports_accepted(), 0u);
  EXPECT_EQ(list.rejected_by_reason().at("request_too_large"), 20'000u);
  EXPECT_NE(metrics_.RenderText().find("pacer_monitor_reports_rejected_total{reason=\"request_too_large\"} 20000"),
            std::string::npos);
}

TEST_F(MonitorServiceTest, MixedBatchReportsPerReasonCounts) {
  MonitorRegisterRequest reg;
  reg.set_worker_id("w0");
  reg.set_node("n0");
  ASSERT_TRUE(svc_->RegisterWorker(reg, nullptr).ok());
  ReportStepsRequest req;
  for (int i = 0; i < 4; ++i) {
    StepReport* s = req.add_steps();
    s->set_worker_id(i == 3 ? "ghost" : "w0");
    s->set_step(i == 2 ? 0 : i);  // step 0 twice
    s->set_local_batch(8);
    s->set_samples(8);
    s->set_compute_s(0.5);
    s->set_comm_s(i == 1 ? -1 : 0.1);
    s->set_wall_s(0.6);
  }
  ReportStepsResponse resp;
  ASSERT_TRUE(svc_->ReportSteps(req, &resp).ok());
  EXPECT_EQ(resp.accepted(), 2u);
  EXPECT_EQ(resp.rejected(), 2u);
  EXPECT_EQ(resp.clamped(), 1u);
  EXPECT_EQ(resp.rejected_by_reason().at("duplicate_step"), 1u);
  EXPECT_EQ(resp.rejected_by_reason().at("unknown_worker"), 1u);
  ReportNodeRequest bad;
  bad.mutable_metrics()->set_node("n0");
  bad.mutable_metrics()->set_cpu_steal_frac(-1);
  EXPECT_EQ(svc_->ReportNode(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MonitorServiceTest, GrpcAdapterRequiresTheJobToken) {
  Authenticator auth("job-secret", "admin-secret");
  GrpcMonitorService grpc_service(svc_.get(), &auth);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&grpc_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = Monitor::NewStub(channel);

  MonitorRegisterRequest reg;
  reg.set_worker_id("w0");
  reg.set_node("n0");
  MonitorRegisterResponse reg_resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->RegisterWorker(&ctx, reg, &reg_resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "wrong");
    EXPECT_EQ(stub->RegisterWorker(&ctx, reg, &reg_resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "job-secret");
    EXPECT_TRUE(stub->RegisterWorker(&ctx, reg, &reg_resp).ok());
  }
  ReportStepsRequest req;
  StepReport* s = req.add_steps();
  s->set_worker_id("w0");
  s->set_step(1);
  s->set_local_batch(4);
  s->set_samples(4);
  s->set_compute_s(0.2);
  s->set_wall_s(0.2);
  ReportStepsResponse resp;
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "job-secret");
    ASSERT_TRUE(stub->ReportSteps(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.accepted(), 1u);
  }
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "admin-secret");  // pacerctl workers
    ListWorkersResponse list;
    ASSERT_TRUE(stub->ListWorkers(&ctx, ListWorkersRequest(), &list).ok());
    ASSERT_EQ(list.workers_size(), 1);
    EXPECT_EQ(list.workers(0).node(), "n0");
  }
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "job-secret");
    ReportStepsRequest bad;
    bad.add_steps()->set_worker_id("w0");
    ASSERT_TRUE(stub->ReportSteps(&ctx, bad, &resp).ok());
    EXPECT_EQ(resp.rejected(), 1u);
  }
  server->Shutdown();
}

// MonitorOptions::running_step_bound: a worker that slows down in the middle of a long step
// finishes no step for a while; its heartbeat's running step (NoteRunningStep: samples,
// compute so far) bounds its speed. With the option, the windows in which it finishes nothing
// carry that bound, and it is a persistent straggler after K of them -- before its slow step
// ends -- also in a synchronous job, where the others finish no step while they wait for it (its
// bound is compared with the last window's median). Without it those windows have no estimate
// for it, and nobody is flagged. A step that has only just begun (its bound above the worker's
// speed) adds nothing.
// A job of four workers (w0..w3) whose monitor bounds running steps (or not: `bound`), 1 s
// windows, persistent after 2 of 5.
class RunningStepJob {
 public:
  explicit RunningStepJob(bool bound) {
    MonitorOptions o;
    o.window_ms = 1'000;
    o.persistent_k = 2;
    o.persistent_w = 5;
    o.running_step_bound = bound;
    svc_ = std::move(MonitorServiceImpl::Create(o, &clock_, &metrics_).value());
    for (const auto& id : ids_) {
      MonitorRegisterRequest req;
      req.set_worker_id(id);
      req.set_node("n-" + id);
      MonitorRegisterResponse resp;
      EXPECT_TRUE(svc_->RegisterWorker(req, &resp).ok());
    }
  }
  MonitorServiceImpl& svc() { return *svc_; }
  // 0.5 s pass: every worker ends a step of 400 samples in 0.5 s (800/s), or none (`quiet`).
  void HalfSecond(bool quiet) {
    clock_.AdvanceMs(500);
    ReportStepsRequest req;
    ++step_;
    for (const auto& id : ids_) {
      if (quiet) break;
      StepReport* r = req.add_steps();
      r->set_worker_id(id);
      r->set_step(step_);
      r->set_local_batch(400);
      r->set_samples(400);
      r->set_compute_s(0.5);
      r->set_wall_s(0.5);
      r->set_time_ms(clock_.NowMs() - 1);
    }
    ReportStepsResponse resp;
    EXPECT_TRUE(svc_->ReportSteps(req, &resp).ok());
    svc_->Tick();
  }
  void ExpectOthersNormal() {
    for (const std::string id : {"w0", "w2", "w3"})
      EXPECT_EQ(svc_->Worker(id)->classification().worker_class(), WORKER_CLASS_NORMAL) << id;
  }

 private:
  SimulatedClock clock_{kStart};
  MetricsRegistry metrics_;
  std::unique_ptr<MonitorServiceImpl> svc_;
  const std::vector<std::string> ids_ = {"w0", "w1", "w2", "w3"};
  uint64_t step_ = 0;
};

// MonitorOptions::running_step_bound: a worker that slows down in the middle of a long step
// finishes no step for a while; its heartbeat's running step (NoteRunningStep: samples,
// compute so far) bounds its speed. With the option, the windows in which it finishes nothing
// carry that bound, and it is a persistent straggler after K of them -- before its slow step
// ends -- also in a synchronous job, where the others finish no step while they wait for it (its
// bound is compared with the last window's median). Without it those windows have no estimate
// for it, and nobody is flagged. A step that has only just begun (its bound above the worker's
// speed) adds nothing.
class RunningStepBoundTest : public ::testing::TestWithParam<bool> {};

TEST_P(RunningStepBoundTest, AWorkerSlowedMidStepIsFlaggedBeforeTheStepEnds) {
  const bool bound = GetParam();
  RunningStepJob job(bound);
  MonitorServiceImpl* svc = &job.svc();
  for (int i = 0; i < 12; ++i) job.HalfSecond(false);
  ASSERT_EQ(svc->Worker("w1")->classification().worker_class(), WORKER_CLASS_NORMAL);

  // w1's step began at the last report and has slowed down: its heartbeats say it has computed
  // 0.5, 1.0, ... 2.5 s of a 0.5 s step. A synchronous job: the others wait for it in the
  // all-reduce and finish no step either, so w1's bounds are compared with the last window's
  // median. A note made right after it began is above its speed,
  // and so is the first window's (0.5 s: 800/s), which bound nothing; the next two windows'
  // notes (1.5 s, 2.5 s) are below the threshold.
  svc->NoteRunningStep("w1", 400, 0.1);
  for (int i = 1; i <= 5; ++i) {
    job.HalfSecond(true);
    svc->NoteRunningStep("w1", 400, 0.5 * i);
  }
  job.HalfSecond(true);
  const WorkerStatus w1 = svc->Worker("w1").value();
  if (bound) {
    EXPECT_EQ(w1.classification().worker_class(), WORKER_CLASS_STRAGGLER) << w1.ShortDebugString();
    EXPECT_EQ(w1.classification().persistence(), PERSISTENCE_PERSISTENT) << w1.ShortDebugString();
    EXPECT_LE(w1.speed(), 400 / 2.5 + 1) << "the bound of the window's newest note: 400 samples, 2.5 s so far";
    EXPECT_EQ(w1.windows_flagged(), 2u);
    // The speed a batch plan is made at: the newest bound of the running step, the tightest --
    // not the median of the last three windows, one of them from before the slowdown (800/s)
    // and one the same step's looser bound (400 / 1.5 s).
    EXPECT_NEAR(w1.smoothed_speed(), 400 / 2.5, 1) << w1.ShortDebugString();
  } else {
    EXPECT_NE(w1.classification().worker_class(), WORKER_CLASS_STRAGGLER) << w1.ShortDebugString();
  }
  job.ExpectOthersNormal();
}

INSTANTIATE_TEST_SUITE_P(Option, RunningStepBoundTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "On" : "Off"; });

// The running step's progress (HeartbeatStepTiming.samples_done / done_compute_s): a worker
// slowed tenfold (800/s to 80/s) at the start of a step computes it in slices of 100 samples,
// 1.25 s each. Its bound, 400 samples / compute so far, stays far above its speed for the
// whole step (160/s after 2.5 s); its progress measures it: 200 samples in 2.5 s, 80/s. A
// batch plan made before the step ends plans it at 80/s, not at twice that. A progress that
// does not fit the step (more samples done than it computes; done after its compute so far)
// is not used: the bound alone counts, as from an SDK that sends none.
enum class Progress { kNone, kMeasured, kMoreThanTheStep, kLaterThanTheStep };

class RunningStepProgressTest : public ::testing::TestWithParam<Progress> {};

TEST_P(RunningStepProgressTest, ASlowedWorkerIsPlannedAtItsMeasuredSpeed) {
  RunningStepJob job(/*bound=*/true);
  MonitorServiceImpl* svc = &job.svc();
  for (int i = 0; i < 12; ++i) job.HalfSecond(false);
  for (int i = 1; i <= 5; ++i) {
    job.HalfSecond(true);
    const double compute = 0.5 * i;
    const uint64_t slices = static_cast<uint64_t>(compute / 1.25);  // done by now
    uint64_t done = slices * 100;
    double done_at = static_cast<double>(slices) * 1.25;
    switch (GetParam()) {
      case Progress::kNone: done = 0, done_at = 0; break;
      case Progress::kMeasured: break;
      case Progress::kMoreThanTheStep: done = done > 0 ? 401 : 0; break;
      case Progress::kLaterThanTheStep: done_at = done > 0 ? compute + 0.1 : 0; break;
    }
    svc->NoteRunningStep("w1", 400, compute, done, done_at);
  }
  job.HalfSecond(true);
  const WorkerStatus w1 = svc->Worker("w1").value();
  EXPECT_EQ(w1.classification().worker_class(), WORKER_CLASS_STRAGGLER) << w1.ShortDebugString();
  EXPECT_EQ(w1.classification().persistence(), PERSISTENCE_PERSISTENT) << w1.ShortDebugString();
  const double planned = GetParam() == Progress::kMeasured ? 200 / 2.5 : 400 / 2.5;
  EXPECT_NEAR(w1.smoothed_speed(), planned, 1) << w1.ShortDebugString();
  EXPECT_NEAR(w1.speed(), planned, 1) << w1.ShortDebugString();
  job.ExpectOthersNormal();
}

INSTANTIATE_TEST_SUITE_P(
    Heartbeat, RunningStepProgressTest,
    ::testing::Values(Progress::kNone, Progress::kMeasured, Progress::kMoreThanTheStep,
                      Progress::kLaterThanTheStep),
    [](const ::testing::TestParamInfo<Progress>& p) {
      switch (p.param) {
        case Progress::kNone: return "None";
        case Progress::kMeasured: return "Measured";
        case Progress::kMoreThanTheStep: return "MoreThanTheStep";
        case Progress::kLaterThanTheStep: return "LaterThanTheStep";
      }
      return "";
    });

}  // namespace
}  // namespace pacer
