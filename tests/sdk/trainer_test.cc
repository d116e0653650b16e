// Multi-process tests of example (a), pacer-train-mlp, against an in-process pacerd on loopback
// (port from the OS, private temp dir, every worker process reaped by Subprocess):
//  - 4 workers with uneven local batches (and a batch plan sent mid-run through the heartbeat
//    hook) all-reduce on Gloo and reach the accuracy target with identical parameters;
//  - a worker killed (SIGKILL) mid-shard and restarted resumes, and the ledgers of finished
//    records show every record of every epoch counted exactly once.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <regex>

#include "examples/consumer/ledger.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

using testing::BinaryPath;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

constexpr double kTargetAccuracy = 0.95;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
    ASSERT_TRUE(std::filesystem::exists(dir_.Sub("data/job.token")));
  }
  std::vector<std::string> Args(int i) {
    return {BinaryPath("pacer-train-mlp"), "--addr", pacerd_->address(), "--token-file",
            dir_.Sub("data/job.token"), "--worker-id", "w" + std::to_string(i),
            "--result-file", dir_.Sub("result-" + std::to_string(i))};
  }
  std::string Log(int i) { return ReadFileOrEmpty(dir_.Sub("w" + std::to_string(i) + ".log")); }
  DatasetInfo Dataset() {
    ShardingClientOptions o;
    o.address = pacerd_->address();
    o.token = pacerd_->job_token();
    o.worker_id = "checker";
    auto c = ShardingClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    auto l = (*c)->ListDatasets();
    EXPECT_TRUE(l.ok() && l->datasets_size() == 1);
    return l.ok() && l->datasets_size() ? l->datasets(0) : DatasetInfo();
  }

  // 3 ranks under a batch plan of unequal local batches (43, 34, 19: a rank planned down), 2
  // epochs of 12 000 records in 320-record shards, steps of at least 40 ms (about 2.5 a
  // heartbeat here, as the torch bench's 0.2 s steps are at its 500 ms heartbeats: progress
  // reaches pacerd that late); the plan reaches pacerd's WorkerSessions as an ADJUST_BS's
  // would. Returns each rank's result line.
  std::vector<std::string> RunPlannedRanks() {
    constexpr int kWorkers = 3;
    const uint32_t batches[kWorkers] = {43, 34, 19};
    std::vector<Subprocess> workers;
    for (int i = 0; i < kWorkers; ++i) {
      auto args = Args(i);
      for (const std::string& a :
           {std::string("--rank"), std::to_string(i), std::string("--world-size"),
            std::to_string(kWorkers), std::string("--store-dir"), dir_.Sub("gloo"),
            std::string("--batch"), std::to_string(batches[i]), std::string("--register-records"),
            std::string("12000"), std::string("--epochs"), std::string("2"),
            std::string("--shard-size"), std::string("320"), std::string("--step-ms"),
            std::string("40")}) {
        args.push_back(a);
      }
      workers.push_back(Subprocess::Start(args, {}, dir_.Sub("w" + std::to_string(i) + ".log")));
    }
    BatchPlan plan;
    plan.version = 1;
    plan.effective_step = 0;
    plan.global_batch = 43 + 34 + 19;
    for (int i = 0; i < kWorkers; ++i) {
      plan.workers.push_back(WorkerBatch{"w" + std::to_string(i), batches[i], batches[i], 1, 0});
    }
    // Once every worker heartbeated (registrations begin the run, which withdraws older plans).
    EXPECT_TRUE(WaitFor([&] { return pacerd_->sessions()->Reports().size() >= kWorkers; },
                        std::chrono::seconds(60)))
        << "w0's log:\n" << Log(0);
    pacerd_->sessions()->SetPlan(plan, "test plan");
    std::vector<std::string> results;
    for (int i = 0; i < kWorkers; ++i) {
      const int status = workers[i].Wait(std::chrono::minutes(4));
      EXPECT_NE(status, -1) << "worker " << i << " did not finish; log:\n" << Log(i);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "worker " << i << " status " << status << "; log:\n" << Log(i);
      results.push_back(ReadFileOrEmpty(dir_.Sub("result-" + std::to_string(i))));
      std::cout << results.back();
    }
    return results;
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true, .adjust = [](PacerdOptions& p) {
    p.sharding.heartbeat_interval_ms = 100;
    // No test here exercises lease expiry (a restarted worker's leases go back when it registers
    // again), and "samples" counts records trained: a lease expired under a worker that was
    // only slow (a 3 s silence is within reach of a loaded CI machine: heartbeats starved, a
    // slow fsync) would be trained twice and fail the exactly-once sum.
    p.sharding.lease_timeout_ms = 30'000;
    p.sharding.worker_timeout_ms = 60'000;
  }}};
  const testing::TempDir& dir_ = h_.dir();
  Pacerd* pacerd_ = nullptr;
};

