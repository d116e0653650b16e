// A worker its agent gave up on (crashed past its restart limit, reported FAILED) is lost at
// once, its leases back in the queue, instead of holding its records until the lease timeout
// (30 s by default; a worker that died in the PS demo held its last 4 % for 20 s that way). Every record is still counted done exactly once, and a worker its agent reports
// FAILED that is still heard from (a process of it alive elsewhere) keeps its leases.
// In process on a simulated clock (tests/testing/pacerd_harness.h: real gRPC on loopback, real
// RocksDB, production's housekeeping step), the agent's heartbeats through its registry.
#include <gtest/gtest.h>

#include <set>

#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using testing::PacerdHarness;
using testing::ScriptedWorker;

constexpr uint64_t kRecords = 1000, kShard = 100;

class AbandonedWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    for (int i = 0; i < 2; ++i) {
      ScriptedWorker::Options o;
      o.id = "w" + std::to_string(i);
      o.node = "n" + std::to_string(i);
      workers_.push_back(std::make_unique<ScriptedWorker>(h_, o));
      ASSERT_TRUE(workers_.back()->Connect().ok());
    }
    DatasetSpec spec;
    spec.set_name("train");
    spec.set_num_records(kRecords);
    spec.set_shard_size(kShard);
    spec.set_num_epochs(1);
    ASSERT_TRUE(workers_[0]->sharding().RegisterDataset(spec).ok());
  }

  // What agent n1 reports of w1 (`leaving`: its final heartbeat).
  void AgentReports(WorkerProcessState state, bool leaving = false) {
    AgentHeartbeat req;
    req.set_node("n1");
    req.set_agent_id("agent-n1");
    req.set_incarnation(7);
    req.set_leaving(leaving);
    WorkerProcess* p = req.add_workers();
    p->set_worker_id("w1");
    p->set_pid(state == WORKER_STATE_RUNNING ? 4242 : 0);
    p->set_state(state);
    AgentHeartbeatReply reply;
    ASSERT_TRUE(h_->agents()->Heartbeat(req, &reply).ok());
  }

  // w1 leases two shards and trains none of them; w0 trains the rest. Returns w1's ranges.
  std::set<std::pair<uint64_t, uint64_t>> W1HoldsTwoShards() {
    std::set<std::pair<uint64_t, uint64_t>> held;
    for (int i = 0; i < 2; ++i) {
      auto r = workers_[1]->sharding().Fetch("train");
      EXPECT_TRUE(r.ok() && r->outcome() == FetchShardResponse::LEASED);
      if (r.ok()) held.emplace(r->lease().begin(), r->lease().end());
    }
    for (;;) {
      auto r = workers_[0]->sharding().Fetch("train");
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || r->outcome() != FetchShardResponse::LEASED) break;
      EXPECT_TRUE(workers_[0]->sharding().Complete(r->lease()).ok());
      done_ += r->lease().end() - r->lease().begin();
    }
    return held;
  }

  // `ms` of simulated time in 100 ms housekeeping rounds, w0 heartbeating every second (and
  // w1 too, when `w1_alive`).
  void Pass(int64_t ms, bool w1_alive) {
    for (int64_t t = 0; t < ms; t += 100) {
      h_.Advance(100);
      if (t % 1000 == 900) {
        ASSERT_TRUE(workers_[0]->Heartbeat().ok());
        if (w1_alive) ASSERT_TRUE(workers_[1]->Heartbeat().ok());
      }
    }
  }

  bool Lost(const std::string& worker) {
    const ShardingSnapshot snapshot = h_->sharding()->SnapshotForTest();
    for (const auto& w : snapshot.workers()) {
      if (w.worker_id() == worker) return w.lost();
    }
    ADD_FAILURE() << "no worker " << worker;
    return false;
  }

  PacerdHarness h_;
  std::vector<std::unique_ptr<ScriptedWorker>> workers_;
  uint64_t done_ = 0;
};

