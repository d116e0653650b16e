// EXCLUDE_WORKERS through pacerd, in process on a simulated clock (real gRPC on loopback, real
// RocksDB): workers report steps to the monitor and heartbeat as the SDK does (announcing
// whether their trainer honors exclusion and which exclusion version they hold, applying the
// ExclusionCommands of the replies). One worker goes through a short burst at a quarter of its
// speed; while excluded it reports probe steps, as pacer-train-mlp does.
//  - The burst leads to an exclusion that reaches exactly that worker, and once its probe
//    speed is back, to a re-inclusion; versions only move forward; the audit says where the
//    commands went.
//  - Nobody is excluded while one live worker's trainer cannot carry an exclusion out, and an
//    exclusion in force ends when such a worker joins.
//  - The exclusion in force survives a pacerd restart and is re-sent under a version no worker
//    can hold with a different state.
// Also: ShardReader::ReleaseAll hands an excluded worker's leases back, so another worker
// finishes the epoch, each record counted exactly once.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

using namespace std::chrono_literals;
using testing::WaitFor;

// A burst of 4 s is never persistent (5 of 5 windows), so no batch plan gets in the way.
constexpr char kPolicy[] = R"(version: 1
name: test-burst
policy: non-dedicated
detection:
  straggler_threshold: 0.8
  leader_threshold: 1.2
  window_s: 1
  persistent_windows: 5
  history_windows: 5
  min_confidence: 0.1
actions:
  adjust_batch:
    enabled: true
    accumulation: false
    hysteresis: 0.15
    lead_heartbeats: 3
    min_steps_ahead: 2
  restart:
    enabled: false
  burst_exclusion:
    max_workers: 1
safety:
  min_gain: 0.05
  cooldown_s: 1
  adjust_batch_cooldown_s: 1
  max_actions_per_window: 100
  min_live_workers: 2
  rollback:
    enabled: false
)";

constexpr int kWorkers = 4;
constexpr uint32_t kBatch = 64;
constexpr double kComputeS = 0.04;  // per step of kBatch at full speed

// What a worker's SDK holds and says in its heartbeats.
struct SimWorker {
  std::string id;
  bool honors = true;
  uint64_t exclusion_version = 0;
  bool excluded = false;
  double speed_factor = 1;  // 1 = full speed
  uint64_t commands = 0;    // exclusion commands applied
};

class ExclusionTest : public ::testing::Test {
 protected:
  void StartPacerd() {
    std::ofstream(dir_.Sub("policy.yaml")) << kPolicy;
    PacerdOptions o;
    o.data_dir = dir_.Sub("data");
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    o.policy_file = dir_.Sub("policy.yaml");
    o.reconciler.interval_ms = 1000;
    o.housekeeping = false;  // the script ticks the monitor and reconciles
    auto d = Pacerd::Start(o, &clock_);
    ASSERT_TRUE(d.ok()) << d.status();
    pacerd_ = std::move(*d);
    channel_ = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
    monitor_ = Monitor::NewStub(channel_);
    clients_.clear();
    for (auto& w : workers_) {
      ShardingClientOptions co;
      co.address = pacerd_->address();
      co.token = pacerd_->job_token();
      co.worker_id = w.id;
      co.node = "n-" + w.id;
      auto c = ShardingClient::Connect(co);
      ASSERT_TRUE(c.ok()) << c.status();
      clients_[w.id] = std::move(*c);
      grpc::ClientContext ctx;
      AttachToken(&ctx, pacerd_->job_token());
      MonitorRegisterRequest req;
      req.set_worker_id(w.id);
      req.set_node(co.node);
      MonitorRegisterResponse resp;
      ASSERT_TRUE(monitor_->RegisterWorker(&ctx, req, &resp).ok());
    }
  }

  void SetUp() override {
    for (int i = 0; i < kWorkers; ++i) workers_.push_back({"w" + std::to_string(i)});
  }

  SimWorker& W(const std::string& id) {
    for (auto& w : workers_)
      if (w.id == id) return w;
    ADD_FAILURE() << "no worker " << id;
    return workers_[0];
  }