double Field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\":([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

std::string Checksum(const std::string& json) {
  std::smatch m;
  return std::regex_search(json, m, std::regex("\"checksum\":\"([0-9a-f]+)\"")) ? std::string(m[1]) : "";
}

TEST_F(TrainerTest, FourWorkersWithUnevenBatchesConvergeToTheTarget) {
  constexpr int kWorkers = 4;
  constexpr uint64_t kRecords = 20'000;
  // Mid-run, the "controller" moves worker w1 from 16 to 20 samples per step (10 x 2).
  const uint32_t batches[kWorkers] = {7, 16, 44, 13};
  std::vector<Subprocess> workers;
  for (int i = 0; i < kWorkers; ++i) {
    auto args = Args(i);
    for (const std::string& a :
         {std::string("--rank"), std::to_string(i), std::string("--world-size"),
          std::to_string(kWorkers), std::string("--store-dir"), dir_.Sub("gloo"),
          std::string("--batch"), std::to_string(batches[i]), std::string("--register-records"),
          std::to_string(kRecords), std::string("--epochs"), std::string("2"),
          std::string("--shard-size"), std::string("200"), std::string("--target-accuracy"),
          std::to_string(kTargetAccuracy)}) {
      args.push_back(a);
    }
    workers.push_back(Subprocess::Start(args, {}, dir_.Sub("w" + std::to_string(i) + ".log")));
  }
  // The controller's path to the workers (controller/worker_sessions.h), as an ADJUST_BS takes:
  // w1's next heartbeat carries the plan, effective at step 50.
  BatchPlan plan;
  plan.version = 1;
  plan.effective_step = 50;
  plan.global_batch = 7 + 20 + 44 + 13;
  plan.workers.push_back(WorkerBatch{"w1", 20, 10, 2, 0});
  // Once every worker heartbeated (registrations begin the run, which withdraws older plans);
  // a plan that arrives after its effective step applies at once.
  ASSERT_TRUE(WaitFor([&] { return pacerd_->sessions()->Reports().size() >= kWorkers; },
                      std::chrono::seconds(60)))
      << pacerd_->sessions()->Reports().size() << " workers heartbeated; w0's log:\n" << Log(0);
  pacerd_->sessions()->SetPlan(plan, "test plan");
  for (int i = 0; i < kWorkers; ++i) {
    const int status = workers[i].Wait(std::chrono::minutes(4));
    ASSERT_NE(status, -1) << "worker " << i << " did not finish; log:\n" << Log(i);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << i << " status " << status << "; log:\n" << Log(i);
  }
  std::string checksum;
  double samples = 0;
  for (int i = 0; i < kWorkers; ++i) {
    const std::string r = ReadFileOrEmpty(dir_.Sub("result-" + std::to_string(i)));
    std::cout << r;
    EXPECT_GE(Field(r, "accuracy"), kTargetAccuracy) << r;
    samples += Field(r, "samples");
    if (i == 0) checksum = Checksum(r);
    EXPECT_EQ(Checksum(r), checksum) << "ranks ended with different parameters";
  }
  EXPECT_EQ(samples, 2.0 * kRecords) << "every record of both epochs trained on exactly once";
  const std::string w1 = ReadFileOrEmpty(dir_.Sub("result-1"));
  EXPECT_EQ(Field(w1, "final_batch"), 10) << w1;
  const DatasetInfo info = Dataset();
  EXPECT_TRUE(info.finished());
  EXPECT_EQ(info.records_done_total(), 2 * kRecords);
}

