// The memory bound on ended leases (sharding_state.h, "Memory"): the
// records kept for truthful retries never exceed
//   sum over workers of EndedFloor(w) + kMaxEndedBeyondFloor
// however long the job runs, each worker always keeps its newest EndedFloor(w), and a forgotten
// lease is never answered as counted. Pure state, built from Update messages; counts, not RSS.
#include <gtest/gtest.h>

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sharding_service/sharding_state.h"
#include "tests/sharding/state_driver.h"

namespace pacer {
namespace {

using testing::StateDriver;

// What the state's counters should say, recounted from every worker.
struct Recount {
  size_t total = 0, beyond_floor = 0, floors = 0;
};
Recount RecountEnded(const ShardingState& st) {
  Recount r;
  for (const auto& [id, w] : st.workers()) {
    const size_t floor = ShardingState::EndedFloor(w);
    r.total += w.ended.size();
    r.beyond_floor += w.ended.size() > floor ? w.ended.size() - floor : 0;
    r.floors += floor;
  }
  return r;
}

std::string WorkerName(int i) { return "w" + std::to_string(i); }

// 600 workers, 80 leases each, round robin in one huge epoch (as the load bench: a long run
// with every worker completing a lease now and then): 48 000 ended leases, 38 400 beyond the
// floors — more than twice the job's budget.
TEST(EndedLeaseBoundTest, RecordsStayWithinTheFormulaAndEachWorkerKeepsItsNewest) {
  constexpr int kWorkers = 600, kRounds = 80;
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 10'000'000, 10)).ok());
  for (int i = 0; i < kWorkers; ++i) d.AddWorker(WorkerName(i));
  // One worker may hold 64 leases: its floor is 128, not 16.
  ASSERT_TRUE(d.SetAllocation(WorkerName(7), 1.0, 0, 64).ok());
  ASSERT_EQ(ShardingState::EndedFloor(*d.state().FindWorker(WorkerName(7))), 128u);
  ASSERT_EQ(ShardingState::EndedFloor(*d.state().FindWorker(WorkerName(0))), kMinEndedPerWorker);

  std::vector<std::vector<uint64_t>> ended(kWorkers);  // lease ids, in the order they ended
  size_t max_seen = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < kWorkers; ++i) {
      auto lease = d.Fetch(WorkerName(i), "train");
      ASSERT_TRUE(lease.has_value());
      // Every other lease half done and released, so a retry's truthful answer differs.
      if ((round + i) % 2 == 0) {
        ASSERT_TRUE(d.Complete(lease->id).ok());
      } else {
        ASSERT_TRUE(d.End(lease->id, LEASE_RELEASED, 5).ok());
      }
      ended[i].push_back(lease->id);
      const ShardingState& st = d.state();
      max_seen = std::max(max_seen, st.ended_records());
      ASSERT_LE(st.ended_beyond_floor(), kMaxEndedBeyondFloor);
    }
    const Recount r = RecountEnded(d.state());
    ASSERT_EQ(r.total, d.state().ended_records()) << "round " << round;
    ASSERT_EQ(r.beyond_floor, d.state().ended_beyond_floor()) << "round " << round;
    ASSERT_LE(r.total, r.floors + kMaxEndedBeyondFloor) << "round " << round;
  }
  const Recount r = RecountEnded(d.state());
  // The bound is reached (the budget is used, not just never approached) and held.
  EXPECT_EQ(r.beyond_floor, kMaxEndedBeyondFloor);
  EXPECT_LE(max_seen, r.floors + kMaxEndedBeyondFloor);
  EXPECT_LT(max_seen, size_t{kWorkers} * kRounds * 6 / 10);  // 48 000 ended, <= 26 096 kept

  // Every worker still knows its newest EndedFloor leases, with the truthful outcome; the
  // forgotten ones are unknown, never answered.
  size_t forgotten = 0;
  for (int i = 0; i < kWorkers; ++i) {
    const auto* w = d.state().FindWorker(WorkerName(i));
    const size_t floor = ShardingState::EndedFloor(*w);
    for (size_t back = 1; back <= std::min(floor, ended[i].size()); ++back) {
      const size_t k = ended[i].size() - back;
      const EndedLease* e = d.state().FindEnded(WorkerName(i), ended[i][k]);
      ASSERT_NE(e, nullptr) << WorkerName(i) << " forgot its lease " << back << " back";
      const bool completed = (static_cast<int>(k) + i) % 2 == 0;
      // (A released lease's undone suffix is the next fetch's lease: some leases are 5 long.)
      EXPECT_EQ(e->reason(), completed ? LEASE_COMPLETED : LEASE_RELEASED);
      EXPECT_EQ(e->records_done(), completed ? e->end() - e->begin()
                                             : std::min<uint64_t>(5, e->end() - e->begin()));
    }
    for (uint64_t id : ended[i]) forgotten += d.state().FindEnded(WorkerName(i), id) == nullptr;
  }
  EXPECT_EQ(forgotten, size_t{kWorkers} * kRounds - r.total);
  // The worker with the higher floor kept every one of its 80 (all within its 128).
  EXPECT_EQ(d.state().FindWorker(WorkerName(7))->ended.size(), size_t{kRounds});

  // A snapshot holds exactly the kept records and loads back unchanged (a replay forgets the
  // same ones: the rule reads only the updates).
  const ShardingSnapshot snap = d.state().ToSnapshot();
  auto loaded = ShardingState::FromSnapshot(snap);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->ended_records(), d.state().ended_records());
  EXPECT_EQ(loaded->ended_beyond_floor(), d.state().ended_beyond_floor());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(loaded->ToSnapshot(), snap));
  ShardingState replayed;
  for (const Update& u : d.log()) ASSERT_TRUE(replayed.ApplyChecked(u).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(replayed.ToSnapshot(), snap));
}

