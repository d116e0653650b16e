// REALLOCATE carried out by pacerd's reconciler on the sharding service, end to end on a
// simulated clock (real gRPC on loopback, real RocksDB): in an async job a persistent straggler
// gets smaller shards; once it recovers the controller goes back to no allocation, and the
// sharding service must follow — the worker's shards are full size again. An allocation that
// leaves a worker out resets that worker to the default (weight 1), it does not leave its old
// shard scale in force.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

constexpr char kPolicy[] = R"(version: 1
name: test-nd
policy: non-dedicated
detection:
  straggler_threshold: 0.8
  leader_threshold: 1.2
  window_s: 1
  persistent_windows: 2
  history_windows: 3
  min_confidence: 0.1
actions:
  adjust_batch:
    enabled: false
  reallocate:
    enabled: true
    tail_backups: false
    hysteresis: 0.15
  restart:
    enabled: false
  server:
    enabled: false
safety:
  min_gain: 0.01
  cooldown_s: 1
)";

constexpr int kWorkers = 4;
constexpr uint64_t kShard = 100;

class ReallocationDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string policy_path = dir_.Sub("policy.yaml");
    std::ofstream(policy_path) << kPolicy;
    PacerdOptions o;
    o.data_dir = dir_.Sub("data");
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    o.policy_file = policy_path;
    o.reconciler.interval_ms = 1000;
    o.reconciler.mode = JobMode::kAsync;
    o.housekeeping = false;  // the script ticks the monitor and reconciles on its clock
    auto d = Pacerd::Start(o, &clock_);
    ASSERT_TRUE(d.ok()) << d.status();
    pacerd_ = std::move(*d);
    channel_ = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
    monitor_ = Monitor::NewStub(channel_);
    for (int i = 0; i < kWorkers; ++i) {
      ShardingClientOptions co;
      co.address = pacerd_->address();
      co.token = pacerd_->job_token();
      co.worker_id = "w" + std::to_string(i);
      co.node = "n" + std::to_string(i);
      auto c = ShardingClient::Connect(co);
      ASSERT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(*c));
      grpc::ClientContext ctx;
      AttachToken(&ctx, pacerd_->job_token());
      MonitorRegisterRequest req;
      req.set_worker_id(co.worker_id);
      req.set_node(co.node);
      MonitorRegisterResponse resp;
      ASSERT_TRUE(monitor_->RegisterWorker(&ctx, req, &resp).ok());
    }
    DatasetSpec spec;
    spec.set_name("train");
    spec.set_num_records(100'000'000);
    spec.set_shard_size(kShard);
    spec.set_num_epochs(1);
    ASSERT_TRUE(clients_[0]->RegisterDataset(spec).ok());
  }

  // One simulated second of async training: w3 computes `w3_slowdown` times slower; then
  // heartbeats, a monitor window and a reconcile.
  void Second(double w3_slowdown) {
    for (int tick = 0; tick < 10; ++tick) {
      clock_.AdvanceMs(100);
      ++step_;
      ReportStepsRequest req;
      for (int i = 0; i < kWorkers; ++i) {
        StepReport* r = req.add_steps();
        const double compute = i == 3 ? 0.08 * w3_slowdown : 0.08;
        r->set_worker_id("w" + std::to_string(i));
        r->set_step(step_);
        r->set_local_batch(64);
        r->set_samples(64);
        r->set_compute_s(compute);
        r->set_comm_s(0.01);
        r->set_wall_s(compute + 0.01);
        r->set_time_ms(clock_.NowMs());
      }
      grpc::ClientContext ctx;
      AttachToken(&ctx, pacerd_->job_token());
      ReportStepsResponse resp;
      ASSERT_TRUE(monitor_->ReportSteps(&ctx, req, &resp).ok());
    }
    for (auto& c : clients_) {
      HeartbeatRequest hb;
      hb.set_step(step_);
      ASSERT_TRUE(c->Heartbeat(hb).ok());
    }
    pacerd_->monitor()->Tick();
    pacerd_->reconciler()->MaybeReconcile();
  }

  // The size of the shard w3 gets now (the lease is completed at once).
  uint64_t W3ShardSize() {
    auto r = clients_[3]->Fetch("train");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->outcome() != FetchShardResponse::LEASED) return 0;
    EXPECT_TRUE(clients_[3]->Complete(r->lease()).ok());
    return r->lease().end() - r->lease().begin();
  }

  std::vector<ActionRecord> ExecutedReallocations() {
    auto ctl = ControllerService::NewStub(channel_);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    ListActionsResponse actions;
    EXPECT_TRUE(ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok());
    std::vector<ActionRecord> out;
    for (const auto& a : actions.actions())
      if (a.kind() == "REALLOCATE" && a.outcome() == "executed") out.push_back(a);
    return out;
  }

  std::string Audit() {
    auto ctl = ControllerService::NewStub(channel_);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    ListActionsResponse actions;
    EXPECT_TRUE(ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok());
    std::string out;
    for (const auto& a : actions.actions())
      out += "\n" + a.kind() + " " + a.outcome() + " " + a.reason() + " " + a.veto_reason() +
             " | " + a.inputs();
    return out;
  }

  testing::TempDir dir_;
  SimulatedClock clock_{RealClock::Get()->NowMs()};
  std::unique_ptr<Pacerd> pacerd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Monitor::Stub> monitor_;
  std::vector<std::unique_ptr<ShardingClient>> clients_;
  uint64_t step_ = 0;
};

TEST_F(ReallocationDispatchTest, BackToNoAllocationResetsTheWorkersShardScale) {
  ASSERT_EQ(W3ShardSize(), kShard);
  // w3 at half speed: within a minute of simulated time its shards shrink.
  uint64_t size = kShard;
  for (int s = 0; s < 60 && size == kShard; ++s) {
    ASSERT_NO_FATAL_FAILURE(Second(2.0));
    size = W3ShardSize();
  }
  ASSERT_LT(size, kShard) << "no reallocation for the straggler";
  EXPECT_NEAR(static_cast<double>(size), kShard / 2.0, kShard * 0.15);
  uint64_t newest = 0;
  for (const auto& a : ExecutedReallocations()) newest = std::max(newest, a.id());

  // w3 recovers: the controller goes back to no allocation...
  bool restored = false;
  for (int s = 0; s < 120 && !restored; ++s) {
    ASSERT_NO_FATAL_FAILURE(Second(1.0));
    for (const auto& a : ExecutedReallocations())
      restored = restored || (a.id() > newest &&
                              a.reason().find("speeds even again") != std::string::npos);
  }
  ASSERT_TRUE(restored) << "the controller did not go back to no allocation; " << Audit();
  // ... and the sharding service with it: w3's shards are full size again.
  EXPECT_EQ(W3ShardSize(), kShard);
  for (const auto& a : ExecutedReallocations())
    EXPECT_EQ(a.dispatch(), "applied to the sharding service") << a.reason();
}

}  // namespace
}  // namespace pacer
