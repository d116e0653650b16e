// pacer-ps hardened: the real binary needs the job token (--token-file or
// PACER_TOKEN) and refuses to start without one unless --insecure-no-auth on loopback;
// unauthenticated calls to every method are refused; bad limit flags exit 2 naming the flag.
// Then, inside a 1 GiB memory cgroup (cgroup v1, where writable; skipped with a
// message otherwise) pacer-ps survives the oversized Pull (dim 2^20, 300 keys) and floods of
// pushes and pulls, answering RESOURCE_EXHAUSTED, and stays under the limit.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/auth.h"
#include "proto/pacer/ps.grpc.pb.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::BinaryPath;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

const std::string kToken = "0123456789abcdef0123456789abcdef";

int PortFrom(const std::string& port_file) {
  const std::string s = ReadFileOrEmpty(port_file);
  const size_t colon = s.find(':');
  return colon == std::string::npos ? 0 : std::atoi(s.c_str() + colon + 1);
}

int RunToExit(const std::vector<std::string>& argv, const std::string& log,
              const std::map<std::string, std::string>& env = {}) {
  Subprocess p = Subprocess::Start(argv, env, log);
  const int status = p.Wait(std::chrono::seconds(60));
  return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A pacer-ps child serving on 127.0.0.1 (port 0); `prefix` runs before it (a cgroup join).
struct PsProcess {
  PsProcess(const TempDir& dir, std::vector<std::string> flags, std::map<std::string, std::string> env,
            const std::string& shell_prefix = "") {
    port_file = dir.Sub("ps.port");
    log = dir.Sub("ps.log");
    std::vector<std::string> argv = {BinaryPath("pacer-ps"), "--listen", "127.0.0.1:0", "--port-file", port_file};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (!shell_prefix.empty()) {
      std::string cmd = shell_prefix + " && exec";
      for (const auto& a : argv) cmd += " '" + a + "'";
      argv = {"/bin/sh", "-c", cmd};
    }
    proc = Subprocess::Start(argv, env, log);
    EXPECT_TRUE(WaitFor([&] { return PortFrom(port_file) > 0 || !proc.running(); }, std::chrono::seconds(60)));
    EXPECT_GT(PortFrom(port_file), 0) << ReadFileOrEmpty(log);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);  // rows of 2^20 floats come back 12 MiB at a time
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(PortFrom(port_file)),
                                             grpc::InsecureChannelCredentials(), args);
    stub = ParameterServer::NewStub(channel);
  }
  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int seconds = 20) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    return ctx;
  }
  std::string port_file, log;
  Subprocess proc;
  std::unique_ptr<ParameterServer::Stub> stub;
};

PsTableSpec Spec(const std::string& name, uint32_t dim) {
  PsTableSpec s;
  s.set_name(name);
  s.set_dim(dim);
  s.mutable_optimizer()->set_learning_rate(0.1f);
  return s;
}

TEST(PsSecurityTest, RefusesToStartWithoutATokenOrWithBadFlags) {
  TempDir dir;
  const std::string log = dir.Sub("out.log");
  struct Case {
    std::vector<std::string> flags;
    std::map<std::string, std::string> env;
    std::string named;
  };
  const auto credential = MintCredential(kToken, CredentialKind::kWorker, "w0");
  ASSERT_TRUE(credential.ok());
  const std::vector<Case> cases = {
      {{}, {}, "PACER_TOKEN"},
      {{"--insecure-no-auth", "--listen", "0.0.0.0:0"}, {}, "--insecure-no-auth"},
      {{}, {{"PACER_TOKEN", *credential}}, "--worker-credentials inherit"},
      {{"--max-values-per-request", "0"}, {{"PACER_TOKEN", kToken}}, "--max-values-per-request"},
      {{"--max-server-bytes", "-1"}, {{"PACER_TOKEN", kToken}}, "--max-server-bytes"},
      {{"--max-table-bytes", "100", "--max-server-bytes", "10"}, {{"PACER_TOKEN", kToken}}, "--max-table-bytes"},
      {{"--max-threads", "0"}, {{"PACER_TOKEN", kToken}}, "--max-threads"},
      {{"--tls-client-ca", "/nonexistent"}, {{"PACER_TOKEN", kToken}}, "--tls-client-ca"},
      {{"--listen", "0.0.0.0:0"}, {{"PACER_TOKEN", kToken}}, "--tls-cert"},
  };
  for (const Case& c : cases) {
    std::filesystem::remove(log);
    std::vector<std::string> argv = {BinaryPath("pacer-ps")};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    if (std::find(argv.begin(), argv.end(), "--listen") == argv.end()) {
      argv.insert(argv.end(), {"--listen", "127.0.0.1:0"});
    }
    EXPECT_EQ(RunToExit(argv, log, c.env), 2) << c.named << ":\n" << ReadFileOrEmpty(log);
    EXPECT_NE(ReadFileOrEmpty(log).find(c.named), std::string::npos) << ReadFileOrEmpty(log);
  }
}

