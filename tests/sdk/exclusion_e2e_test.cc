// EXCLUDE_WORKERS end to end with only real parts: an in-process pacerd (non-dedicated policy
// with burst exclusion), a pacer-agent process supervising 3 pacer-train-mlp workers (Gloo
// all-reduce on loopback, exactly-once ledgers), and a real burst of CPU contention on w2 (the
// agent's cgroup CPU quota, cgroup v1 as on this machine; skipped where it is not writable).
// Asserts what matters:
//  - the burst is excluded: pacerd decides EXCLUDE_WORKERS for w2 and w2 carries it out (hands
//    its leases back, trains on nothing, joins the all-reduce with weight 0), while the others
//    go on training;
//  - once the contention ends, w2's probe steps show it fast again and it is waited for again
//    before the data ends;
//  - under the per-step rule (the second policy) the trainers keep the step line: w2's burst
//    step passes it, w2 reports at once, and excluded by the reply abandons that step (weight
//    0, its records handed back uncounted);
//  - every record of the epoch is counted exactly once (the ledgers), the model reaches its
//    accuracy target, and every rank ends with identical parameters (the weight-0 rank applied
//    the same updates).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <regex>

#include "examples/consumer/ledger.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

using namespace std::chrono_literals;
using testing::BinaryPath;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

constexpr int kWorkers = 3;
constexpr uint64_t kRecords = 1'200'000;
constexpr double kTargetAccuracy = 0.9;

double Field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\":([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

std::string Checksum(const std::string& json) {
  std::smatch m;
  return std::regex_search(json, m, std::regex("\"checksum\":\"([0-9a-f]+)\"")) ? std::string(m[1]) : "";
}

// The parameter: the policy. burst-exclusion-e2e-1s decides on the monitor's windows and step
// reports; burst-step-rule-e2e-1s adds the per-step rule, whose line the trainers keep.
class ExclusionE2eTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", W_OK) != 0) {
      GTEST_SKIP() << "cgroup v1 cpu controller not writable here: no precise contention switch";
    }
    // pacerd in process (tests/testing/pacerd_harness.h) on the real clock, with its
    // housekeeping thread.
    h_.emplace(testing::HarnessOptions{.policy = GetParam(),
                                       .real_clock = true,
                                       .reconcile_interval_ms = 500,
                                       .start = false,
                                       .adjust = [](PacerdOptions& p) {
                                         p.sharding.heartbeat_interval_ms = 200;
                                         p.sharding.lease_timeout_ms = 10'000;
                                         p.sharding.worker_timeout_ms = 60'000;
                                       }});
    dir_ = &h_->dir();
    h_->Restart();
    ASSERT_TRUE(h_->ok());
    pacerd_ = &h_->pacerd();
  }
  bool StepRule() const { return std::string(GetParam()) == "burst-step-rule-e2e-1s"; }

  void TearDown() override {
    if (agent_.pid() > 0) {
      agent_.Signal(SIGTERM);
      if (agent_.Wait(20s) == -1) agent_.Kill();
    }
  }

  std::string Log() const { return ReadFileOrEmpty(dir_->Sub("agent.log")); }
  DatasetInfo Dataset() {
    ShardingClientOptions o;
    o.address = pacerd_->address();
    o.token = pacerd_->job_token();
    o.worker_id = "checker";
    auto c = ShardingClient::Connect(o);
    if (!c.ok()) return DatasetInfo();
    auto l = (*c)->ListDatasets();
    return l.ok() && l->datasets_size() == 1 ? l->datasets(0) : DatasetInfo();
  }
  // The audit, oldest first, one line per record (for failure messages).
  std::string Audit() {
    auto channel = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
    auto ctl = ControllerService::NewStub(channel);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    ListActionsResponse actions;
    if (!ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok()) return "(no audit)";
    std::string out;
    for (auto it = actions.actions().rbegin(); it != actions.actions().rend(); ++it) {
      out += it->kind() + " " + it->outcome() + " " + it->target() + ": " + it->reason() + " " +
             it->veto_reason() + " [" + it->dispatch() + "]\n";
    }
    ListWorkersResponse workers;
    if (pacerd_->monitor()->ListWorkers(ListWorkersRequest(), &workers).ok()) {
      for (const auto& w : workers.workers()) {
        out += w.id() + " speed " + std::to_string(w.speed()) + " smoothed " +
               std::to_string(w.smoothed_speed()) + " batch " + std::to_string(w.local_batch()) + "\n";
      }
    }
    return out;
  }
  std::vector<ActionRecord> Exclusions() {
    auto channel = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
    auto ctl = ControllerService::NewStub(channel);
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    ListActionsResponse actions;
    EXPECT_TRUE(ctl->ListActions(&ctx, ListActionsRequest(), &actions).ok());
    std::vector<ActionRecord> out;
    for (auto it = actions.actions().rbegin(); it != actions.actions().rend(); ++it) {
      if (it->kind() == "EXCLUDE_WORKERS" && it->outcome() == "executed") out.push_back(*it);
    }
    return out;
  }
  bool ContentionApplied(const absl::StatusOr<std::string>& id) {
    if (!id.ok()) return false;
    auto r = pacerd_->agents();
    return WaitFor([&] {
      auto c = r->Command(*id);
      return c.ok() && c->state != CommandState::kPending;
    }, 30s) && r->Command(*id)->state == CommandState::kDone;
  }

  std::optional<testing::PacerdHarness> h_;
  const TempDir* dir_ = nullptr;
  Pacerd* pacerd_ = nullptr;
  Subprocess agent_;
};

