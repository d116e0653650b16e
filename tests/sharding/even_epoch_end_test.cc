// Near an epoch's end leases shrink, so that equal workers of a synchronous job run out of
// records within a step or two of each other (a worker with nothing to train steps on weight-0
// repeats until the others are done). Pure ShardingState, driven by Update messages: N equal
// workers in lockstep, each step every worker trains `batch` records from its leases, fetching
// when its lease runs out.
//
// "Before" is the same job with no batch size declared on the dataset: the planner then leases
// whole shards to the end, as it did before leases shrank (a lease below one batch would cut a
// worker's steps short, so without a declared batch nothing shrinks). Each test prints both.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <random>
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
  uint64_t smallest_lease = 0;            // the smallest lease that was not an epoch's remainder
  std::vector<uint64_t> after_loss;       // records each worker trained after `lose_at`
};

struct Held {
  uint64_t id = 0, begin = 0, end = 0, pos = 0;
};

// One epoch of `records` (shard_size `shard`) trained by `workers` equal workers, `batch`
// records each a step. `lose_at`: after that many steps every worker's leases are lost (a
// restart: their unconsumed suffixes go back to the front, as after a restore). `declared`:
// the dataset declares its batch size (as the SDK's trainers register it).
EpochEnd Lockstep(int workers, uint64_t records, uint64_t shard, uint64_t batch, bool declared,
                  int64_t lose_at = -1) {
  StateDriver d;
  DatasetSpec spec = StateDriver::Records("train", records, shard);
  if (declared) spec.set_batch_size(batch);
  EXPECT_TRUE(d.AddDataset(spec).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < workers; ++i) {
    ids.push_back("w" + std::to_string(i));
    d.AddWorker(ids.back(), "n" + std::to_string(i));
  }
  std::vector<std::optional<Held>> held(workers);
  EpochEnd run;
  run.after_loss.assign(workers, 0);
  run.smallest_lease = shard;
  for (int64_t step = 0; step < 100000; ++step) {
    if (step == lose_at) {
      for (int i = 0; i < workers; ++i) {
        if (held[i]) {
          EXPECT_TRUE(d.End(held[i]->id, LEASE_EXPIRED, held[i]->pos - held[i]->begin).ok());
        }
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
          if (l->end != records) run.smallest_lease = std::min(run.smallest_lease, l->end - l->begin);
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
      if (lose_at >= 0 && step >= lose_at) run.after_loss[i] += trained[i];
    }
    uint64_t sum = 0;
    for (uint64_t t : trained) sum += t;
    if (sum == 0 && finished) break;
    ++run.steps;
    for (uint64_t t : trained) run.idle_slots += t == 0 && sum > 0 ? 1 : 0;
  }
  run.done = d.state().FindDataset("train")->records_done_total;
  std::cout << (declared ? "after:  " : "before: ") << workers << " ranks, " << records
            << " records, shard " << shard << ", batch " << batch
            << (lose_at >= 0 ? ", every lease lost at step " + std::to_string(lose_at) : std::string())
            << ": " << run.steps << " steps, " << run.idle_slots << " weight-0 (rank, step) slots";
  if (lose_at >= 0) {
    std::cout << "; records trained after the loss per rank:";
    for (uint64_t n : run.after_loss) std::cout << " " << n;
  }
  std::cout << std::endl;
  return run;
}

TEST(EvenEpochEndTest, TwoEqualRanksFinishWithinAStepOfEachOther) {
  // The finding: 2 ranks, 3 000 records -- one rank spent 9 of its 29 steps on repeats.
  const EpochEnd before = Lockstep(2, 3000, 640, 52, /*declared=*/false);
  const EpochEnd r = Lockstep(2, 3000, 640, 52, /*declared=*/true);
  EXPECT_EQ(before.done, 3000u);
  EXPECT_EQ(r.done, 3000u);
  EXPECT_LE(r.idle_slots, 2) << "steps " << r.steps;
  EXPECT_LT(r.idle_slots, before.idle_slots);
  EXPECT_GE(r.smallest_lease, 52u) << "a lease below one batch";
}

TEST(EvenEpochEndTest, FourEqualRanksFinishWithinTwoSteps) {
  const EpochEnd before = Lockstep(4, 20000, 640, 32, /*declared=*/false);
  const EpochEnd r = Lockstep(4, 20000, 640, 32, /*declared=*/true);
  EXPECT_EQ(before.done, 20000u);
  EXPECT_EQ(r.done, 20000u);
  EXPECT_LE(r.idle_slots, 2 * 3) << "steps " << r.steps;
  EXPECT_LT(r.idle_slots, before.idle_slots);
  EXPECT_GE(r.smallest_lease, 32u) << "a lease below one batch";
}

TEST(EvenEpochEndTest, AfterARestartTheRequeuedRecordsAreShared) {
  // The finding: after a resume all 880 remaining records went to one rank, the other repeated
  // for all 16 of its steps. Here every lease is lost when 880 records are left (after 20 steps
  // of 53-record batches: 3 000 - 20 x 2 x 53 = 880); the requeued suffixes are handed out in
  // shares, not whole.
  const EpochEnd before = Lockstep(2, 3000, 640, 53, /*declared=*/false, /*lose_at=*/20);
  const EpochEnd r = Lockstep(2, 3000, 640, 53, /*declared=*/true, /*lose_at=*/20);
  EXPECT_EQ(r.done, 3000u);
  EXPECT_EQ(r.after_loss[0] + r.after_loss[1], 880u);
  EXPECT_LE(r.idle_slots, 2) << "steps " << r.steps;
  // Neither rank trains more than its share of the 880 and one batch.
  EXPECT_LE(std::max(r.after_loss[0], r.after_loss[1]), 880u / 2 + 53);
  EXPECT_LE(r.idle_slots, before.idle_slots);
}

TEST(EvenEpochEndTest, WithoutADeclaredBatchLeasesStayWhole) {
  // A lease below one batch cuts a trainer's steps short (it fills a step from at most its
  // lease quota of leases): the planner shrinks nothing when it does not know the batch.
  const EpochEnd r = Lockstep(2, 3000, 640, 52, /*declared=*/false);
  EXPECT_EQ(r.smallest_lease, 640u);
}

TEST(EvenEpochEndTest, ALeaseIsNeverBelowOneBatch) {
  // Many ranks and few records left: the share per rank is below a batch; the lease is a batch.
  const EpochEnd r = Lockstep(8, 5000, 640, 100, /*declared=*/true);
  EXPECT_EQ(r.done, 5000u);
  EXPECT_GE(r.smallest_lease, 100u);
}


// A batch plan in force: the ranks train unequal local batches (the controller planned a slow
// rank down), so they consume records at unequal rates. Each worker keeps 1 + `prefetch`
// leases (the SDK's ShardReader: the lease being read and one leased ahead) and reports its
// progress every step (a heartbeat's batched reports). `tell_plan`: the planner is told each
// worker's planned local batch (pacerd passes the plan in force); without it the shares near
// the end are by weight alone, equal here.
struct PlannedEnd {
  int64_t steps = 0;
  int64_t idle_slots = 0;                // as EpochEnd's
  std::vector<int64_t> last_step;        // per worker: the last step it trained records in
  std::vector<int64_t> idle;             // per worker: its weight-0 steps
  uint64_t done = 0;
  // The smallest lease that was not an epoch's remainder, against the floor: the holder's
  // planned batch or the declared one, whichever is smaller (below 1: a lease under the floor).
  double smallest_lease_over_batch = 0;
  int64_t spread() const {
    return *std::max_element(last_step.begin(), last_step.end()) -
           *std::min_element(last_step.begin(), last_step.end());
  }
};

PlannedEnd PlannedLockstep(const std::vector<uint64_t>& batches, uint64_t records, uint64_t shard,
                           uint64_t declared, bool tell_plan, int64_t report_every = 1,
                           size_t prefetch = 1) {
  const int workers = static_cast<int>(batches.size());
  StateDriver d;
  DatasetSpec spec = StateDriver::Records("train", records, shard);
  spec.set_batch_size(declared);
  EXPECT_TRUE(d.AddDataset(spec).ok());
  std::vector<std::string> ids;
  FetchRates rates;
  for (int i = 0; i < workers; ++i) {
    ids.push_back("w" + std::to_string(i));
    d.AddWorker(ids.back(), "n" + std::to_string(i));
    rates.Set(ids.back(), static_cast<double>(batches[i]));
  }
  std::vector<std::vector<Held>> held(workers);
  std::vector<bool> ended(workers, false);
  PlannedEnd run;
  run.last_step.assign(workers, -1);
  run.idle.assign(workers, 0);
  run.smallest_lease_over_batch = static_cast<double>(shard);
  for (int64_t step = 0; step < 100000; ++step) {
    std::vector<uint64_t> trained(workers, 0);
    for (int i = 0; i < workers; ++i) {
      // Top up to 1 + prefetch leases (the reader's prefetch thread), then train the batch.
      while (!ended[i] && held[i].size() < 1 + prefetch) {
        FetchPlan::Kind kind;
        auto l = d.Fetch(ids[i], "train", &kind, tell_plan ? &rates : nullptr);
        if (!l) {
          ended[i] = kind == FetchPlan::kEndOfData;
          break;
        }
        held[i].push_back(Held{l->id, l->begin, l->end, l->begin});
        if (l->end != records) {
          run.smallest_lease_over_batch =
              std::min(run.smallest_lease_over_batch,
                       static_cast<double>(l->end - l->begin) /
                           static_cast<double>(std::min(batches[i], declared)));
        }
      }
      while (trained[i] < batches[i] && !held[i].empty()) {
        Held& h = held[i].front();
        const uint64_t take = std::min(batches[i] - trained[i], h.end - h.pos);
        h.pos += take;
        trained[i] += take;
        if (h.pos == h.end) {
          EXPECT_TRUE(d.Complete(h.id).ok());
          held[i].erase(held[i].begin());
        }
      }
      // Each rank reports in its own phase (heartbeats are not aligned with steps or ranks).
      if ((step + i) % report_every == report_every - 1) {
        for (const Held& h : held[i]) {
          if (h.pos > h.begin) EXPECT_TRUE(d.Progress(h.id, h.pos - h.begin).ok());
        }
      }
    }
    uint64_t sum = 0;
    for (uint64_t t : trained) sum += t;
    bool finished = true;
    for (int i = 0; i < workers; ++i) finished = finished && ended[i] && held[i].empty();
    if (sum == 0 && finished) break;
    if (sum == 0) continue;  // every worker waits on a lease (none here: nothing is slow)
    ++run.steps;
    for (int i = 0; i < workers; ++i) {
      if (trained[i] > 0) run.last_step[i] = step;
      if (trained[i] == 0) {
        ++run.idle_slots;
        ++run.idle[i];
      }
    }
  }
  run.done = d.state().FindDataset("train")->records_done_total;
  std::cout << (tell_plan ? "planned, after:  " : "planned, before: ") << workers << " ranks at";
  for (uint64_t b : batches) std::cout << " " << b;
  std::cout << ", " << records << " records, shard " << shard << ", declared batch " << declared
            << ", progress every " << report_every << " steps: " << run.steps << " steps, " << run.idle_slots
            << " weight-0 (rank, step) slots (per rank";
  for (int64_t n : run.idle) std::cout << " " << n;
  std::cout << "), last steps";
  for (int64_t s : run.last_step) std::cout << " " << s;
  std::cout << ", smallest lease / floor " << run.smallest_lease_over_batch << std::endl;
  return run;
}

TEST(EvenEpochEndTest, UnderABatchPlanTheRanksFinishWithinTwoSteps) {
  // The finding (bench/torch_straggler_bench.py, a rank planned down): every rank spent 9-14
  // steps on weight-0 repeats at the epoch's end under the plan, 1-4 without one. The shares
  // near the end were of the records not leased yet, equal per rank, while the ranks consume
  // 43, 34 and 19 records a step and hold a lease leased ahead: the fast ranks ran dry while
  // the slow one still held records.
  for (uint64_t records : {20000u, 50000u, 12345u}) {
    const PlannedEnd before = PlannedLockstep({43, 34, 19}, records, 320, 32, /*tell_plan=*/false);
    const PlannedEnd r = PlannedLockstep({43, 34, 19}, records, 320, 32, /*tell_plan=*/true);
    EXPECT_EQ(before.done, records);
    EXPECT_EQ(r.done, records);
    EXPECT_LE(r.spread(), 2) << records << " records";
    for (int64_t n : r.idle) EXPECT_LE(n, 2) << records << " records";
    EXPECT_LT(r.idle_slots, before.idle_slots);
    EXPECT_GE(r.smallest_lease_over_batch, 1.0) << "a lease below the floor";
  }
}

TEST(EvenEpochEndTest, UnderABatchPlanFourRanksOneSlow) {
  // The bench's shape: 4 ranks, one planned down to 16 of a global batch of 256 (its leases of
  // 640 records are 40 of its steps; a fast rank's 8).
  const PlannedEnd before = PlannedLockstep({80, 80, 80, 16}, 50000, 640, 64, /*tell_plan=*/false);
  const PlannedEnd r = PlannedLockstep({80, 80, 80, 16}, 50000, 640, 64, /*tell_plan=*/true);
  EXPECT_EQ(r.done, 50000u);
  EXPECT_LE(r.spread(), 2);
  for (int64_t n : r.idle) EXPECT_LE(n, 2);
  EXPECT_LT(r.idle_slots, before.idle_slots);
  EXPECT_GE(r.smallest_lease_over_batch, 1.0);
}

TEST(EvenEpochEndTest, UnderABatchPlanWithProgressReportedEveryFewSteps) {
  // Progress reaches the service with the heartbeats, not every step, and each rank's in its own
  // phase: what a rank holds is overstated between its reports, by up to that many of its
  // steps. Every third (fourth) step here. Taking half of the shortfall a fetch (factoring)
  // lets the later, smaller leases correct it: a whole share a fetch left the bench's plan
  // with spreads of 2-3 steps and up to 7 weight-0 slots here.
  for (uint64_t records : {20000u, 50000u, 12345u}) {
    const PlannedEnd before =
        PlannedLockstep({43, 34, 19}, records, 320, 32, /*tell_plan=*/false, /*report_every=*/3);
    const PlannedEnd r =
        PlannedLockstep({43, 34, 19}, records, 320, 32, /*tell_plan=*/true, /*report_every=*/3);
    EXPECT_EQ(r.done, records);
    EXPECT_LE(r.spread(), 3) << records << " records";
    for (int64_t n : r.idle) EXPECT_LE(n, 3) << records << " records";
    EXPECT_LT(r.idle_slots, before.idle_slots);
  }
  const PlannedEnd r =
      PlannedLockstep({80, 80, 80, 16}, 50000, 640, 64, /*tell_plan=*/true, /*report_every=*/3);
  EXPECT_LE(r.spread(), 3);
  // The torch bench's plan (83/26/81/66 of 256), its 0.12 s steps against 500 ms heartbeats.
  for (uint64_t records : {50000u, 49999u, 47000u, 123457u}) {
    const PlannedEnd b = PlannedLockstep({83, 26, 81, 66}, records, 640, 64, /*tell_plan=*/true,
                                         /*report_every=*/4);
    EXPECT_LE(b.spread(), 2) << records << " records";
    for (int64_t n : b.idle) EXPECT_LE(n, 2) << records << " records";
  }
}

TEST(EvenEpochEndTest, EqualPlannedBatchesEndEvenly) {
  // A plan of equal batches: the shares are equal, as by weight, and count what each rank
  // holds leased ahead.
  const PlannedEnd without = PlannedLockstep({52, 52}, 3000, 640, 52, /*tell_plan=*/false);
  const PlannedEnd with = PlannedLockstep({52, 52}, 3000, 640, 52, /*tell_plan=*/true);
  EXPECT_EQ(with.done, 3000u);
  EXPECT_LE(with.spread(), 1);
  EXPECT_LE(with.idle_slots, without.idle_slots);
}

TEST(EvenEpochEndTest, APlanThatLeavesOutAConsumerSharesByWeight) {
  // Rates are known only for the workers a plan names: with a consumer left out (a worker that
  // joined after the plan) the shares stay by weight, as without a plan. Twin states, one
  // fetched with such rates and one without, lease alike to the end of the epoch (every worker
  // a consumer from the first round on: the epoch is many shards long).
  StateDriver with, without;
  DatasetSpec spec = StateDriver::Records("train", 30000, 640);
  spec.set_batch_size(50);
  FetchRates partial;
  partial.Set("w0", 80);
  partial.Set("w1", 20);  // w2 is not named
  for (StateDriver* d : {&with, &without}) {
    ASSERT_TRUE(d->AddDataset(spec).ok());
    for (const char* w : {"w0", "w1", "w2"}) d->AddWorker(w);
  }
  for (int round = 0; round < 40; ++round) {
    for (const char* w : {"w0", "w1", "w2"}) {
      auto a = with.Fetch(w, "train", nullptr, &partial);
      auto b = without.Fetch(w, "train");
      ASSERT_EQ(a.has_value(), b.has_value()) << w << " round " << round;
      if (!a) continue;
      EXPECT_EQ(a->end - a->begin, b->end - b->begin) << w << " round " << round;
      ASSERT_TRUE(with.Complete(a->id).ok());
      ASSERT_TRUE(without.Complete(b->id).ok());
    }
  }
  EXPECT_EQ(with.state().FindDataset("train")->records_done_total, 30000u);
}

// One run of `ops` random updates and fetches from `seed`; counts the fetches compared and the
// leases that shrank.
void DecideAsAfresh(uint32_t seed, int ops, int* fetches, int* shrunk) {
  StateDriver d;
  for (const auto& [name, records] : {std::pair<const char*, uint64_t>{"a", 2000}, {"b", 1500}}) {
    DatasetSpec spec = StateDriver::Records(name, records, 100, /*epochs=*/3);
    spec.set_batch_size(10);
    spec.set_max_attempts(100);
    ASSERT_TRUE(d.AddDataset(spec).ok());
  }
  ASSERT_TRUE(d.SetTailBackup("a", true).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back("w" + std::to_string(i));
    d.AddWorker(ids.back());
  }
  FetchRates rates;
  for (int i = 0; i < 6; ++i) rates.Set(ids[i], 10.0 * (1 + i % 3));
  std::mt19937 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto active = [&]() {
    std::vector<ShardingState::LeaseRec> out;
    for (const auto& [id, l] : d.state().leases()) out.push_back(l);
    return out;
  };
  bool saved = false;
  for (int op = 0; op < ops; ++op) {
    const size_t r = pick(100);
    if (r < 50) {
      const std::string& w = ids[pick(ids.size())];
      if (d.state().FindWorker(w)->lost) continue;
      const std::string dataset = pick(3) == 0 ? "b" : "a";
      const FetchRates* with = pick(4) == 0 ? nullptr : &rates;
      absl::StatusOr<ShardingState> fresh = ShardingState::FromSnapshot(d.state().ToSnapshot());
      ASSERT_TRUE(fresh.ok()) << fresh.status();
      absl::StatusOr<FetchPlan> kept = d.state().PlanFetch(w, dataset, false, with);
      absl::StatusOr<FetchPlan> anew = fresh->PlanFetch(w, dataset, false, with);
      ASSERT_EQ(kept.status(), anew.status()) << "op " << op;
      if (!kept.ok()) continue;
      ASSERT_EQ(kept->kind, anew->kind) << "op " << op;
      ASSERT_EQ(kept->epoch_index, anew->epoch_index) << "op " << op;
      ASSERT_EQ(kept->partition, anew->partition) << "op " << op;
      ASSERT_EQ(kept->begin, anew->begin) << "op " << op;
      ASSERT_EQ(kept->end, anew->end) << "op " << op;
      ASSERT_EQ(kept->backup_of, anew->backup_of) << "op " << op;
      ++*fetches;
      if (kept->kind == FetchPlan::kLease && kept->end - kept->begin < 100 &&
          kept->end - kept->begin > 10) {
        ++*shrunk;
      }
      absl::StatusOr<FetchDecision> decision = d.state().DecideFetch(w, dataset, 0, with);
      ASSERT_TRUE(decision.ok());
      if (decision->update) ASSERT_TRUE(d.Apply(*decision->update).ok());
      if (decision->kind == FetchPlan::kEndOfData) ASSERT_TRUE(d.ResetDataset(dataset).ok());
    } else if (r < 94) {
      const std::vector<ShardingState::LeaseRec> leases = active();
      if (leases.empty()) continue;
      const ShardingState::LeaseRec& l = leases[pick(leases.size())];
      const uint64_t len = l.end - l.begin;
      const uint64_t done = std::max<uint64_t>(l.done, std::min<uint64_t>(len, l.done + pick(60)));
      if (r < 75) {
        ASSERT_TRUE(d.Progress(l.id, done).ok());
      } else {
        const LeaseEndReason reasons[] = {LEASE_COMPLETED, LEASE_COMPLETED, LEASE_RELEASED,
                                          LEASE_FAILED, LEASE_EXPIRED};
        ASSERT_TRUE(d.End(l.id, reasons[pick(5)], done).ok());
      }
    } else if (r < 95) {
      ASSERT_TRUE(d.WorkerLost(ids[pick(ids.size())]).ok());
    } else if (r < 96) {
      d.AddWorker(ids[pick(ids.size())]);  // registered again: live, its leases ended
    } else if (r < 97) {
      const double weights[] = {1.0, 0.5, 2.0, 1.5};
      ASSERT_TRUE(d.SetAllocation(ids[pick(ids.size())], weights[pick(4)], 0).ok());
    } else if (r < 99) {
      const double per_step[] = {0.0, 10.0, 20.0, 35.0};
      rates.Set(ids[pick(ids.size())], per_step[pick(4)]);
    } else if (!saved || pick(2) == 0) {
      ASSERT_TRUE(d.Save("cp").ok());
      saved = true;
    } else {
      ASSERT_TRUE(d.Restore("cp").ok());
    }
    // Each open epoch's kept count is what its leases hold.
    for (const auto& [name, ds] : d.state().datasets()) {
      for (const ShardingState::Epoch& ep : ds.open) {
        uint64_t held = 0;
        for (const auto& [id, l] : d.state().leases()) {
          if (l.dataset == name && l.epoch == ep.epoch && !l.backup) held += l.unconsumed();
        }
        ASSERT_EQ(ep.unconsumed_held, held) << name << " epoch " << ep.epoch << " op " << op;
      }
    }
  }
}

// The fetch planner keeps what it shares by as the state changes (each epoch's unconsumed
// records, each dataset's consumer sums) instead of visiting every worker and lease at each
// fetch. Random updates of every kind that moves them -- leases created, advanced, ended and
// backed up, workers lost and registered again, weights and rates changed, a dataset reset, a
// checkpoint restored -- and at every fetch the state decides as one loaded afresh from its
// snapshot, which has nothing kept.
TEST(EvenEpochEndTest, KeptSumsDecideAsAStateLoadedAfresh) {
  int fetches = 0, shrunk = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    DecideAsAfresh(seed, 3000, &fetches, &shrunk);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::cout << fetches << " fetches compared, " << shrunk << " leases shrunk" << std::endl;
  EXPECT_GT(shrunk, 500);
}

}  // namespace
}  // namespace pacer
