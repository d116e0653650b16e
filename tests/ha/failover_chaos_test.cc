// Failover chaos (label chaos): two pacerds share one journal in a 3-member etcd cluster
// (--journal etcd://...); one leads, the other waits as a standby. While 4 worker processes
// consume 2 epochs with fsync'd ledgers, the leader is kill -9'ed at random moments (at least
// 20 times), its local data dir deleted each time, and started again as a standby: the standby
// takes over each time. At the end every record of every epoch is counted exactly once in the
// ledgers, the service's counters agree, and no epoch stalled (the job finished in time).
// Prints the failover times (leader killed -> the new leader accepts connections).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "tests/ha/ha_job.h"
#include "tests/testing/ledger_check.h"

namespace pacer {
namespace {

using testing::EtcdAvailable;
using testing::EtcdCluster;
using testing::HaJob;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

constexpr uint64_t kRecords = 16'000;
constexpr uint32_t kEpochs = 2;
constexpr int kWorkers = 4;
constexpr int kMinFailovers = 20;

TEST(FailoverChaosTest, KillNineTheLeaderAndDeleteItsDataEveryRecordCountedExactlyOnce) {
  if (!EtcdAvailable()) GTEST_SKIP() << testing::kEtcdMissing;
  TempDir dir;
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("PACER_CHAOS_SEED")) seed = std::stoull(s);
  std::cout << "chaos seed " << seed << " (rerun with PACER_CHAOS_SEED=" << seed << ")" << std::endl;
  std::mt19937_64 rng(seed);

  auto cluster = EtcdCluster::Start(dir);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  HaJob job(dir, cluster->get(), kRecords, kEpochs);
  ASSERT_FALSE(HasFailure());
  job.StartPacerd(0);
  ASSERT_TRUE(WaitFor([&] { return job.ServingLeader() == 0; }, std::chrono::seconds(30))) << job.pacerd_log(0);
  job.StartPacerd(1);

  std::vector<Subprocess> workers;
  // 20 ms a batch: the job outlasts 20 failovers (~2 s of pause each) however fast the rest is.
  for (int i = 0; i < kWorkers; ++i) workers.push_back(job.StartWorker(i, job.addresses(), "20"));
  auto running = [&] {
    for (auto& w : workers) {
      if (w.running()) return true;
    }
    return false;
  };
  std::vector<double> failover_s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(4);
  while (std::chrono::steady_clock::now() < deadline && running() && failover_s.size() < kMinFailovers) {
    // Chaos pacing (not synchronisation): the leader serves 100..900 ms before it dies.
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 800));
    const int leader = job.ServingLeader();
    if (leader < 0) continue;
    const auto killed = std::chrono::steady_clock::now();
    job.pacerd(leader).Kill();
    std::filesystem::remove_all(job.data_dir(leader));
    job.StartPacerd(leader);  // a standby now
    const int other = 1 - leader;
    ASSERT_TRUE(WaitFor([&] { return job.ServingLeader() == other; }, std::chrono::seconds(30)))
        << "after " << failover_s.size() << " failovers, the standby did not take over; its log:\n"
        << job.pacerd_log(other) << "\nthe killed one's:\n" << job.pacerd_log(leader);
    failover_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
  }
  ASSERT_GE(failover_s.size(), static_cast<size_t>(kMinFailovers))
      << "the job ended before enough failovers were injected";
  ASSERT_TRUE(WaitFor([&] { return !running(); }, std::chrono::minutes(2))) << "an epoch stalled";
  EXPECT_TRUE(testing::AllWorkersDone(workers, job));
  std::sort(failover_s.begin(), failover_s.end());
  std::cout << "failovers: " << failover_s.size() << ", leader killed -> new leader serving: p50 "
            << failover_s[failover_s.size() / 2] << " s, max " << failover_s.back() << " s" << std::endl;

  std::vector<std::string> ledgers;
  for (int i = 0; i < kWorkers; ++i) ledgers.push_back(job.ledger(i));
  testing::ExpectEveryRecordCountedOnce(ledgers, kEpochs, kRecords);
  job.ExpectServiceCountedAll();
}

}  // namespace
}  // namespace pacer