TEST(PsSecurityTest, EveryMethodRefusesCallsWithoutTheJobToken) {
  TempDir dir;
  PsProcess ps(dir, {}, {{"PACER_TOKEN", kToken}});  // the token from the environment
  ASSERT_NE(ps.stub, nullptr);
  const std::string other_job = "ffffffffffffffffffffffffffffffff";
  const auto foreign = MintCredential(other_job, CredentialKind::kWorker, "w0");
  const auto own = MintCredential(kToken, CredentialKind::kWorker, "w0");
  ASSERT_TRUE(foreign.ok() && own.ok());
  for (const std::string& bad : {std::string(), std::string("wrong"), other_job, *foreign}) {
    CreateTableRequest create;
    *create.mutable_spec() = Spec("t", 4);
    CreateTableResponse cr;
    EXPECT_EQ(ps.stub->CreateTable(ps.Ctx(bad).get(), create, &cr).error_code(), grpc::UNAUTHENTICATED);
    PullRequest pull;
    pull.set_table("t");
    pull.add_keys(1);
    PullResponse pr;
    EXPECT_EQ(ps.stub->Pull(ps.Ctx(bad).get(), pull, &pr).error_code(), grpc::UNAUTHENTICATED);
    PushRequest push;
    push.set_table("t");
    push.add_keys(1);
    for (int i = 0; i < 4; ++i) push.add_gradients(1);
    PushResponse pu;
    EXPECT_EQ(ps.stub->Push(ps.Ctx(bad).get(), push, &pu).error_code(), grpc::UNAUTHENTICATED);
    PsStatsResponse st;
    EXPECT_EQ(ps.stub->Stats(ps.Ctx(bad).get(), PsStatsRequest(), &st).error_code(), grpc::UNAUTHENTICATED);
  }
  PsStatsResponse st;
  ASSERT_TRUE(ps.stub->Stats(ps.Ctx(kToken).get(), PsStatsRequest(), &st).ok());
  EXPECT_EQ(st.rows(), 0u) << "no refused call changed anything";
  CreateTableRequest create;
  *create.mutable_spec() = Spec("t", 4);
  CreateTableResponse cr;
  EXPECT_TRUE(ps.stub->CreateTable(ps.Ctx(*own).get(), create, &cr).ok()) << "a worker credential of this job";
}

// The memory cgroup this test may create, or "" (with the reason in *why).
std::string MakeMemoryCgroup(uint64_t limit, std::string* why) {
  const std::string root = "/sys/fs/cgroup/memory";
  if (access((root + "/cgroup.procs").c_str(), W_OK) != 0) {
    *why = root + " is not a writable cgroup v1 memory controller";
    return "";
  }
  const std::string dir = root + "/pacer-ps-test-" + std::to_string(getpid());
  std::error_code ec;
  std::filesystem::create_directory(dir, ec);
  if (ec) {
    *why = "cannot create " + dir + ": " + ec.message();
    return "";
  }
  std::ofstream(dir + "/memory.limit_in_bytes") << limit;
  if (std::stoull("0" + ReadFileOrEmpty(dir + "/memory.limit_in_bytes")) != limit) {
    *why = "cannot set memory.limit_in_bytes in " + dir;
    std::filesystem::remove(dir, ec);
    return "";
  }
  return dir;
}