TEST_F(AbandonedWorkerTest, ItsLeasesGoBackAsSoonAsItsAgentGivesUp) {
  AgentReports(WORKER_STATE_RUNNING);
  const auto held = W1HoldsTwoShards();
  ASSERT_EQ(held.size(), 2u);
  ASSERT_EQ(done_, kRecords - 2 * kShard);
  // w1 crashes; its agent, at its restart limit, reports it FAILED. Three seconds on (the lease
  // timeout is 30 s), w0 gets w1's two shards.
  AgentReports(WORKER_STATE_FAILED);
  Pass(3000, /*w1_alive=*/false);
  std::set<std::pair<uint64_t, uint64_t>> got;
  for (;;) {
    auto r = workers_[0]->sharding().Fetch("train");
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->outcome() != FetchShardResponse::LEASED) {
      EXPECT_EQ(r->outcome(), FetchShardResponse::END_OF_DATA) << "w1's records still held";
      break;
    }
    got.emplace(r->lease().begin(), r->lease().end());
    ASSERT_TRUE(workers_[0]->sharding().Complete(r->lease()).ok());
    done_ += r->lease().end() - r->lease().begin();
  }
  EXPECT_EQ(got, held) << "exactly w1's ranges came back";
  EXPECT_EQ(done_, kRecords);
  auto ds = workers_[0]->sharding().ListDatasets();
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ(ds->datasets_size(), 1);
  EXPECT_EQ(ds->datasets(0).records_done_total(), kRecords) << "every record counted done once";
  EXPECT_TRUE(ds->datasets(0).finished());
  // A late report of the dead process is refused: its leases ended.
  Lease stale;
  stale.set_lease_id(1);
  EXPECT_FALSE(workers_[1]->sharding().Complete(stale).ok());
}

TEST_F(AbandonedWorkerTest, AnAgentLeavingHandsBackTheLeasesOfTheWorkersItStopped) {
  AgentReports(WORKER_STATE_RUNNING);
  const auto held = W1HoldsTwoShards();
  ASSERT_EQ(held.size(), 2u);
  // The agent gives up on its group (another worker of it crashed) or migrates: it stops w1 and
  // leaves; its final heartbeat lists w1 EXITED, no process.
  AgentReports(WORKER_STATE_EXITED, /*leaving=*/true);
  Pass(3000, /*w1_alive=*/false);
  std::set<std::pair<uint64_t, uint64_t>> got;
  for (;;) {
    auto r = workers_[0]->sharding().Fetch("train");
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->outcome() != FetchShardResponse::LEASED) break;
    got.emplace(r->lease().begin(), r->lease().end());
    ASSERT_TRUE(workers_[0]->sharding().Complete(r->lease()).ok());
  }
  EXPECT_EQ(got, held);
  EXPECT_TRUE(Lost("w1"));
}

TEST_F(AbandonedWorkerTest, AWorkerThatFinishedIsNotDeclaredLost) {
  AgentReports(WORKER_STATE_RUNNING);
  auto r = workers_[1]->sharding().Fetch("train");
  ASSERT_TRUE(r.ok() && r->outcome() == FetchShardResponse::LEASED);
  ASSERT_TRUE(workers_[1]->sharding().Complete(r->lease()).ok());
  AgentReports(WORKER_STATE_EXITED, /*leaving=*/true);  // w1 finished, its agent leaves
  Pass(3000, /*w1_alive=*/false);
  EXPECT_FALSE(Lost("w1")) << "it held nothing: it finished, it was not lost";
}

TEST_F(AbandonedWorkerTest, AWorkerStillHeardFromKeepsItsLeases) {
  AgentReports(WORKER_STATE_RUNNING);
  const auto held = W1HoldsTwoShards();
  ASSERT_EQ(held.size(), 2u);
  // The agent says FAILED, but a process of w1 keeps heartbeating (started elsewhere): it is
  // alive, and its leases stay its own.
  AgentReports(WORKER_STATE_FAILED);
  Pass(3000, /*w1_alive=*/true);
  auto r = workers_[0]->sharding().Fetch("train");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome(), FetchShardResponse::WAIT) << "w1's leases were taken from a live worker";
  // Once it falls silent, they come back.
  Pass(3000, /*w1_alive=*/false);
  r = workers_[0]->sharding().Fetch("train");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome(), FetchShardResponse::LEASED);
}

}  // namespace
}  // namespace pacer