// Lowering a worker's max_leases lowers its floor: what lay within it now counts against the
// job's budget, and the counters follow.
TEST(EndedLeaseBoundTest, ChangingMaxLeasesMovesTheFloorAndKeepsTheCounters) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 1'000'000, 10)).ok());
  d.AddWorker("w");
  ASSERT_TRUE(d.SetAllocation("w", 1.0, 0, 100).ok());  // floor 200
  for (int i = 0; i < 150; ++i) ASSERT_TRUE(d.Complete(d.Fetch("w", "train")->id).ok());
  EXPECT_EQ(d.state().ended_records(), 150u);
  EXPECT_EQ(d.state().ended_beyond_floor(), 0u);
  ASSERT_TRUE(d.SetAllocation("w", 1.0, 0, 0).ok());  // the default: floor 16
  EXPECT_EQ(d.state().ended_records(), 150u);  // within the job's budget: nothing forgotten
  EXPECT_EQ(d.state().ended_beyond_floor(), 150u - kMinEndedPerWorker);
  const Recount r = RecountEnded(d.state());
  EXPECT_EQ(r.total, 150u);
  EXPECT_EQ(r.beyond_floor, d.state().ended_beyond_floor());
}

// A registration forgets no ended lease of the incarnations before the one it replaces (a
// process may register and die before it resolves what its predecessor left open), and workers
// that restart over and over still stay within the bound: restarts add ended leases only
// through RememberEnded, which trims.
TEST(EndedLeaseBoundTest, RestartsForgetNothingAndStayWithinTheBound) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 10'000'000, 10)).ok());
  const uint64_t first = d.AddWorker("w");
  auto lease = d.Fetch("w", "train");
  ASSERT_TRUE(lease.has_value());
  ASSERT_TRUE(d.Progress(lease->id, 7).ok());
  d.AddWorker("w");  // ends the lease (worker lost) at 7 records
  d.AddWorker("w");  // a registration nobody resolved from
  const EndedLease* e = d.state().FindEnded("w", lease->id);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->incarnation(), first);
  EXPECT_EQ(e->records_done(), 7u);
  EXPECT_EQ(e->reason(), LEASE_WORKER_LOST);

  // 300 workers crash-looping: each incarnation leases twice and dies holding both.
  constexpr int kWorkers = 300, kRestarts = 40;
  for (int i = 0; i < kWorkers; ++i) d.AddWorker(WorkerName(i));
  for (int r = 0; r < kRestarts; ++r) {
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_TRUE(d.Fetch(WorkerName(i), "train").has_value());
      ASSERT_TRUE(d.Fetch(WorkerName(i), "train").has_value());
      d.AddWorker(WorkerName(i));
    }
    const Recount rc = RecountEnded(d.state());
    ASSERT_EQ(rc.total, d.state().ended_records());
    ASSERT_EQ(rc.beyond_floor, d.state().ended_beyond_floor());
    ASSERT_LE(d.state().ended_beyond_floor(), kMaxEndedBeyondFloor);
    ASSERT_LE(rc.total, rc.floors + kMaxEndedBeyondFloor);
  }
  // 24 000 leases ended, more than the budget: the bound held, and each worker keeps its newest.
  EXPECT_EQ(d.state().ended_beyond_floor(), kMaxEndedBeyondFloor);
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_GE(d.state().FindWorker(WorkerName(i))->ended.size(), kMinEndedPerWorker);
  }
  ShardingState replayed;
  for (const Update& u : d.log()) ASSERT_TRUE(replayed.ApplyChecked(u).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(replayed.ToSnapshot(),
                                                                 d.state().ToSnapshot()));
}