TEST(PsMemoryTest, SurvivesTheOversizedPullAndPushFloodsInA1GiBCgroup) {
  constexpr uint64_t kLimit = 1ull << 30;
  std::string why;
  const std::string cg = MakeMemoryCgroup(kLimit, &why);
  if (cg.empty()) GTEST_SKIP() << "skipped: " << why;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      for (int i = 0; i < 100 && std::filesystem::exists(dir) && !std::filesystem::remove(dir, ec); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the killed child leaves the group
      }
    }
  } cleanup{cg};
  TempDir dir;
  {
    // Default limits: --max-server-bytes is a quarter of the cgroup's limit.
    PsProcess ps(dir, {}, {{"PACER_TOKEN", kToken}}, "echo $$ > " + cg + "/cgroup.procs");
    ASSERT_NE(ps.stub, nullptr);
    CreateTableRequest create;
    *create.mutable_spec() = Spec("huge", 1u << 20);
    CreateTableResponse cr;
    ASSERT_TRUE(ps.stub->CreateTable(ps.Ctx(kToken).get(), create, &cr).ok());

    // The oversized Pull: 300 keys x 2^20 floats (1.2 GB) from a 2.4 KB request.
    PullRequest pull;
    pull.set_table("huge");
    for (uint64_t k = 0; k < 300; ++k) pull.add_keys(k);
    PullResponse pr;
    grpc::Status s = ps.stub->Pull(ps.Ctx(kToken).get(), pull, &pr);
    EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
    std::cout << "oversized pull: " << s.error_message() << std::endl;

    // Floods: 4 threads push new rows (3 keys x 2^20 floats, 12 MiB a push) until refused, 2
    // threads pull 3 rows at a time meanwhile.
    std::atomic<uint64_t> next_key{1000}, ok_pushes{0}, refused{0}, other{0}, pulls{0};
    std::atomic<bool> stop{false};
    std::mutex first_mu;
    std::string first_other;  // guarded by first_mu
    auto note = [&](const grpc::Status& st) {
      std::lock_guard<std::mutex> l(first_mu);
      if (first_other.empty()) first_other = std::to_string(st.error_code()) + " " + st.error_message();
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        PushRequest push;
        push.set_table("huge");
        push.mutable_gradients()->Resize(3 << 20, 0.001f);
        while (!stop) {
          push.clear_keys();
          for (int i = 0; i < 3; ++i) push.add_keys(next_key++);
          PushResponse resp;
          grpc::Status st = ps.stub->Push(ps.Ctx(kToken, 60).get(), push, &resp);
          if (st.ok()) ++ok_pushes;
          else if (st.error_code() == grpc::RESOURCE_EXHAUSTED) ++refused;
          else {
            ++other;
            note(st);
          }
          if (refused >= 40) stop = true;
          if (other > 0) stop = true;
        }
      });
    }
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&] {
        PullRequest small;
        small.set_table("huge");
        for (uint64_t k = 1000; k < 1003; ++k) small.add_keys(k);
        while (!stop) {
          PullResponse resp;
          grpc::Status st = ps.stub->Pull(ps.Ctx(kToken, 60).get(), small, &resp);
          if (st.ok()) ++pulls;
          else {
            ++other;
            note(st);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(other.load(), 0u) << "calls failed other than RESOURCE_EXHAUSTED, first: " << first_other
                                << "; log:\n" << ReadFileOrEmpty(ps.log);
    EXPECT_GE(refused.load(), 40u);
    EXPECT_GT(ok_pushes.load(), 0u);
    EXPECT_GT(pulls.load(), 0u);
    PsStatsResponse st;
    ASSERT_TRUE(ps.stub->Stats(ps.Ctx(kToken).get(), PsStatsRequest(), &st).ok())
        << "pacer-ps did not survive; log:\n" << ReadFileOrEmpty(ps.log);
    EXPECT_TRUE(ps.proc.running());
    const uint64_t peak = std::stoull("0" + ReadFileOrEmpty(cg + "/memory.max_usage_in_bytes"));
    std::cout << "pushes ok " << ok_pushes << ", refused " << refused << ", pulls " << pulls << "; rows "
              << st.rows() << " (" << (st.bytes() >> 20) << " MiB); cgroup peak " << (peak >> 20)
              << " MiB of " << (kLimit >> 20) << " MiB" << std::endl;
    EXPECT_LT(peak, kLimit);
    EXPECT_LE(st.bytes(), kLimit / 4);
    const std::string oom = ReadFileOrEmpty(cg + "/memory.oom_control");
    EXPECT_EQ(oom.find("oom_kill 1"), std::string::npos) << oom;
  }
}

}  // namespace
}  // namespace pacer
