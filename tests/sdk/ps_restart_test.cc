// Durable parameter-server rows and their restart: real pacer-ps
// processes with --state-dir on loopback (port 0), a PsClient pushing real updates, SIGTERM /
// SIGKILL and a restart on the same directory; a corrupt snapshot refused with a clear error;
// and pacerd's agent dispatcher carrying out RESTART_SERVER on a pacer-ps that a real
// pacer-agent supervises. Every wait is a condition with a deadline.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "agent/agent_registry.h"
#include "controller/action.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/ps/parameter_store.h"
#include "worker_sdk/ps/ps_client.h"
#include "worker_sdk/ps/ps_snapshot.h"

namespace pacer {

namespace {

using testing::BinaryPath;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;
using namespace std::chrono_literals;

PsTableSpec Spec(const std::string& name, uint32_t dim, PsOptimizer::Kind kind, float lr, float scale) {
  PsTableSpec s;
  s.set_name(name);
  s.set_dim(dim);
  s.mutable_optimizer()->set_kind(kind);
  s.mutable_optimizer()->set_learning_rate(lr);
  s.mutable_optimizer()->set_initial_accumulator(0.1f);
  s.set_init_scale(scale);
  s.set_seed(11);
  return s;
}

// The port a pacer-ps wrote to its --port-file; 0 while there is none.
int PortIn(const std::string& port_file) {
  std::smatch m;
  const std::string text = ReadFileOrEmpty(port_file);
  static const std::regex re("\"port\":([0-9]+)");
  return std::regex_search(text, m, re) ? std::stoi(m[1]) : 0;
}

// The job token of the servers this fixture starts itself (pacer-ps requires one).
const char kPsToken[] = "0123456789abcdef0123456789abcdef";

std::unique_ptr<PsClient> ClientFor(int port, const std::string& token = kPsToken) {
  PsClientOptions o;
  o.servers = {"127.0.0.1:" + std::to_string(port)};
  o.token = token;
  o.reporter = "w0";
  o.rpc_timeout_ms = 10'000;
  auto c = PsClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// The job's model: a sparse Adagrad embedding and a dense SGD tensor. A reference store takes
// the same pushes in this process, so the server's rows (and Adagrad accumulators: the next
// push) can be compared bit for bit.
struct Model {
  static constexpr size_t kDense = 37;  // not a multiple of the row width
  std::vector<uint64_t> keys;
  ParameterStore reference;

  Model() {
    for (uint64_t k = 0; k < 300; ++k) keys.push_back(k * 104729 + 3);
    EXPECT_TRUE(reference.CreateTable(Spec("emb", 4, PsOptimizer::ADAGRAD, 0.3f, 0.05f)).ok());
    EXPECT_TRUE(reference.CreateTable(Spec("dense", 8, PsOptimizer::SGD, 0.1f, 0.0f)).ok());
  }
  absl::Status Create(PsClient& c) {
    if (absl::Status s = c.CreateTable(Spec("emb", 4, PsOptimizer::ADAGRAD, 0.3f, 0.05f)); !s.ok()) return s;
    return c.CreateTable(Spec("dense", 8, PsOptimizer::SGD, 0.1f, 0.0f));
  }
  // One training step `step`: a push to a subset of the embedding rows and to the dense tensor.
  absl::Status Step(PsClient& c, int step) {
    std::vector<uint64_t> ks;
    std::vector<float> g;
    for (size_t i = step % 3; i < keys.size(); i += 3) {
      ks.push_back(keys[i]);
      for (int j = 0; j < 4; ++j) g.push_back(0.01f * static_cast<float>((i + j + step) % 17) - 0.08f);
    }
    if (absl::Status s = c.Push("emb", ks, g); !s.ok()) return s;
    EXPECT_TRUE(reference.Push("emb", ks, g).ok());
    std::vector<float> d(kDense);
    for (size_t i = 0; i < kDense; ++i) d[i] = 0.5f - 0.03f * static_cast<float>((i * 7 + step) % 31);
    if (absl::Status s = c.PushDenseAsync("dense", d).get(); !s.ok()) return s;
    std::vector<float> rows(((kDense + 7) / 8) * 8, 0.0f);
    std::copy(d.begin(), d.end(), rows.begin());
    std::vector<uint64_t> dk;
    for (uint64_t r = 0; r < rows.size() / 8; ++r) dk.push_back(r);
    EXPECT_TRUE(reference.Push("dense", dk, rows).ok());
    return absl::OkStatus();
  }
  // Pulls everything from the server and from the reference.
  void PullBoth(PsClient& c, std::vector<float>* got, std::vector<float>* want) {
    got->clear();
    want->clear();
    absl::Status s = c.Pull("emb", keys, got);
    ASSERT_TRUE(s.ok()) << s;
    std::vector<float> d;
    ASSERT_TRUE(c.PullDense("dense", kDense, &d).ok());
    got->insert(got->end(), d.begin(), d.end());
    ASSERT_TRUE(reference.Pull("emb", keys, want).ok());
    std::vector<float> rd;
    ASSERT_TRUE(reference.Pull("dense", {0, 1, 2, 3, 4}, &rd).ok());
    want->insert(want->end(), rd.begin(), rd.begin() + kDense);
  }
};

class PsRestartTest : public ::testing::Test {
 protected:
  // Starts pacer-ps ps0 on `state_dir`; waits until it serves unless `expect_serving` is false.
  void StartServer(const std::string& state_dir, int snapshot_ms, bool expect_serving = true) {
    std::filesystem::remove(dir_.Sub("ps0.port"));
    server_ = Subprocess::Start({BinaryPath("pacer-ps"), "--server-id", "ps0", "--port-file", dir_.Sub("ps0.port"),
                                 "--state-dir", state_dir, "--snapshot-ms", std::to_string(snapshot_ms)},
                                {{"PACER_TOKEN", kPsToken}}, dir_.Sub("ps.log"));
    if (!expect_serving) return;
    ASSERT_TRUE(WaitFor([&] { return PortIn(dir_.Sub("ps0.port")) != 0; }, 15s)) << ReadFileOrEmpty(dir_.Sub("ps.log"));
    port_ = PortIn(dir_.Sub("ps0.port"));
  }
  void StopGracefully() {
    server_.Signal(SIGTERM);
    const int st = server_.Wait(15s);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st << "\n" << ReadFileOrEmpty(dir_.Sub("ps.log"));
  }

  TempDir dir_;
  Subprocess server_;
  int port_ = 0;
};

TEST_F(PsRestartTest, RowsAndOptimizerStateSurviveAGracefulRestart) {
  const std::string state = dir_.Sub("state/ps0");
  Model m;
  // A long period: only the SIGTERM save can hold these pushes.
  StartServer(state, 600'000);
  {
    auto c = ClientFor(port_);
    ASSERT_TRUE(m.Create(*c).ok());
    for (int step = 0; step < 6; ++step) ASSERT_TRUE(m.Step(*c, step).ok());
    std::vector<float> got, want;
    m.PullBoth(*c, &got, &want);
    ASSERT_EQ(got, want);
  }
  StopGracefully();
  ASSERT_TRUE(std::filesystem::exists(state + "/ps.snapshot"));
  EXPECT_FALSE(std::filesystem::exists(state + "/ps.snapshot.tmp"));

  StartServer(state, 600'000);
  auto c = ClientFor(port_);
  // A new client learns the row widths by CreateTable: the tables came back with their specs,
  // so the identical spec is accepted (a different one would be ALREADY_EXISTS).
  ASSERT_TRUE(m.Create(*c).ok());
  std::vector<float> got, want;
  m.PullBoth(*c, &got, &want);
  EXPECT_EQ(got, want) << "rows changed across the restart";
  // The Adagrad accumulators came back too: one more step lands exactly where the
  // uninterrupted reference does.
  ASSERT_TRUE(m.Step(*c, 6).ok());
  m.PullBoth(*c, &got, &want);
  EXPECT_EQ(got, want) << "optimizer state was not restored";
  StopGracefully();
}

TEST_F(PsRestartTest, PeriodicSnapshotSurvivesAKill) {
  const std::string state = dir_.Sub("ps0");
  const std::string file = state + "/ps.snapshot";
  Model m;
  StartServer(state, 100);
  auto c = ClientFor(port_);
  ASSERT_TRUE(m.Create(*c).ok());
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(m.Step(*c, step).ok());
  std::vector<float> want_got, want;
  m.PullBoth(*c, &want_got, &want);
  // Wait until a periodic snapshot holds all three steps (the file's state equals the reference).
  ASSERT_TRUE(WaitFor([&] {
    auto snap = ReadPsSnapshot(file);
    if (!snap.ok() || !snap->has_value()) return false;
    ParameterStore s;
    std::vector<float> v;
    return s.Restore(**snap).ok() && s.Pull("emb", m.keys, &v).ok() &&
           std::equal(v.begin(), v.end(), want.begin());
  }, 15s));
  server_.Kill();  // no last save
  StartServer(state, 100);
  c = ClientFor(port_);
  ASSERT_TRUE(m.Create(*c).ok());
  std::vector<float> got;
  m.PullBoth(*c, &got, &want);
  EXPECT_EQ(got, want);
}

TEST_F(PsRestartTest, CorruptOrTornSnapshotIsRefusedNamingTheFile) {
  const std::string state = dir_.Sub("ps0");
  const std::string file = state + "/ps.snapshot";
  Model m;
  StartServer(state, 600'000);
  {
    auto c = ClientFor(port_);
    ASSERT_TRUE(m.Create(*c).ok());
    ASSERT_TRUE(m.Step(*c, 0).ok());
  }
  StopGracefully();
  const std::string good = ReadFileOrEmpty(file);
  ASSERT_GT(good.size(), 100u);

  struct Case {
    std::string name, bytes, message;
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  const std::vector<Case> cases = {
      {"flipped byte", flipped, "checksum mismatch"},
      {"torn write", good.substr(0, good.size() - 10), "torn write"},
      {"not a snapshot", "hello", "shorter than its header"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << k.bytes;
    std::filesystem::remove(dir_.Sub("ps.log"));
    StartServer(state, 600'000, /*expect_serving=*/false);
    const int st = server_.Wait(15s);
    ASSERT_TRUE(WIFEXITED(st)) << st;
    EXPECT_EQ(WEXITSTATUS(st), 1);
    const std::string log = ReadFileOrEmpty(dir_.Sub("ps.log"));
    EXPECT_NE(log.find(file), std::string::npos) << log;
    EXPECT_NE(log.find(k.message), std::string::npos) << log;
    EXPECT_NE(log.find("DATA_LOSS"), std::string::npos) << log;
    EXPECT_EQ(PortIn(dir_.Sub("ps0.port")), 0) << "a corrupt snapshot must not be served";
    EXPECT_EQ(ReadFileOrEmpty(file), k.bytes) << "the evidence must stay untouched";
  }
  // Put back, it loads.
  std::ofstream(file, std::ios::binary | std::ios::trunc) << good;
  StartServer(state, 600'000);
  auto c = ClientFor(port_);
  ASSERT_TRUE(m.Create(*c).ok());
  std::vector<float> got, want;
  m.PullBoth(*c, &got, &want);
  EXPECT_EQ(got, want);
}

// RESTART_SERVER end to end: an in-process pacerd, a real pacer-agent supervising one pacer-ps
// as "ps0" (--worker-id-prefix ps), rows pushed by a client; pacerd's dispatcher restarts
// exactly that process (a new pid) and the rows survive (the agent's SIGTERM makes the server
// save its snapshot). RELIEVE_SERVER and an unsupervised server are refused with clear notes.
TEST(PsRestartServerTest, DispatcherRestartsTheSupervisedServerAndItsRowsSurvive) {
  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness pacerd(
      {.real_clock = true, .adjust = [](PacerdOptions& o) { o.agents.heartbeat_interval_ms = 200; }});
  ASSERT_TRUE(pacerd.ok());
  const TempDir& dir = pacerd.dir();
  AgentRegistry& agents = *pacerd->agents();
  const std::string port_file = dir.Sub("ps/ps0.port");
  std::filesystem::create_directories(dir.Sub("ps"));
  Subprocess agent = Subprocess::Start(
      {BinaryPath("pacer-agent"), "--addr", pacerd->address(), "--token-file", dir.Sub("data/job.token"),
       "--node", "node-ps", "--job", "psjob", "--workers", "1", "--worker-id-prefix", "ps",
       "--worker-credentials", "inherit",  // pacer-ps needs the job token itself
       "--heartbeat-ms", "200", "--stop-grace-ms", "10000", "--no-nvml", "--",
       BinaryPath("pacer-ps"), "--server-id", "{worker_id}", "--state-dir", dir.Sub("ps/{worker_id}"),
       "--port-file", dir.Sub("ps/{worker_id}.port"), "--snapshot-ms", "600000"},
      {}, dir.Sub("agent.log"));
  auto running_pid = [&]() -> int64_t {
    auto w = agents.Worker("ps0");
    return w.ok() && w->state() == WORKER_STATE_RUNNING ? w->pid() : 0;
  };
  ASSERT_TRUE(WaitFor([&] { return running_pid() > 0 && PortIn(port_file) != 0; }, 15s))
      << ReadFileOrEmpty(dir.Sub("agent.log"));
  const int64_t old_pid = running_pid();

  Model m;
  {
    auto c = ClientFor(PortIn(port_file), pacerd->job_token());
    ASSERT_TRUE(m.Create(*c).ok());
    for (int step = 0; step < 4; ++step) ASSERT_TRUE(m.Step(*c, step).ok());
  }

  // The old server wrote its port long ago; a port file from now on is the new server's.
  std::filesystem::remove(port_file);
  Action restart;
  restart.kind = ActionKind::kRestartServer;
  restart.target = "ps0";
  auto note = DispatchAgentAction(agents, restart);
  ASSERT_TRUE(note.ok()) << note.status();
  EXPECT_NE(note->find("server restart sent"), std::string::npos) << *note;
  ASSERT_TRUE(WaitFor([&] {
    const int64_t pid = running_pid();
    return pid > 0 && pid != old_pid && PortIn(port_file) != 0;
  }, 20s)) << ReadFileOrEmpty(dir.Sub("agent.log"));
  // The agent reaped the old server: its pid is gone (or, rarely, reused by another program).
  EXPECT_EQ(ReadFileOrEmpty("/proc/" + std::to_string(old_pid) + "/cmdline").find("pacer-ps"), std::string::npos)
      << "the old server still runs";

  auto c = ClientFor(PortIn(port_file), pacerd->job_token());
  ASSERT_TRUE(m.Create(*c).ok());
  std::vector<float> got, want;
  m.PullBoth(*c, &got, &want);
  EXPECT_EQ(got, want) << "rows lost in the restart";

  // Refusals: no agent supervises ps7; relieving has no re-sharding to stand on.
  restart.target = "ps7";
  auto missing = DispatchAgentAction(agents, restart);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no agent supervises server ps7"), std::string::npos);
  Action relieve;
  relieve.kind = ActionKind::kRelieveServer;
  relieve.target = "ps0";
  auto relieved = DispatchAgentAction(agents, relieve);
  EXPECT_EQ(relieved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(relieved.status().message().find("no re-sharding"), std::string::npos);

  agent.Signal(SIGTERM);
  EXPECT_GE(agent.Wait(20s), 0) << "pacer-agent did not stop";
  pacerd->Shutdown();
}

}  // namespace
}  // namespace pacer