// A worker killed with a report in flight may register again only after the rest of the job
// closed that lease's epoch and the next: its newest EndedFloor leases survive the epochs'
// close, so its registration still learns what the report counted; older ones go.
TEST(EndedLeaseBoundTest, AWorkersNewestLeasesOutliveTheirEpoch) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 400, 10, /*epochs=*/2)).ok());
  d.AddWorker("dead");
  d.AddWorker("other");
  std::vector<uint64_t> done_by_dead;
  for (int i = 0; i < 20; ++i) {
    auto l = d.Fetch("dead", "train");
    ASSERT_TRUE(l.has_value());
    ASSERT_EQ(l->epoch, 0u);
    ASSERT_TRUE(d.Complete(l->id).ok());
    done_by_dead.push_back(l->id);
  }
  auto last = d.Fetch("dead", "train");
  ASSERT_TRUE(last.has_value());
  ASSERT_EQ(last->epoch, 0u);
  ASSERT_TRUE(d.Progress(last->id, 6).ok());
  // The process dies; the lease expires at its done prefix, and "other" finishes the dataset.
  ASSERT_TRUE(d.End(last->id, LEASE_EXPIRED, 6).ok());
  while (auto l = d.Fetch("other", "train")) ASSERT_TRUE(d.Complete(l->id).ok());
  ASSERT_TRUE(d.state().FindDataset("train")->Finished());
  const EndedLease* e = d.state().FindEnded("dead", last->id);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->records_done(), 6u);
  EXPECT_EQ(e->reason(), LEASE_EXPIRED);
  // Its floor (16) stays; its epoch-0 leases beyond it were forgotten when epoch 1 closed.
  const ShardingState::WorkerRec* dead = d.state().FindWorker("dead");
  EXPECT_EQ(dead->ended.size(), kMinEndedPerWorker);
  EXPECT_EQ(d.state().FindEnded("dead", done_by_dead.front()), nullptr);
  EXPECT_NE(d.state().FindEnded("dead", done_by_dead.back()), nullptr);
  const Recount rc = RecountEnded(d.state());
  EXPECT_EQ(rc.total, d.state().ended_records());
  EXPECT_EQ(rc.beyond_floor, d.state().ended_beyond_floor());
}

// A snapshot written before the job-wide bound (every worker up to 4 096) is brought within it
// when it loads.
TEST(EndedLeaseBoundTest, AnOlderSnapshotOverTheBoundIsTrimmedWhenItLoads) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 1'000'000, 10)).ok());
  constexpr int kWorkers = 8;
  for (int i = 0; i < kWorkers; ++i) d.AddWorker(WorkerName(i));
  ShardingSnapshot snap = d.state().ToSnapshot();
  uint64_t id = 1;
  for (auto& w : *snap.mutable_workers()) {
    for (size_t k = 0; k < kMaxEndedPerWorker; ++k) {
      EndedLease* e = w.add_recent_ended();
      e->set_lease_id(id++);
      e->set_reason(LEASE_COMPLETED);
      e->set_dataset("train");
      e->set_begin(k * 10);
      e->set_end(k * 10 + 10);
      e->set_records_done(10);
      e->set_incarnation(w.incarnation());
    }
  }
  snap.set_next_lease_id(id);
  auto loaded = ShardingState::FromSnapshot(snap);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Recount r = RecountEnded(*loaded);
  EXPECT_EQ(r.total, loaded->ended_records());
  EXPECT_EQ(r.beyond_floor, kMaxEndedBeyondFloor);
  EXPECT_LE(r.total, r.floors + kMaxEndedBeyondFloor);
  // Each worker keeps at least its newest floor (the last lease id of the last worker too).
  for (const auto& [name, w] : loaded->workers()) {
    EXPECT_GE(w.ended.size(), ShardingState::EndedFloor(w)) << name;
  }
  EXPECT_NE(loaded->FindEnded(WorkerName(kWorkers - 1), id - 1), nullptr);
}

}  // namespace
}  // namespace pacer
