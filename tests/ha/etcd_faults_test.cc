// etcd's own faults under a running job (label chaos), with pacerd's journal in etcd: etcd
// members killed and restarted (the raft leader among them) cost only retries, and etcd's quota
// reached (someone else filled the cluster) makes pacerd refuse updates clearly — gRPC health
// NOT_SERVING, workers waiting — until the operator frees space, after which the job goes on.
// Every record is counted exactly once either way.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <tuple>

#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "tests/ha/ha_job.h"
#include "tests/testing/ledger_check.h"

namespace pacer {
namespace {

using testing::BinaryPath;
using testing::EtcdAvailable;
using testing::EtcdCluster;
using testing::HaJob;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

constexpr uint64_t kRecords = 6'000;
constexpr uint32_t kEpochs = 2;
constexpr int kWorkers = 3;

uintmax_t LedgerBytes(HaJob& job) {
  uintmax_t total = 0;
  for (int i = 0; i < kWorkers; ++i) {
    std::error_code ec;
    const uintmax_t n = std::filesystem::file_size(job.ledger(i), ec);
    if (!ec) total += n;
  }
  return total;
}

// The job's workers make progress from now on (their ledgers grow).
bool Progresses(HaJob& job) {
  const uintmax_t before = LedgerBytes(job);
  return WaitFor([&] { return LedgerBytes(job) > before; }, std::chrono::seconds(30));
}

// pacer-probe's answer for pacerd at `address`: 0 SERVING, 1 NOT_SERVING (or unreachable).
int Probe(const std::string& address) {
  Subprocess p = Subprocess::Start({BinaryPath("pacer-probe"), "--addr", address, "--plaintext"});
  const int status = p.Wait(std::chrono::seconds(10));
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class EtcdFaultsTest : public ::testing::Test {
 protected:
  void Start(EtcdCluster::Options options) {
    auto c = EtcdCluster::Start(dir_, 3, options);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    job_ = std::make_unique<HaJob>(dir_, cluster_.get(), kRecords, kEpochs);
    job_->StartPacerd(0);
    ASSERT_TRUE(WaitFor([&] { return job_->ServingLeader() == 0; }, std::chrono::seconds(30)))
        << job_->pacerd_log(0);
    job_->StartPacerd(1);
    for (int i = 0; i < kWorkers; ++i) workers_.push_back(job_->StartWorker(i, job_->addresses(), "20"));
    ASSERT_TRUE(Progresses(*job_));
  }
  void FinishExactly() {
    ASSERT_TRUE(WaitFor(
        [&] {
          for (auto& w : workers_) {
            if (w.running()) return false;
          }
          return true;
        },
        std::chrono::minutes(3)))
        << "the job stalled";
    EXPECT_TRUE(testing::AllWorkersDone(workers_, *job_));
    std::vector<std::string> ledgers;
    for (int i = 0; i < kWorkers; ++i) ledgers.push_back(job_->ledger(i));
    testing::ExpectEveryRecordCountedOnce(ledgers, kEpochs, kRecords);
    job_->ExpectServiceCountedAll();
  }

  TempDir dir_;
  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<HaJob> job_;
  std::vector<Subprocess> workers_;
};

TEST_F(EtcdFaultsTest, EtcdMembersKilledAndRestartedDuringARunCostOnlyRetries) {
  if (!EtcdAvailable()) GTEST_SKIP() << testing::kEtcdMissing;
  Start(EtcdCluster::Options());
  ASSERT_FALSE(HasFatalFailure());
  const int leader = cluster_->WaitForLeader();
  ASSERT_GE(leader, 0);
  cluster_->Kill(leader);  // etcd's raft leader: the others elect another
  EXPECT_TRUE(Progresses(*job_)) << "no progress without etcd's old leader";
  ASSERT_TRUE(cluster_->Restart(leader).ok());
  const int follower = (cluster_->WaitForLeader() + 1) % 3;
  cluster_->Kill(follower);
  EXPECT_TRUE(Progresses(*job_)) << "no progress without one follower";
  ASSERT_TRUE(cluster_->Restart(follower).ok());
  FinishExactly();
  // A slow etcd election can cost the leader its lease (TTL 2 s): it then exits with code 75, by
  // design, and its supervisor starts it again as a standby. This test is that supervisor.
  const bool handed_over = !job_->pacerd(0).running();
  for (int i = 0; i < HaJob::kPacerds; ++i) {
    if (job_->pacerd(i).running()) continue;
    const int ws = job_->pacerd(i).exit_status();
    EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 75) << "pacerd " << i << " ended with wait status " << ws
                                                       << ", not 75 (leadership lost)\n"
                                                       << job_->pacerd_log(i);
    job_->StartPacerd(i);
  }
  // pacerctl status names the leader and the standby.
  std::string status;
  int rc = -1;
  int now = -1;
  const bool named = WaitFor(
      [&] {
        now = job_->ServingLeader();
        if (now < 0) return false;
        std::tie(status, rc) = job_->PacerctlStatus();
        return rc == 0 && status.find("standbys: " + job_->address(1 - now)) != std::string::npos;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(200));
  EXPECT_TRUE(named) << "status never named the standby:\n" << status;
  ASSERT_GE(now, 0);
  EXPECT_NE(status.find("leader       " + job_->address(now) + " (journal in etcd under jobs/ha"), std::string::npos)
      << status;
  std::cout << "pacerd 0 " << (handed_over ? "handed over to its standby" : "led throughout") << std::endl;
}

TEST_F(EtcdFaultsTest, EtcdsQuotaReachedRefusesUpdatesUntilTheOperatorFreesSpace) {
  if (!EtcdAvailable()) GTEST_SKIP() << testing::kEtcdMissing;
  EtcdCluster::Options small;
  small.quota_backend_bytes = 16 << 20;
  Start(small);
  ASSERT_FALSE(HasFatalFailure());
  // Someone else fills the cluster until etcd raises its NOSPACE alarm.
  EtcdClientOptions eo;
  eo.endpoints = cluster_->endpoints();
  auto etcd = EtcdClient::Connect(eo);
  ASSERT_TRUE(etcd.ok());
  const std::string junk(1 << 20, 'j');
  bool full = false;
  int transient = 0;  // a 1 MiB put can time out on a loaded machine: put it again
  for (int i = 0; i < 64 && !full;) {
    auto put = (*etcd)->Put(absl::StrCat("others/junk-", i), junk);
    if (put.ok()) {
      ++i;
    } else if (IsEtcdNoSpace(put.status())) {
      full = true;
    } else {
      ASSERT_LT(++transient, 20) << put.status();
    }
  }
  ASSERT_TRUE(full) << "the quota was never reached";
  const int leader = job_->ServingLeader();
  ASSERT_GE(leader, 0);
  ASSERT_TRUE(WaitFor([&] { return Probe(job_->address(leader)) == 1; }, std::chrono::seconds(30)))
      << "pacerd never said NOT_SERVING:\n" << job_->pacerd_log(leader);
  EXPECT_NE(job_->pacerd_log(leader).find("NOSPACE"), std::string::npos);
  const uintmax_t stalled_at = LedgerBytes(*job_);

  // The operator: delete what filled it, compact, defragment every member, disarm the alarm.
  ASSERT_TRUE((*etcd)->DeleteRange("others/", EtcdPrefixEnd("others/")).ok());
  auto status = (*etcd)->MemberStatus(0);
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE((*etcd)->Compact(status->header().revision()).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*etcd)->Defragment(i).ok());
  ASSERT_TRUE((*etcd)->DisarmNoSpace().ok());
  ASSERT_TRUE(WaitFor([&] { return Probe(job_->address(job_->ServingLeader() < 0 ? leader : job_->ServingLeader())) == 0; },
                      std::chrono::seconds(30)))
      << "pacerd did not resume:\n" << job_->pacerd_log(leader);
  FinishExactly();
  EXPECT_GT(LedgerBytes(*job_), stalled_at);
}

}  // namespace
}  // namespace pacer
