// Fencing (label chaos): a leader pacerd that stops being able to lead — frozen past its lease
// (SIGSTOP), or cut off from etcd while it keeps running (a stalled TCP proxy between it and
// every etcd member) — never writes again: the standby takes over and serves, the old leader's
// writes are refused by etcd's compare on its election key, and it exits (code 75) as soon as it
// runs or its lease's deadline passes. The job's ledgers stay exact.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/ha/ha_job.h"
#include "tests/testing/ledger_check.h"
#include "tests/testing/tcp_proxy.h"

namespace pacer {
namespace {

using testing::EtcdAvailable;
using testing::EtcdCluster;
using testing::HaJob;
using testing::Subprocess;
using testing::TcpProxy;
using testing::TempDir;
using testing::WaitFor;

constexpr uint64_t kRecords = 6'000;
constexpr uint32_t kEpochs = 2;

// Whether `ledger` holds at least one counted record (the worker made progress).
bool Progressed(const std::string& ledger) {
  std::error_code ec;
  return std::filesystem::file_size(ledger, ec) > 0 && !ec;
}

int ExitCode(Subprocess& p) {
  const int status = p.exit_status();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

class FencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdAvailable()) GTEST_SKIP() << testing::kEtcdMissing;
    auto c = EtcdCluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    job_ = std::make_unique<HaJob>(dir_, cluster_.get(), kRecords, kEpochs);
  }
  void TearDown() override {
    if (!job_) return;
    std::vector<std::string> ledgers;
    for (int i = 0; i < workers_; ++i) ledgers.push_back(job_->ledger(i));
    if (!HasFailure()) {
      testing::ExpectEveryRecordCountedOnce(ledgers, kEpochs, kRecords);
      job_->ExpectServiceCountedAll();
    }
  }
  // Workers on the old leader's address first; the one started during the takeover on the new
  // leader's first, so that it is served while the old one is frozen or cut off.
  void RunWorkersUntilDone(std::vector<Subprocess>& workers) {
    auto running = [&] {
      for (auto& w : workers) {
        if (w.running()) return true;
      }
      return false;
    };
    ASSERT_TRUE(WaitFor([&] { return !running(); }, std::chrono::minutes(3))) << "the job stalled";
    EXPECT_TRUE(testing::AllWorkersDone(workers, *job_));
  }

  TempDir dir_;
  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<HaJob> job_;
  int workers_ = 0;
};

TEST_F(FencingTest, ALeaderFrozenPastItsLeaseStepsDownWhenItRunsAgain) {
  job_->StartPacerd(0);
  ASSERT_TRUE(WaitFor([&] { return job_->ServingLeader() == 0; }, std::chrono::seconds(30))) << job_->pacerd_log(0);
  job_->StartPacerd(1);
  std::vector<Subprocess> workers;
  workers.push_back(job_->StartWorker(0, job_->addresses(0)));
  workers.push_back(job_->StartWorker(1, job_->addresses(0)));
  workers_ = 2;
  ASSERT_TRUE(WaitFor([&] { return Progressed(job_->ledger(0)); }, std::chrono::seconds(30)));

  job_->pacerd(0).Signal(SIGSTOP);
  ASSERT_TRUE(WaitFor([&] { return job_->ServingLeader() == 1; }, std::chrono::seconds(30)))
      << "the standby did not take over:\n" << job_->pacerd_log(1);
  // The new leader serves: a worker that names it first makes progress while the old one is frozen.
  workers.push_back(job_->StartWorker(2, job_->addresses(1)));
  workers_ = 3;
  ASSERT_TRUE(WaitFor([&] { return Progressed(job_->ledger(2)); }, std::chrono::seconds(30))) << job_->worker_log(2);

  job_->pacerd(0).Signal(SIGCONT);
  // Past its lease's deadline, it steps down at once: it exits, and nothing it held is written.
  ASSERT_TRUE(WaitFor([&] { return !job_->pacerd(0).running(); }, std::chrono::seconds(10)))
      << "the old leader still runs:\n" << job_->pacerd_log(0);
  EXPECT_EQ(ExitCode(job_->pacerd(0)), 75) << job_->pacerd_log(0);
  EXPECT_NE(job_->pacerd_log(0).find("leadership lost"), std::string::npos) << job_->pacerd_log(0);
  RunWorkersUntilDone(workers);
}

TEST_F(FencingTest, ALeaderCutOffFromEtcdStepsDownWhileTheStandbyTakesOver) {
  // pacerd 0 reaches every etcd member through a proxy the test can stall.
  std::vector<std::unique_ptr<TcpProxy>> proxies;
  std::string through;
  for (const std::string& ep : cluster_->endpoints()) {
    auto p = TcpProxy::Start(ep);
    ASSERT_TRUE(p.ok()) << p.status();
    through += (through.empty() ? "" : ",") + (*p)->address();
    proxies.push_back(std::move(*p));
  }
  job_->StartPacerd(0, through);
  ASSERT_TRUE(WaitFor([&] { return job_->ServingLeader() == 0; }, std::chrono::seconds(30))) << job_->pacerd_log(0);
  job_->StartPacerd(1);
  std::vector<Subprocess> workers;
  workers.push_back(job_->StartWorker(0, job_->addresses(0)));
  workers.push_back(job_->StartWorker(1, job_->addresses(0)));
  workers_ = 2;
  ASSERT_TRUE(WaitFor([&] { return Progressed(job_->ledger(0)); }, std::chrono::seconds(30)));

  for (auto& p : proxies) p->Stall();  // a partition: connections open, nothing flows
  // It keeps running, but its keepalives go unanswered: it demotes itself at its lease's
  // deadline (before etcd could elect another) and exits; the standby takes over.
  ASSERT_TRUE(WaitFor([&] { return !job_->pacerd(0).running(); }, std::chrono::seconds(15)))
      << "the cut-off leader still runs:\n" << job_->pacerd_log(0);
  EXPECT_EQ(ExitCode(job_->pacerd(0)), 75) << job_->pacerd_log(0);
  ASSERT_TRUE(WaitFor([&] { return job_->ServingLeader() == 1; }, std::chrono::seconds(30)))
      << "the standby did not take over:\n" << job_->pacerd_log(1);
  for (auto& p : proxies) p->Resume();
  RunWorkersUntilDone(workers);
}

}  // namespace
}  // namespace pacer
