// Crash test (label chaos): pacerd is kill -9'ed at random moments (at least 20 times) while 4
// worker processes consume 2 epochs, and workers are kill -9'ed too. Each worker keeps a ledger
// of what it was given and what the service acknowledged (examples/consumer/ledger.h). At the
// end every record of every epoch must appear done exactly once, and nothing may be missing.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "common/auth.h"
#include "tests/testing/ledger_check.h"
#include "tests/testing/pacerd_process.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::BinaryPath;
using testing::PacerdProcess;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

// Long enough for kMinPacerdKills at the fault pace below: the consumers reconnect within a few
// hundred ms of each restart, and with 24 000 records the job ended after 7-16 kills.
constexpr uint64_t kRecords = 24'000;
constexpr uint32_t kEpochs = 2;
constexpr int kWorkers = 4;
constexpr int kMinPacerdKills = 20;


TEST(CrashTest, KillNinePacerdAndWorkersEveryRecordCountedExactlyOnce) {
  TempDir dir;
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("PACER_CHAOS_SEED")) seed = std::stoull(s);
  std::cout << "chaos seed " << seed << " (rerun with PACER_CHAOS_SEED=" << seed << ")" << std::endl;
  std::mt19937_64 rng(seed);

  PacerdProcess pacerd(dir, {"--lease-timeout-ms", "2000", "--worker-timeout-ms", "6000",
                             "--snapshot-every", "300"});
  pacerd.Start();
  ASSERT_FALSE(HasFatalFailure());

  // 8 ms a batch: the job outlasts the 20 pacerd kills however fast workers reconnect.
  auto start_worker = [&](int i) {
    return Subprocess::Start(
        {BinaryPath("pacer-consume"), "--addr", "127.0.0.1:" + std::to_string(pacerd.port()),
         "--token-file", dir.Sub("data/job.token"), "--worker-id", "w" + std::to_string(i),
         "--dataset", "train", "--register-records", std::to_string(kRecords), "--shard-size",
         "96", "--epochs", std::to_string(kEpochs), "--shuffle", "shards",
         "--max-attempts", "1000000", "--batch", "8", "--step-ms", "8", "--quiet", "--ledger",
         dir.Sub("ledger-" + std::to_string(i))},
        {}, dir.Sub("worker-" + std::to_string(i) + ".log"));
  };
  std::vector<Subprocess> workers;
  std::vector<bool> finished(kWorkers, false);
  for (int i = 0; i < kWorkers; ++i) workers.push_back(start_worker(i));

  int pacerd_kills = 0, worker_kills = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(4);
  while (std::chrono::steady_clock::now() < deadline) {
    // Chaos pacing (not synchronisation): the next fault comes 50..300 ms later.
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 250));
    bool all_done = true;
    for (int i = 0; i < kWorkers; ++i) {
      if (finished[i]) continue;
      if (!workers[i].running()) {
        const int status = workers[i].exit_status();
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          finished[i] = true;
          continue;
        }
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {  // killed by us: restart
          workers[i] = start_worker(i);
        } else {
          FAIL() << "worker " << i << " failed (status " << status << "):\n"
                 << ReadFileOrEmpty(dir.Sub("worker-" + std::to_string(i) + ".log"));
        }
      }
      all_done = false;
    }
    if (all_done) break;
    // Until the minimum is reached pacerd dies often, then rarely, so the run stays short.
    const int dice = static_cast<int>(rng() % 10);
    const int pacerd_odds = pacerd_kills < kMinPacerdKills ? 6 : 2;
    if (dice < pacerd_odds) {
      pacerd.Kill9();
      ++pacerd_kills;
      pacerd.Start();
      ASSERT_FALSE(HasFatalFailure());
    } else if (dice < pacerd_odds + 3) {
      const int i = static_cast<int>(rng() % kWorkers);
      if (!finished[i] && workers[i].running()) {
        workers[i].Signal(SIGKILL);
        ++worker_kills;
      }
    }
  }
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(finished[i]) << "worker " << i << " did not finish in time; log:\n"
                             << ReadFileOrEmpty(dir.Sub("worker-" + std::to_string(i) + ".log"));
  }
  std::cout << "pacerd kill -9: " << pacerd_kills << ", worker kill -9: " << worker_kills
            << std::endl;
  EXPECT_GE(pacerd_kills, kMinPacerdKills) << "the job ended before enough faults were injected";

  // The ledgers: every record of every epoch counted exactly once.
  std::vector<std::string> ledgers;
  for (int i = 0; i < kWorkers; ++i) ledgers.push_back(dir.Sub("ledger-" + std::to_string(i)));
  testing::ExpectEveryRecordCountedOnce(ledgers, kEpochs, kRecords);

  auto token = LoadToken(dir.Sub("data/job.token"), false);
  ASSERT_TRUE(token.ok());
  testing::ExpectServiceCountedAll("127.0.0.1:" + std::to_string(pacerd.port()), *token, kEpochs, kRecords);
}

}  // namespace
}  // namespace pacer
