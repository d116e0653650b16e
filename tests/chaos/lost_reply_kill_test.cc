// Lost replies by crash: the pacerd binary runs as a
// child process and is SIGKILLed again and again while four SDK trainers (Client + ShardReader
// + ledger, in this process) consume two epochs, then restarted on the same data dir and port.
// Each kill lands while a trainer's leasing call (a fetch, or a completion that leases the next
// shard) is in flight, often while its group commit is being written: the update reaches the
// WAL (the process dies, the kernel keeps what it wrote) and no reply leaves. The trainers retry
// with the same request id and get the lease that was committed for them, or, when they gave
// up, pacerd releases it at their next heartbeat. Before lost replies were harmless, one such
// lease stalled the epoch for ever (the trainer renewed a lease it never saw).
// At the end: every record of every epoch counted exactly once in the ledgers, the service
// agrees, nothing is left leased.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "common/auth.h"
#include "tests/sdk/ledger_consumer.h"
#include "tests/testing/pacerd_process.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

using testing::BinaryPath;
using testing::PacerdProcess;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

constexpr uint64_t kRecords = 12'000;
constexpr uint32_t kEpochs = 2;
constexpr int kWorkers = 4;
constexpr int kMinKills = 25;


TEST(LostReplyKillTest, PacerdKilledBetweenCommitAndReplyEveryRecordOnceAndTheEpochsFinish) {
  TempDir dir;
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("PACER_CHAOS_SEED")) seed = std::stoull(s);
  std::cout << "chaos seed " << seed << " (rerun with PACER_CHAOS_SEED=" << seed << ")" << std::endl;
  std::mt19937_64 rng(seed);

  PacerdProcess pacerd(dir, {"--heartbeat-interval-ms", "100", "--snapshot-every", "200"});
  pacerd.Start();
  ASSERT_FALSE(HasFatalFailure());
  auto token = LoadToken(dir.Sub("data/job.token"), false);
  ASSERT_TRUE(token.ok()) << token.status();
  {
    ShardingClientOptions o;
    o.address = pacerd.address();
    o.token = *token;
    o.worker_id = "setup";
    auto c = ShardingClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    DatasetSpec spec;
    spec.set_name("train");
    spec.set_num_records(kRecords);
    spec.set_shard_size(40);
    spec.set_num_epochs(kEpochs);
    spec.set_shuffle(SHUFFLE_SHARDS);
    spec.set_seed(11);
    ASSERT_TRUE((*c)->RegisterDataset(spec).ok());
  }

  std::vector<std::unique_ptr<testing::LedgerConsumer>> consumers;
  std::vector<std::string> ledgers;
  for (int i = 0; i < kWorkers; ++i) {
    ClientOptions o;
    o.address = pacerd.address();
    o.token = *token;
    o.worker_id = "w" + std::to_string(i);
    o.connect_budget_ms = 60'000;  // outlasts any restart
    o.rpc_timeout_ms = 2'000;
    o.report_steps = false;
    ledgers.push_back(dir.Sub("ledger-" + std::to_string(i)));
    consumers.push_back(std::make_unique<testing::LedgerConsumer>(
        o, ledgers.back(), /*prefetch_leases=*/1, /*batch=*/10, std::chrono::microseconds(4'000)));
  }
  std::vector<absl::Status> results(kWorkers);
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      results[i] = consumers[i]->Run();
      ++finished;
    });
  }
  // Kill while they consume: at least kMinKills times, then let them finish.
  int kills = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (finished.load() < kWorkers && std::chrono::steady_clock::now() < deadline) {
    if (kills < kMinKills) {
      // Chaos pacing (not synchronisation): let them run 50..250 ms, then kill as soon as a
      // leasing call is in flight, 0..3 ms into it (its commit is written or being written).
      std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 200));
      WaitFor([&] {
        for (auto& c : consumers) if (c->leasing_in_flight()) return true;
        return finished.load() == kWorkers;
      }, std::chrono::seconds(2), std::chrono::milliseconds(1));
      if (finished.load() == kWorkers) break;
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3'000));
      pacerd.Kill9();
      ++kills;
      pacerd.Start();
      if (HasFatalFailure()) break;
    } else {
      WaitFor([&] { return finished.load() == kWorkers; },
              std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now()));
    }
  }
  const bool done = finished.load() == kWorkers;
  if (!done) {
    ADD_FAILURE() << "the trainers did not finish within 90 s (a stalled epoch?)";
    for (auto& c : consumers) c->Stop();
  }
  for (auto& t : threads) t.join();
  if (!done || HasFatalFailure()) return;
  uint64_t retried = 0, released = 0;
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_TRUE(results[i].ok()) << "w" << i << ": " << results[i];
    retried += consumers[i]->leasing().retried_attempts;
    released += consumers[i]->stats().leases_released_unknown;
  }
  std::cout << "pacerd kill -9: " << kills << ", leasing attempts retried: " << retried
            << ", leases released as never received: " << released << std::endl;
  EXPECT_GE(kills, 5) << "the job ended before enough kills";
  EXPECT_GT(retried, 0u) << "no kill hit a leasing call: the test did not test it";

  testing::ExpectEachRecordCountedOnce(ledgers, kEpochs, kRecords);
  ShardingClientOptions o;
  o.address = pacerd.address();
  o.token = *token;
  o.worker_id = "checker";
  auto c = ShardingClient::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto list = (*c)->ListDatasets();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->datasets_size(), 1);
  EXPECT_TRUE(list->datasets(0).finished());
  EXPECT_EQ(list->datasets(0).records_done_total(), kRecords * kEpochs);
  EXPECT_EQ(list->datasets(0).active_leases(), 0u);
}

}  // namespace
}  // namespace pacer