  // One heartbeat per worker, applying the exclusion commands as the SDK does.
  void Heartbeats() {
    for (auto& w : workers_) {
      HeartbeatRequest hb;
      hb.set_step(step_);
      hb.set_honors_exclusion(w.honors);
      hb.set_exclusion_version(w.exclusion_version);
      auto r = clients_[w.id]->Heartbeat(hb);
      ASSERT_TRUE(r.ok()) << r.status();
      for (const auto& cmd : r->commands()) {
        if (!cmd.has_exclusion()) continue;
        ASSERT_TRUE(w.honors) << "an exclusion command went to " << w.id << ", which cannot carry it out";
        ASSERT_GT(cmd.exclusion().version(), w.exclusion_version) << "versions only move forward";
        w.exclusion_version = cmd.exclusion().version();
        w.excluded = cmd.exclusion().excluded();
        ++w.commands;
      }
    }
  }

  // `seconds` of 10 steps/s; heartbeat, monitor tick and reconcile once a second. An excluded
  // worker reports a probe of a quarter batch, as pacer-train-mlp does; the others a full one.
  void Run(int seconds) {
    for (int tick = 0; tick < seconds * 10; ++tick) {
      clock_.AdvanceMs(100);
      ++step_;
      ReportStepsRequest req;
      double slowest = 0;
      for (const auto& w : workers_) {
        if (!w.excluded) slowest = std::max(slowest, kComputeS / w.speed_factor);
      }
      for (const auto& w : workers_) {
        const uint32_t samples = w.excluded ? kBatch / 4 : kBatch;
        const double compute = kComputeS * samples / kBatch / w.speed_factor;
        StepReport* r = req.add_steps();
        r->set_worker_id(w.id);
        r->set_step(step_);
        r->set_local_batch(kBatch);
        r->set_samples(samples);
        r->set_compute_s(compute);
        const double wall = std::max(slowest, compute) + 0.005;
        r->set_comm_s(wall - compute);
        r->set_wall_s(wall);
        r->set_time_ms(clock_.NowMs());
      }
      grpc::ClientContext ctx;
      AttachToken(&ctx, pacerd_->job_token());
      ReportStepsResponse resp;
      ASSERT_TRUE(monitor_->ReportSteps(&ctx, req, &resp).ok());
      if (tick % 10 == 9) {
        ASSERT_NO_FATAL_FAILURE(Heartbeats());
        pacerd_->monitor()->Tick();
        pacerd_->reconciler()->MaybeReconcile();
        ASSERT_NO_FATAL_FAILURE(Heartbeats());  // the new decision reaches the workers
      }
    }
  }

  ListActionsResponse Actions() {
    auto ctl = ControllerService::NewStub(channel_);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    ListActionsResponse actions;
    EXPECT_TRUE(ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok());
    return actions;
  }
  std::vector<ActionRecord> Exclusions() {
    std::vector<ActionRecord> out;
    const ListActionsResponse a = Actions();
    for (auto it = a.actions().rbegin(); it != a.actions().rend(); ++it) {  // oldest first
      if (it->kind() == "EXCLUDE_WORKERS" && it->outcome() == "executed") out.push_back(*it);
    }
    return out;
  }

  testing::TempDir dir_;
  SimulatedClock clock_{RealClock::Get()->NowMs()};
  std::unique_ptr<Pacerd> pacerd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Monitor::Stub> monitor_;
  std::map<std::string, std::unique_ptr<ShardingClient>> clients_;
  std::vector<SimWorker> workers_;
  uint64_t step_ = 0;
};