TEST_F(TrainerTest, EqualRanksTrainFullBatchesUpToEachEpochsEnd) {
  // Leases shrink near an epoch's end (docs/sharding.md, even epoch ends). However the records
  // are split into leases, a rank's step is its full batch until the others hold the rest of
  // the data: no run of short steps, each a full update on a few records (with leases below
  // one batch the demo's unmitigated run fell from 0.98 to 0.451 accuracy). 4 equal ranks, 3
  // epochs without a barrier, 2 048-record shards, 512-sample batches.
  constexpr int kWorkers = 4;
  constexpr uint64_t kRecords = 60'000, kBatch = 512;
  constexpr uint32_t kEpochs = 3;
  std::vector<Subprocess> workers;
  for (int i = 0; i < kWorkers; ++i) {
    auto args = Args(i);
    for (const std::string& a :
         {std::string("--rank"), std::to_string(i), std::string("--world-size"),
          std::to_string(kWorkers), std::string("--store-dir"), dir_.Sub("gloo"),
          std::string("--batch"), std::to_string(kBatch), std::string("--register-records"),
          std::to_string(kRecords), std::string("--epochs"), std::to_string(kEpochs),
          std::string("--shard-size"), std::string("2048")}) {
      args.push_back(a);
    }
    workers.push_back(Subprocess::Start(args, {}, dir_.Sub("w" + std::to_string(i) + ".log")));
  }
  for (int i = 0; i < kWorkers; ++i) {
    const int status = workers[i].Wait(std::chrono::minutes(4));
    ASSERT_NE(status, -1) << "worker " << i << " did not finish; log:\n" << Log(i);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << i << " status " << status << "; log:\n" << Log(i);
  }
  // One update per full global batch, and at most one more per epoch's end.
  const double full_updates = std::ceil(double(kRecords) * kEpochs / (kWorkers * kBatch));
  double samples = 0;
  std::string checksum;
  for (int i = 0; i < kWorkers; ++i) {
    const std::string r = ReadFileOrEmpty(dir_.Sub("result-" + std::to_string(i)));
    std::cout << r;
    samples += Field(r, "samples");
    if (i == 0) checksum = Checksum(r);
    EXPECT_EQ(Checksum(r), checksum) << "ranks ended with different parameters";
    EXPECT_LE(Field(r, "updates"), full_updates + kEpochs) << r;
    // Short or empty steps: the last one or two of each epoch (the others hold the rest).
    EXPECT_LE(Field(r, "short_steps"), 2 * kEpochs) << r;
  }
  EXPECT_EQ(samples, double(kRecords) * kEpochs) << "every record of every epoch trained once";
}

TEST_F(TrainerTest, RanksUnderABatchPlanFinishEachEpochWithinAFewSteps) {
  // The finding (issue 27, bench/torch_straggler_bench.py): under a plan the ranks spent 9-14
  // steps each on weight-0 repeats at the epoch's end, because the records left were shared
  // equally while the ranks train unequal batches. Through pacerd: the sharding service reads
  // the plan in force from WorkerSessions.
  // Before (the sharding service not told the plan): short or empty steps per rank 12-13,
  // 11-12 and 1 (the two fast ranks idle while the slow one trains its last leases); now 1-4.
  const std::vector<std::string> results = RunPlannedRanks();
  double samples = 0;
  for (const std::string& r : results) {
    samples += Field(r, "samples");
    // A short or empty step while the others still train: a step or two an epoch, and one
    // more for what the others' reported progress lags behind.
    EXPECT_LE(Field(r, "short_steps"), 2 * 2 + 1) << r;
  }
  EXPECT_EQ(samples, 2.0 * 12000) << "every record of both epochs trained once";
}

