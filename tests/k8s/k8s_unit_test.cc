// Units of the agent's Kubernetes form:
//  - KubeClient::MarkNode over real TLS to FakeKubeApi (the request, the reply classes: a
//    missing node is an error, not "gone"), the refusal hold after a 401/403 (no request while it
//    holds, then one again), BadNodeLabelKey;
//  - ProcessAttacher's process search: FindWorkerProcess on synthetic process tables, and
//    ListProcesses on a fake /proc tree (comm fields with spaces and parentheses, kernel threads,
//    entries that vanish).
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "agent/kube_client.h"
#include "agent/process_attacher.h"
#include "tests/agent/fake_kube_api.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::FakeKubeApi;
using testing::KubeStatusBody;
using testing::TempDir;

class MarkNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Sub("token")) << "the-bearer-token\n";
    options_.endpoint = *ParseKubeApiUrl(api_.url());
    options_.token_file = dir_.Sub("token");
    options_.ca_file = api_.ca_file();
    options_.namespace_name = "pacer-jobs";
    options_.pod_name = "job-w1";
    options_.node_name = "gpu-node-7";
    options_.attempt_timeout_ms = 5000;
    options_.max_attempts = 3;
    options_.backoff_initial_ms = 50;
  }
  // Runs `calls` one after the other on one client (so it keeps its refusal memory).
  std::vector<absl::StatusOr<PodDeletion>> Run(std::vector<std::function<void(KubeClient&, KubeClient::DeleteDone)>> calls) {
    boost::asio::io_context io;
    KubeClient client(io, options_);
    std::vector<absl::StatusOr<PodDeletion>> results;
    std::function<void(size_t)> next = [&](size_t i) {
      if (i == calls.size()) return;
      calls[i](client, [&, i](absl::StatusOr<PodDeletion> r) {
        results.push_back(std::move(r));
        next(i + 1);
      });
    };
    next(0);
    io.run_for(std::chrono::seconds(60));
    return results;
  }
  static void Mark(KubeClient& c, KubeClient::DeleteDone d) {
    c.MarkNode("bad-node.pacer.dev/mlp", "1700000000", std::move(d));
  }

  TempDir dir_;
  FakeKubeApi api_{dir_.path()};
  KubeClientOptions options_;
};

TEST_F(MarkNodeTest, PatchesExactlyTheOneLabelOnTheOwnNode) {
  auto r = Run({Mark});
  ASSERT_EQ(r.size(), 1u);
  ASSERT_TRUE(r[0].ok()) << r[0].status();
  const auto reqs = api_.Requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].method, "PATCH");
  EXPECT_EQ(reqs[0].target, "/api/v1/nodes/gpu-node-7");
  EXPECT_EQ(reqs[0].content_type, "application/merge-patch+json");
  EXPECT_EQ(reqs[0].authorization, "Bearer the-bearer-token");
  EXPECT_EQ(nlohmann::json::parse(reqs[0].body),
            nlohmann::json::parse(R"({"metadata":{"labels":{"bad-node.pacer.dev/mlp":"1700000000"}}})"));
}

TEST_F(MarkNodeTest, AMissingNodeIsAnErrorNotGone) {
  api_.SetDefault({404, KubeStatusBody(404, "NotFound", "nodes gpu-node-7 not found")});
  auto r = Run({Mark});
  ASSERT_EQ(r.size(), 1u);
  ASSERT_FALSE(r[0].ok());
  EXPECT_EQ(r[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r[0].status().message().find("not found"), std::string::npos) << r[0].status();
}

TEST_F(MarkNodeTest, WithoutANodeNameNothingIsSent) {
  options_.node_name.clear();
  auto r = Run({Mark});
  ASSERT_EQ(r.size(), 1u);
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].status().message().find("NODE_NAME"), std::string::npos) << r[0].status();
  EXPECT_TRUE(api_.Requests().empty());
}

TEST_F(MarkNodeTest, AfterA403NothingIsAskedWhileTheHoldLasts) {
  api_.SetDefault({403, KubeStatusBody(403, "Forbidden", "cannot patch resource nodes")});
  options_.refusal_hold_ms = 60'000;
  auto r = Run({Mark, Mark, [](KubeClient& c, KubeClient::DeleteDone d) { c.DeletePod(std::move(d)); }});
  ASSERT_EQ(r.size(), 3u);
  for (const auto& x : r) {
    ASSERT_FALSE(x.ok());
    EXPECT_EQ(x.status().code(), absl::StatusCode::kPermissionDenied) << x.status();
  }
  EXPECT_NE(r[0].status().message().find("'patch' on 'nodes'"), std::string::npos) << r[0].status();
  EXPECT_NE(r[1].status().message().find("not asked again"), std::string::npos) << r[1].status();
  EXPECT_NE(r[2].status().message().find("not asked again"), std::string::npos) << r[2].status();
  EXPECT_EQ(api_.Requests().size(), 1u);
}