TEST_F(ExclusionTest, ABurstIsExcludedAndTheWorkerIsWaitedForAgainWhenItRecovers) {
  ASSERT_NO_FATAL_FAILURE(StartPacerd());
  ASSERT_NO_FATAL_FAILURE(Run(6));
  EXPECT_TRUE(Exclusions().empty()) << "nobody is excluded at equal speeds";
  for (const auto& w : workers_) EXPECT_FALSE(w.excluded);

  W("w3").speed_factor = 0.25;  // a burst of contention
  ASSERT_NO_FATAL_FAILURE(Run(4));
  ASSERT_TRUE(W("w3").excluded) << "the burst is excluded within 4 s";
  for (const auto& w : workers_) {
    if (w.id != "w3") {
      EXPECT_FALSE(w.excluded) << w.id;
    }
  }
  const auto [version, who] = pacerd_->reconciler()->Exclusion();
  EXPECT_EQ(who, std::vector<std::string>{"w3"});
  std::vector<ActionRecord> ex = Exclusions();
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].id(), version) << "the command's version is the decision's audit id";
  EXPECT_EQ(ex[0].target(), "w3");
  EXPECT_GT(ex[0].predicted_gain(), 0.05);
  EXPECT_EQ(ex[0].dispatch(), "sent in heartbeat replies: excluded w3");
  EXPECT_EQ(W("w3").exclusion_version, version);
  EXPECT_EQ(W("w0").exclusion_version, version) << "every honoring worker holds the version";

  // While the burst lasts, the probe keeps showing it slow: still excluded, no flapping.
  ASSERT_NO_FATAL_FAILURE(Run(3));
  EXPECT_TRUE(W("w3").excluded);
  EXPECT_EQ(Exclusions().size(), 1u);

  W("w3").speed_factor = 1;  // the burst is over; only the probe can show it
  ASSERT_NO_FATAL_FAILURE(Run(4));
  EXPECT_FALSE(W("w3").excluded) << "re-included once its probe speed is back";
  ex = Exclusions();
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[1].target(), "w3");
  EXPECT_NE(ex[1].reason().find("burst over"), std::string::npos) << ex[1].reason();
  EXPECT_EQ(ex[1].dispatch(), "sent in heartbeat replies: every worker counted");
  EXPECT_GT(W("w3").exclusion_version, ex[0].id());
  EXPECT_EQ(W("w3").commands, 2u);

  // Workers that hold the version get nothing again.
  HeartbeatRequest hb;
  hb.set_honors_exclusion(true);
  hb.set_exclusion_version(W("w3").exclusion_version);
  auto r = clients_["w3"]->Heartbeat(hb);
  ASSERT_TRUE(r.ok());
  // Exclusion commands only: this request holds no batch plan (plan_version 0), so whether the
  // reply carries one depends on whether the reconciler made one, and pacerd's housekeeping
  // thread also reconciles, on its own real-time schedule, between the scripted ticks (about
  // half of the runs carried batch_plan v2 here).
  int exclusions = 0;
  for (const auto& cmd : r->commands()) exclusions += cmd.has_exclusion();
  EXPECT_EQ(exclusions, 0) << r->ShortDebugString();
}

TEST_F(ExclusionTest, NobodyIsExcludedWhileALiveWorkerCannotCarryItOut) {
  W("w1").honors = false;  // e.g. a PyTorch trainer: its steps cannot skip a gradient
  ASSERT_NO_FATAL_FAILURE(StartPacerd());
  ASSERT_NO_FATAL_FAILURE(Run(3));
  W("w3").speed_factor = 0.25;
  ASSERT_NO_FATAL_FAILURE(Run(6));
  EXPECT_TRUE(Exclusions().empty());
  for (const auto& w : workers_) {
    EXPECT_FALSE(w.excluded) << w.id;
    EXPECT_EQ(w.commands, 0u) << w.id;
  }
  EXPECT_EQ(pacerd_->reconciler()->Exclusion().first, 0u);
}

TEST_F(ExclusionTest, AnExclusionEndsWhenAWorkerThatCannotCarryItOutJoins) {
  ASSERT_NO_FATAL_FAILURE(StartPacerd());
  ASSERT_NO_FATAL_FAILURE(Run(3));
  W("w3").speed_factor = 0.25;
  ASSERT_NO_FATAL_FAILURE(Run(4));
  ASSERT_TRUE(W("w3").excluded);
  // w1 restarts with a trainer that cannot honor exclusion; the burst goes on.
  W("w1").honors = false;
  W("w1").exclusion_version = 0;
  ASSERT_NO_FATAL_FAILURE(Run(2));
  EXPECT_FALSE(W("w3").excluded) << "everyone is waited for again";
  const std::vector<ActionRecord> ex = Exclusions();
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_NE(ex[1].reason().find("cannot carry out an exclusion"), std::string::npos) << ex[1].reason();
  EXPECT_TRUE(pacerd_->reconciler()->Exclusion().second.empty());
}

