// Near an epoch's end leases shrink, so that equal workers of a synchronous job run out of
// records within a step or two of each other (a worker with nothing to train steps on weight-0
// repeats until the others are done). Pure ShardingState, driven by Update messages: N equal
// workers in lockstep, each step every worker trains `batch` records from its leases, fetching
// when its lease runs out.
#include <gtest/gtest.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "sharding_service/sharding_state.h"
#include "tests/sharding/state_driver.h"

namespace pacer {
namespace {

using testing::StateDriver;

struct EpochEnd {
  int64_t steps = 0;
  int64_t idle_slots = 0;  // (worker, step) pairs with no record while another worker trained
  uint64_t done = 0;
};

struct Held {
  uint64_t id = 0, begin = 0, end = 0, pos = 0;
};

// One epoch of `records` (shard_size `shard`) trained by `workers` equal workers, `batch`
// records each a step. `lose_at`: after that many steps every worker's leases are lost (a
// restart: their unconsumed suffixes go back to the front, as after a restore).
EpochEnd Lockstep(int workers, uint64_t records, uint64_t shard, uint64_t batch, int64_t lose_at = -1) {
  StateDriver d;
  DatasetSpec spec = StateDriver::Records("train", records, shard);
  spec.set_batch_size(batch);  // as the SDK's loader registers it: no lease below one batch
  EXPECT_TRUE(d.AddDataset(spec).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < workers; ++i) {
    ids.push_back("w" + std::to_string(i));
    d.AddWorker(ids.back(), "n" + std::to_string(i));
  }
  std::vector<std::optional<Held>> held(workers);
  EpochEnd run;
  for (int64_t step = 0; step < 100000; ++step) {
    if (step == lose_at) {
      for (int i = 0; i < workers; ++i) {
        if (held[i]) EXPECT_TRUE(d.End(held[i]->id, LEASE_EXPIRED, held[i]->pos - held[i]->begin).ok());
        held[i].reset();
      }
    }
    std::vector<uint64_t> trained(workers, 0);
    bool finished = true;
    for (int i = 0; i < workers; ++i) {
      while (trained[i] < batch) {
        if (!held[i]) {
          FetchPlan::Kind kind;
          auto l = d.Fetch(ids[i], "train", &kind);
          if (!l) {
            if (kind != FetchPlan::kEndOfData) finished = false;
            break;
          }
          held[i] = Held{l->id, l->begin, l->end, l->begin};
        }
        const uint64_t take = std::min(batch - trained[i], held[i]->end - held[i]->pos);
        held[i]->pos += take;
        trained[i] += take;
        if (held[i]->pos == held[i]->end) {
          EXPECT_TRUE(d.Complete(held[i]->id).ok());
          held[i].reset();
        }
      }
      if (trained[i] > 0 || held[i]) finished = false;
    }
    uint64_t sum = 0;
    for (uint64_t t : trained) sum += t;
    if (sum == 0 && finished) break;
    ++run.steps;
    for (uint64_t t : trained) run.idle_slots += t == 0 && sum > 0 ? 1 : 0;
  }
  run.done = d.state().FindDataset("train")->records_done_total;
  std::cout << workers << " ranks, " << records << " records, shard " << shard << ", batch " << batch
            << (lose_at >= 0 ? ", every lease lost at step " + std::to_string(lose_at) : std::string())
            << ": " << run.steps << " steps, " << run.idle_slots << " weight-0 (rank, step) slots" << std::endl;
  return run;
}

TEST(EvenEpochEndTest, TwoEqualRanksFinishWithinAStepOfEachOther) {
  // The finding: 2 ranks, 3 000 records -- one rank spent 9 of its 29 steps on repeats.
  const EpochEnd r = Lockstep(2, 3000, 640, 52);
  EXPECT_EQ(r.done, 3000u);
  EXPECT_LE(r.idle_slots, 2) << "steps " << r.steps;
}

TEST(EvenEpochEndTest, FourEqualRanksFinishWithinTwoSteps) {
  const EpochEnd r = Lockstep(4, 20000, 640, 32);
  EXPECT_EQ(r.done, 20000u);
  EXPECT_LE(r.idle_slots, 2 * 3) << "steps " << r.steps;
}

TEST(EvenEpochEndTest, AfterARestartTheRequeuedRecordsAreShared) {
  // The finding: after a resume all 880 remaining records went to one rank. Here every lease is
  // lost near the end; the requeued suffixes are handed out in shares, not whole.
  const EpochEnd r = Lockstep(2, 3000, 640, 52, /*lose_at=*/20);
  EXPECT_EQ(r.done, 3000u);
  EXPECT_LE(r.idle_slots, 2) << "steps " << r.steps;
}

}  // namespace
}  // namespace pacer