TEST_F(MarkNodeTest, TheHoldEndsAndASuccessClearsIt) {
  api_.Push({401, KubeStatusBody(401, "Unauthorized", "Unauthorized")});  // then 200s
  options_.refusal_hold_ms = 200;
  boost::asio::io_context io;
  KubeClient client(io, options_);
  std::vector<absl::StatusOr<PodDeletion>> r;
  boost::asio::steady_timer after_hold(io);
  Mark(client, [&](absl::StatusOr<PodDeletion> first) {
    r.push_back(first);
    Mark(client, [&](absl::StatusOr<PodDeletion> second) {  // within the hold: not sent
      r.push_back(second);
      after_hold.expires_after(std::chrono::milliseconds(300));
      after_hold.async_wait([&](const boost::system::error_code&) {
        Mark(client, [&](absl::StatusOr<PodDeletion> third) { r.push_back(third); });
      });
    });
  });
  io.run_for(std::chrono::seconds(60));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r[1].status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(r[1].status().message().find("not asked again"), std::string::npos) << r[1].status();
  EXPECT_TRUE(r[2].ok()) << r[2].status();
  EXPECT_EQ(api_.Requests().size(), 2u);
}

TEST(BadNodeLabelKeyTest, TheJobNameMustBeALabelName) {
  EXPECT_EQ(*BadNodeLabelKey("mlp-js"), "bad-node.pacer.dev/mlp-js");
  EXPECT_EQ(*BadNodeLabelKey("Train_2.b"), "bad-node.pacer.dev/Train_2.b");
  for (const char* bad : {"", "-x", "x-", "a/b", "a b", "ä", "x:y"}) {
    EXPECT_FALSE(BadNodeLabelKey(bad).ok()) << bad;
  }
  EXPECT_TRUE(BadNodeLabelKey(std::string(63, 'a')).ok());
  EXPECT_FALSE(BadNodeLabelKey(std::string(64, 'a')).ok());
}

ProcessInfo P(pid_t pid, pid_t ppid, uint64_t start, const std::string& cmd) {
  ProcessInfo p;
  p.pid = pid;
  p.ppid = ppid;
  p.start_ticks = start;
  p.cmdline = cmd;
  return p;
}

TEST(FindWorkerProcessTest, TheTrainerNotItsLoaderChildrenNorTheAgent) {
  const std::vector<ProcessInfo> procs = {
      P(1, 0, 1, "/pause"),
      P(7, 0, 50, "/opt/pacer/bin/pacer-agent --attach /opt/train/train.py"),  // the agent itself
      P(12, 0, 90, "python3 /opt/train/train.py --epochs 3"),
      P(30, 12, 120, "python3 /opt/train/train.py --epochs 3"),  // a DataLoader worker
      P(31, 12, 121, "python3 /opt/train/train.py --epochs 3"),
  };
  auto w = FindWorkerProcess(procs, "/opt/train/train.py", 7);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->pid, 12);
  EXPECT_FALSE(FindWorkerProcess(procs, "other.py", 7).has_value());
  EXPECT_FALSE(FindWorkerProcess(procs, "", 7).has_value());
}

TEST(FindWorkerProcessTest, OfTwoUnrelatedMatchesTheOldest) {
  const std::vector<ProcessInfo> procs = {P(40, 1, 300, "python3 train.py"), P(22, 1, 200, "python3 train.py")};
  EXPECT_EQ(FindWorkerProcess(procs, "train.py", 1)->pid, 22);
}

TEST(ListProcessesTest, ReadsAFakeProcTree) {
  TempDir dir;
  auto add = [&](const std::string& pid, const std::string& cmdline, const std::string& stat) {
    std::filesystem::create_directories(dir.Sub(pid));
    std::ofstream(dir.Sub(pid + "/cmdline"), std::ios::binary) << cmdline;
    std::ofstream(dir.Sub(pid + "/stat")) << stat;
  };
  // 22 fields after the comm; starttime is field 22, ppid field 4.
  const std::string rest = " 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 4242 23 24\n";
  add("100", std::string("python3\0train.py\0--x\0", 22), "100 (py thon) S 1" + rest);
  add("101", std::string("a\0", 2), "101 (we)ird) ) R 100" + rest);
  add("2", "", "2 (kthreadd) S 0" + rest);            // a kernel thread: no command line
  std::filesystem::create_directories(dir.Sub("103"));  // vanished: no files
  std::filesystem::create_directories(dir.Sub("self"));
  auto procs = ListProcesses(dir.path());
  std::sort(procs.begin(), procs.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  ASSERT_EQ(procs.size(), 2u);
  EXPECT_EQ(procs[0].pid, 100);
  EXPECT_EQ(procs[0].ppid, 1);
  EXPECT_EQ(procs[0].start_ticks, 4242u);
  EXPECT_EQ(procs[0].cmdline, "python3 train.py --x");
  EXPECT_EQ(procs[1].pid, 101);
  EXPECT_EQ(procs[1].ppid, 100);
  EXPECT_EQ(procs[1].cmdline, "a");
}

TEST(ListProcessesTest, SeesThisProcessInTheRealProc) {
  const auto procs = ListProcesses("/proc");
  bool found = false;
  for (const auto& p : procs) found |= p.pid == getpid() && p.ppid == getppid() && p.start_ticks > 0;
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace pacer