TEST_F(ExclusionTest, TheExclusionInForceSurvivesAPacerdRestart) {
  ASSERT_NO_FATAL_FAILURE(StartPacerd());
  ASSERT_NO_FATAL_FAILURE(Run(3));
  W("w3").speed_factor = 0.25;
  ASSERT_NO_FATAL_FAILURE(Run(4));
  ASSERT_TRUE(W("w3").excluded);
  const uint64_t held = W("w3").exclusion_version;
  clients_.clear();
  monitor_.reset();
  channel_.reset();
  pacerd_.reset();

  ASSERT_NO_FATAL_FAILURE(StartPacerd());
  const auto [version, who] = pacerd_->reconciler()->Exclusion();
  EXPECT_EQ(who, std::vector<std::string>{"w3"});
  EXPECT_GE(version, held);
  // A worker that restarted meanwhile (holds nothing) learns it is excluded; one that holds
  // the old version keeps its state (a newer version says the same, or nothing comes).
  W("w0").exclusion_version = 0;
  W("w0").excluded = false;
  ASSERT_NO_FATAL_FAILURE(Heartbeats());
  EXPECT_FALSE(W("w0").excluded);
  EXPECT_EQ(W("w0").exclusion_version, version);
  EXPECT_TRUE(W("w3").excluded);
}

// ShardReader::ReleaseAll: an excluded worker hands back its current lease (part read) and its
// prefetched one; the other worker reads the rest of the epoch. Every record is delivered to
// exactly one of them and counted once; the released worker leases nothing until Resume().
TEST(ShardReaderReleaseTest, ReleasedLeasesGoToTheOtherWorkerAndEveryRecordCountsOnce) {
  testing::TempDir dir;
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.sharding.heartbeat_interval_ms = 50;
  auto d = Pacerd::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  auto connect = [&](const std::string& id) {
    ClientOptions co;
    co.address = (*d)->address();
    co.token = (*d)->job_token();
    co.worker_id = id;
    co.heartbeat_interval_ms = 50;
    co.honors_exclusion = true;
    auto c = Client::Connect(co);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  };
  auto a = connect("a");
  auto b = connect("b");
  ASSERT_TRUE(a && b);
  constexpr uint64_t kRecords = 1000;
  DatasetSpec spec;
  spec.set_name("train");
  spec.set_num_records(kRecords);
  spec.set_shard_size(100);
  spec.set_num_epochs(1);
  ASSERT_TRUE(a->sharding().RegisterDataset(spec).ok());
  ShardReaderOptions ro;
  ro.prefetch_leases = 2;
  auto ra = ShardReader::Create(a.get(), ro);
  ASSERT_TRUE(ra.ok()) << ra.status();

  std::multiset<uint64_t> seen;
  std::vector<uint64_t> ids;
  auto out = (*ra)->Next(130, &ids);  // one lease and 30 of the next
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(WaitFor([&] {
    std::vector<uint64_t> more;
    auto r = (*ra)->Next(5, &more);
    ids.insert(ids.end(), more.begin(), more.end());
    return r.ok() && ids.size() >= 135;
  }, 10s));
  seen.insert(ids.begin(), ids.end());
  // Let the prefetcher fill up so there is a prefetched lease to hand back too.
  ASSERT_TRUE(WaitFor([&] { return (*ra)->leases_read() >= 2; }, 10s));
  auto released = (*ra)->ReleaseAll(10'000);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_GE(*released, 1) << "the part-read lease goes back";
  EXPECT_TRUE((*ra)->holding_off());
  std::vector<uint64_t> none;
  auto held_off = (*ra)->Next(10, &none, ShardReader::Blocking::kUntilData);
  ASSERT_TRUE(held_off.ok());
  EXPECT_EQ(*held_off, ShardReader::Outcome::kWait) << "no lease while held off";
  EXPECT_TRUE(none.empty());

  auto rb = ShardReader::Create(b.get(), ShardReaderOptions());
  ASSERT_TRUE(rb.ok());
  for (;;) {
    std::vector<uint64_t> got;
    auto r = (*rb)->Next(64, &got, ShardReader::Blocking::kUntilData);
    ASSERT_TRUE(r.ok()) << r.status();
    seen.insert(got.begin(), got.end());
    (*rb)->MarkConsumed();
    if (*r == ShardReader::Outcome::kEndOfData) break;
  }
  ASSERT_TRUE(b->Flush(10'000).ok());
  EXPECT_EQ(seen.size(), kRecords) << "every record delivered once (none twice)";
  EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), kRecords);
  auto ds = a->sharding().ListDatasets();
  ASSERT_TRUE(ds.ok());
  ASSERT_EQ(ds->datasets_size(), 1);
  EXPECT_TRUE(ds->datasets(0).finished());
  EXPECT_EQ(ds->datasets(0).records_done_total(), kRecords) << "each record counted once";
  (*ra)->Resume();
  EXPECT_FALSE((*ra)->holding_off());
  a->Close();
  b->Close();
}

}  // namespace
}  // namespace pacer
