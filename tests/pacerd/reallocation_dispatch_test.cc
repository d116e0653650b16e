// REALLOCATE carried out by pacerd's reconciler on the sharding service, end to end on a
// simulated clock (tests/testing/pacerd_harness.h: real gRPC on loopback, real RocksDB,
// production's housekeeping step): in an async job a persistent straggler gets smaller shards;
// once it recovers the controller goes back to no allocation, and the sharding service must
// follow — the worker's shards are full size again. An allocation that leaves a worker out
// resets that worker to the default (weight 1), it does not leave its old shard scale in force.
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using testing::PacerdHarness;
using testing::ScriptedWorker;

constexpr int kWorkers = 4;
constexpr uint64_t kShard = 100;

class ReallocationDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    for (int i = 0; i < kWorkers; ++i) {
      ScriptedWorker::Options o;
      o.id = "w" + std::to_string(i);
      o.node = "n" + std::to_string(i);
      workers_.push_back(std::make_unique<ScriptedWorker>(h_, o));
      absl::Status s = workers_.back()->Connect();
      ASSERT_TRUE(s.ok()) << s;
    }
    DatasetSpec spec;
    spec.set_name("train");
    spec.set_num_records(100'000'000);
    spec.set_shard_size(kShard);
    spec.set_num_epochs(1);
    ASSERT_TRUE(workers_[0]->sharding().RegisterDataset(spec).ok());
  }

  // One simulated second of async training (production's housekeeping after each 100 ms): w3
  // computes `w3_slowdown` times slower; then a heartbeat from each worker.
  void Second(double w3_slowdown) {
    for (int tick = 0; tick < 10; ++tick) {
      h_.Advance(100);
      for (int i = 0; i < kWorkers; ++i) {
        const double compute = i == 3 ? 0.08 * w3_slowdown : 0.08;
        ASSERT_TRUE(workers_[i]->Step(compute, compute + 0.01, 0.01).ok());
      }
    }
    for (auto& w : workers_) ASSERT_TRUE(w->Heartbeat().ok());
  }

  // The size of the shard w3 gets now (the lease is completed at once).
  uint64_t W3ShardSize() {
    auto r = workers_[3]->sharding().Fetch("train");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->outcome() != FetchShardResponse::LEASED) return 0;
    EXPECT_TRUE(workers_[3]->sharding().Complete(r->lease()).ok());
    return r->lease().end() - r->lease().begin();
  }

  std::vector<ActionRecord> ExecutedReallocations() {
    std::vector<ActionRecord> out;
    const ListActionsResponse actions = h_.Actions();
    for (const auto& a : actions.actions())
      if (a.kind() == "REALLOCATE" && a.outcome() == "executed") out.push_back(a);
    return out;
  }

  std::string Audit() {
    std::string out;
    const ListActionsResponse actions = h_.Actions();
    for (const auto& a : actions.actions())
      out += "\n" + a.kind() + " " + a.outcome() + " " + a.reason() + " " + a.veto_reason() +
             " | " + a.inputs();
    return out;
  }

  // An async job under reallocate-1s (data reallocation only, no batch plans).
  PacerdHarness h_{{.policy = "reallocate-1s",
                    .adjust = [](PacerdOptions& p) { p.reconciler.mode = JobMode::kAsync; }}};
  std::vector<std::unique_ptr<ScriptedWorker>> workers_;
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