TEST_F(TrainerTest, AWorkerKilledMidShardResumesAndNoRecordIsLostOrCountedTwice) {
  constexpr int kWorkers = 3;
  constexpr uint64_t kRecords = 6'000;
  constexpr uint32_t kEpochs = 2;
  auto start = [&](int i) {
    auto args = Args(i);
    for (const std::string& a :
         {std::string("--collective"), std::string("none"), std::string("--batch"),
          std::string("10"), std::string("--register-records"), std::to_string(kRecords),
          std::string("--epochs"), std::to_string(kEpochs), std::string("--shard-size"),
          std::string("100"), std::string("--step-ms"), std::string("4"), std::string("--ledger"),
          dir_.Sub("ledger-" + std::to_string(i))}) {
      args.push_back(a);
    }
    return Subprocess::Start(args, {}, dir_.Sub("w" + std::to_string(i) + ".log"));
  };
  std::vector<Subprocess> workers;
  for (int i = 0; i < kWorkers; ++i) workers.push_back(start(i));

  // Kill w0 once pacerd has acknowledged some of its progress and it holds a partly done
  // shard (an intent past the last completed prefix), then restart it under the same id.
  const std::string ledger0 = dir_.Sub("ledger-0");
  auto mid_shard = [&] {
    auto l = ReadLedger(ledger0);
    if (!l.ok()) return false;
    bool acked = false, partial = false;
    for (const auto& [id, lease] : *l) {
      uint64_t len = 0;
      for (auto [b, e] : lease.records) len += e - b;
      acked |= lease.acked > 0;
      partial |= lease.intent > 0 && lease.intent < len;
    }
    return acked && partial;
  };
  ASSERT_TRUE(WaitFor(mid_shard, std::chrono::seconds(60), std::chrono::milliseconds(2)))
      << "w0 never reached the middle of a shard; log:\n" << Log(0);
  workers[0].Signal(SIGKILL);
  ASSERT_NE(workers[0].Wait(std::chrono::seconds(30)), -1);
  workers[0] = start(0);

  for (int i = 0; i < kWorkers; ++i) {
    const int status = workers[i].Wait(std::chrono::minutes(4));
    ASSERT_NE(status, -1) << "worker " << i << " did not finish; log:\n" << Log(i);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << i << " status " << status << "; log:\n" << Log(i);
  }
  std::vector<std::vector<int>> count(kEpochs, std::vector<int>(kRecords, 0));
  std::vector<std::string> ledgers;
  for (int i = 0; i < kWorkers; ++i) ledgers.push_back(dir_.Sub("ledger-" + std::to_string(i)));
  auto l = ReadLedgers(ledgers);  // merged: a tail-backup pair may span two ledgers
  ASSERT_TRUE(l.ok()) << l.status();
  ForEachCountedRange(*l, [&](uint32_t e, uint64_t b, uint64_t end) {
    ASSERT_LT(e, kEpochs);
    for (uint64_t r = b; r < end; ++r) {
      ASSERT_LT(r, kRecords);
      count[e][r]++;
    }
  });
  for (uint32_t e = 0; e < kEpochs; ++e) {
    uint64_t missing = 0, twice = 0;
    for (uint64_t r = 0; r < kRecords; ++r) {
      missing += count[e][r] == 0;
      twice += count[e][r] > 1;
    }
    EXPECT_EQ(missing, 0u) << "epoch " << e << ": records lost";
    EXPECT_EQ(twice, 0u) << "epoch " << e << ": records counted twice";
  }
  const DatasetInfo info = Dataset();
  EXPECT_TRUE(info.finished());
  EXPECT_EQ(info.records_done_total(), kRecords * kEpochs);
  EXPECT_GT(info.requeues_total(), 0u) << "the killed worker's unconsumed suffix went back";
}

}  // namespace
}  // namespace pacer