TEST_P(ExclusionE2eTest, ABurstOfRealContentionIsExcludedAndTheWorkerRejoins) {
  agent_ = Subprocess::Start(
      {BinaryPath("pacer-agent"), "--addr", pacerd_->address(), "--token-file",
       dir_->Sub("data/job.token"), "--node", "n0", "--workers", std::to_string(kWorkers),
       "--first-rank", "0", "--world-size", std::to_string(kWorkers), "--heartbeat-ms", "200",
       "--metrics-ms", "500", "--max-restarts", "0", "--contention-method", "cgroup", "--no-nvml",
       // Each worker on its own CPU budget: three trainers sharing two cores with pacerd and
       // other tests would otherwise differ by more than the threshold now and then.
       "--worker-cpu-limit", "0.4",
       // Under the step rule, steps of ~50 ms: a line at 2x a 10 ms step is crossed by
       // scheduling noise alone on a loaded machine, and the noise's exclusions would fill the
       // rule's one place.
       "--", BinaryPath("pacer-train-mlp"), "--store-dir", dir_->Sub("gloo"), "--rank", "{rank}",
       "--world-size", std::to_string(kWorkers), "--register-records", std::to_string(kRecords),
       "--epochs", "1", "--shard-size", StepRule() ? "8000" : "2000", "--batch", StepRule() ? "2048" : "512",
       "--hidden", "256", "--probe-ms", "300", "--ledger",
       dir_->Sub("ledger-{worker_id}"), "--result-file", dir_->Sub("result-{worker_id}.json"),
       "--target-accuracy", std::to_string(kTargetAccuracy)},
      {}, dir_->Sub("agent.log"));

  // Warm-up: every worker measured, some of the data done.
  ASSERT_TRUE(WaitFor([&] { return Dataset().records_done_total() >= kRecords / 10; }, 120s, 100ms))
      << Log();

  // The burst: w2 gets a quarter of the CPU it used. It lasts until w2 has carried the
  // exclusion out (its leases went back), and a little longer.
  auto on = pacerd_->agents()->SetContention("w2", 4.0);
  ASSERT_TRUE(ContentionApplied(on)) << Log();
  // (A 1 s window on a loaded machine can flag a worker by noise now and then, and a noise
  // exclusion is the policy working as written; the burst is what must be excluded.)
  ASSERT_TRUE(WaitFor([&] { return pacerd_->reconciler()->Exclusion().second == std::vector<std::string>{"w2"}; },
                      60s, 50ms))
      << "no exclusion of w2 within 60 s; audit:\n" << Audit() << "log:\n" << Log();
  ASSERT_TRUE(WaitFor([&] { return Log().find("excluded from the job's steps: handed back") != std::string::npos; },
                      30s, 50ms))
      << "w2 did not carry the exclusion out; log:\n" << Log();
  const uint64_t done_at_exclusion = Dataset().records_done_total();
  ASSERT_TRUE(WaitFor([&] { return Dataset().records_done_total() >= done_at_exclusion + kRecords / 20; }, 60s,
                      100ms))
      << "the others kept training without w2";

  auto off = pacerd_->agents()->ClearContention("n0", "w2");
  ASSERT_TRUE(ContentionApplied(off)) << Log();
  auto w2_excluded = [&] {
    const auto who = pacerd_->reconciler()->Exclusion().second;
    return std::find(who.begin(), who.end(), "w2") != who.end();
  };
  ASSERT_TRUE(WaitFor([&] { return !w2_excluded(); }, 60s, 50ms))
      << "w2 not waited for again within 60 s of the burst's end; log:\n" << Log();
  ASSERT_TRUE(WaitFor([&] { return Log().find("included in the job's steps again") != std::string::npos; }, 30s,
                      50ms))
      << Log();
  const uint64_t done_at_rejoin = Dataset().records_done_total();
  EXPECT_LT(done_at_rejoin, kRecords) << "the rejoin came before the end of the data";
  std::cout << "excluded at " << done_at_exclusion << ", rejoined at " << done_at_rejoin << " of " << kRecords
            << " records" << std::endl;

  // The job runs to the end of its data.
  for (int i = 0; i < kWorkers; ++i) {
    const std::string f = dir_->Sub("result-w" + std::to_string(i) + ".json");
    ASSERT_TRUE(WaitFor([&] { return !ReadFileOrEmpty(f).empty(); }, 240s, 100ms))
        << "worker " << i << " did not finish; log:\n" << Log();
  }
  std::string checksum;
  for (int i = 0; i < kWorkers; ++i) {
    const std::string r = ReadFileOrEmpty(dir_->Sub("result-w" + std::to_string(i) + ".json"));
    EXPECT_GE(Field(r, "accuracy"), kTargetAccuracy) << r;
    if (i == 0) checksum = Checksum(r);
    EXPECT_EQ(Checksum(r), checksum) << "rank " << i << " ended with different parameters: " << r;
    if (i == 2) {
      EXPECT_GT(Field(r, "excluded_steps"), 0) << r;
      // Under the step rule the burst's step passed the line; w2 reported it and, excluded by
      // the reply, abandoned it: its records went back uncounted (the ledgers below).
      if (StepRule()) EXPECT_GT(Field(r, "abandoned_steps"), 0) << r << "\nlog:\n" << Log();
    }
  }

  // Exactly once over the whole epoch, including the leases w2 handed back.
  std::vector<int> count(kRecords, 0);
  std::vector<std::string> ledgers;
  for (int i = 0; i < kWorkers; ++i) ledgers.push_back(dir_->Sub("ledger-w" + std::to_string(i)));
  auto l = ReadLedgers(ledgers);  // merged: a tail-backup pair may span two ledgers
  ASSERT_TRUE(l.ok()) << l.status();
  ForEachCountedRange(*l, [&](uint32_t e, uint64_t b, uint64_t end) {
    ASSERT_EQ(e, 0u);
    for (uint64_t r = b; r < end; ++r) {
      ASSERT_LT(r, kRecords);
      count[r]++;
    }
  });
  uint64_t missing = 0, twice = 0;
  for (int c : count) {
    missing += c == 0;
    twice += c > 1;
  }
  EXPECT_EQ(missing, 0u) << "records lost";
  EXPECT_EQ(twice, 0u) << "records counted twice";
  const DatasetInfo info = Dataset();
  EXPECT_TRUE(info.finished());
  EXPECT_EQ(info.records_done_total(), kRecords);
  EXPECT_GT(info.requeues_total(), 0u) << "w2's unread records went back to the queue";

  const std::vector<ActionRecord> ex = Exclusions();
  ASSERT_GE(ex.size(), 2u);
  const auto w2_record = std::find_if(ex.begin(), ex.end(), [](const ActionRecord& a) {
    return a.target() == "w2" && a.dispatch() == "sent in heartbeat replies: excluded w2";
  });
  ASSERT_NE(w2_record, ex.end()) << Audit();
  EXPECT_GT(w2_record->predicted_gain(), 0.05);
  std::cout << "exclusions: " << ex.size() << "; " << w2_record->reason() << std::endl;
}

INSTANTIATE_TEST_SUITE_P(Policies, ExclusionE2eTest,
                         ::testing::Values("burst-exclusion-e2e-1s", "burst-step-rule-e2e-1s"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param).find("step-rule") != std::string::npos ? "StepRule"
                                                                                               : "WindowRule";
                         });

}  // namespace
}  // namespace pacer
