// pacer-agent as torchrun: the worker environment torchrun sets
// (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), and the group
// restart: a crash of one rank stops the others and starts the whole local group again with
// the restart count incremented and a fresh MASTER_PORT, up to --max-restarts. Real agent and
// worker processes (agent_test_worker) against an AgentRegistry on a loopback port from the OS;
// every wait is a condition with a deadline.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tests/agent/agent_test_server.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::AgentServer;
using testing::BinaryPath;
using testing::kToken;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;
using namespace std::chrono_literals;

using Env = std::map<std::string, std::string>;

class AgentGroupRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Sub("token")) << kToken << "\n";
    ::chmod(dir_.Sub("token").c_str(), 0600);  // token files others can read are refused
    std::filesystem::create_directories(dir_.Sub("env"));
  }
  ~AgentGroupRestartTest() override {
    if (agent_.pid() > 0 && agent_.running()) {
      agent_.Signal(SIGTERM);
      if (agent_.Wait(20s) < 0) agent_.Kill();
    }
  }

  // pacer-agent with `workers` agent_test_workers that dump their environment into env/.
  void StartAgent(const std::string& address, int workers, std::vector<std::string> worker_args,
                  std::vector<std::string> extra_flags = {}) {
    std::vector<std::string> argv = {BinaryPath("pacer-agent"), "--addr", address, "--token-file",
                                     dir_.Sub("token"), "--node", "node-a", "--job", "testjob",
                                     "--workers", std::to_string(workers), "--heartbeat-ms", "200",
                                     "--metrics-ms", "250", "--stop-grace-ms", "3000",
                                     "--backoff-initial-ms", "100", "--no-nvml"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    argv.push_back("--");
    argv.push_back(BinaryPath("agent_test_worker"));
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    argv.push_back("--env-dir");
    argv.push_back(dir_.Sub("env"));
    agent_ = Subprocess::Start(argv, {}, dir_.Sub("agent.log"));
  }
  std::string Log() const { return ReadFileOrEmpty(dir_.Sub("agent.log")); }

  // The environment worker `id` saw at the start with restart count `restart`; empty when it
  // has not written it (yet).
  Env EnvOf(const std::string& id, int restart) const {
    Env env;
    std::istringstream in(ReadFileOrEmpty(dir_.Sub("env/" + id + "." + std::to_string(restart) + ".env")));
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return env;
  }
  bool AllWrote(const std::vector<std::string>& ids, int restart) const {
    for (const auto& id : ids) {
      if (EnvOf(id, restart).empty()) return false;
    }
    return true;
  }
  static WorkerProcess W(AgentRegistry& r, const std::string& id) {
    auto w = r.Worker(id);
    return w.ok() ? *w : WorkerProcess();
  }
  int AgentExitCode() {
    if (!WaitFor([&] { return !agent_.running(); }, 60s)) return -1;
    return WIFEXITED(agent_.exit_status()) ? WEXITSTATUS(agent_.exit_status()) : -1;
  }

  TempDir dir_;
  Subprocess agent_;
};

// (a) What a worker sees: torchrun's variables, consistent across the local workers.
TEST_F(AgentGroupRestartTest, WorkersGetTorchrunsEnvironment) {
  AgentServer server;
  const std::vector<std::string> ids = {"w0", "w1", "w2"};
  StartAgent(server.address(), 3, {"sleep"});
  ASSERT_TRUE(WaitFor([&] { return AllWrote(ids, 0); }, 30s)) << Log();
  std::set<std::string> ranks;
  const std::string port = EnvOf("w0", 0)["MASTER_PORT"];
  EXPECT_GT(std::stoi(port), 0);
  EXPECT_LT(std::stoi(port), 65536);
  for (int i = 0; i < 3; ++i) {
    Env e = EnvOf(ids[i], 0);
    const std::string r = std::to_string(i);
    EXPECT_EQ(e["RANK"], r);
    EXPECT_EQ(e["LOCAL_RANK"], r);
    EXPECT_EQ(e["ROLE_RANK"], r);
    EXPECT_EQ(e["PACER_RANK"], r);
    EXPECT_EQ(e["PACER_WORKER_ID"], ids[i]);
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], "3");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["MASTER_PORT"], port) << "one master port for the whole group";
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "3");  // the default
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "testjob");  // --run-id defaults to the job
    EXPECT_EQ(e["PACER_RUN_ID"], "testjob");
    EXPECT_EQ(e["PACER_JOB"], "testjob");
    ranks.insert(e["RANK"]);
  }
  EXPECT_EQ(ranks.size(), 3u);
  agent_.Signal(SIGTERM);
  EXPECT_EQ(AgentExitCode(), 0) << Log();
}

// The second node of a two-node job: ranks from --node-rank, the given master address and port.
TEST_F(AgentGroupRestartTest, SecondNodeOfTwoGetsItsRanksAndTheGivenMaster) {
  AgentServer server;
  StartAgent(server.address(), 2, {"sleep"},
             {"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port",
              "29999", "--run-id", "run-7", "--max-restarts", "5"});
  ASSERT_TRUE(WaitFor([&] { return AllWrote({"w2", "w3"}, 0); }, 30s)) << Log();
  for (int i = 0; i < 2; ++i) {
    Env e = EnvOf("w" + std::to_string(2 + i), 0);
    EXPECT_EQ(e["RANK"], std::to_string(2 + i));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(e["WORLD_SIZE"], "4");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(e["GROUP_RANK"], "1");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(e["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(e["MASTER_PORT"], "29999");
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "run-7");
    EXPECT_EQ(e["PACER_RUN_ID"], "run-7");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "5");
  }
}

// (b) kill -9 of one of three ranks: all three are started again together, with
// TORCHELASTIC_RESTART_COUNT=1 and a new MASTER_PORT; the job then finishes (exit 0 each).
TEST_F(AgentGroupRestartTest, KillOfOneRankRestartsTheWholeGroupWithANewMasterPort) {
  AgentServer server;
  AgentRegistry& r = server.registry();
  const std::vector<std::string> ids = {"w0", "w1", "w2"};
  StartAgent(server.address(), 3, {"sleep", "--exit-at-restart", "1"});
  ASSERT_TRUE(WaitFor([&] {
    if (!AllWrote(ids, 0)) return false;
    for (const auto& id : ids) {
      if (W(r, id).state() != WORKER_STATE_RUNNING || W(r, id).pid() <= 0) return false;
    }
    return true;
  }, 30s)) << Log();
  std::map<std::string, pid_t> pids;
  for (const auto& id : ids) pids[id] = W(r, id).pid();
  ASSERT_EQ(kill(pids["w1"], SIGKILL), 0);

  ASSERT_EQ(AgentExitCode(), 0) << Log();
  ASSERT_TRUE(AllWrote(ids, 1)) << Log();
  const std::string old_port = EnvOf("w0", 0)["MASTER_PORT"];
  const std::string new_port = EnvOf("w0", 1)["MASTER_PORT"];
  EXPECT_NE(new_port, old_port) << "a fresh master port for the new group";
  for (const auto& id : ids) {
    Env e = EnvOf(id, 1);
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "1") << id;
    EXPECT_EQ(e["MASTER_PORT"], new_port) << id;
    EXPECT_EQ(e["RANK"], EnvOf(id, 0)["RANK"]) << id << " keeps its rank";
    EXPECT_TRUE(EnvOf(id, 2).empty()) << id << " started a third time";
    EXPECT_NE(kill(pids[id], 0), 0) << id << "'s first process still runs";
  }
  // The exits pacerd was told about, in order: the kill, the two survivors stopped by the
  // agent, then the three exits of the restarted group.
  ASSERT_TRUE(WaitFor([&] { return r.Exits().size() >= 6; }, 20s)) << Log();
  std::vector<WorkerExit> exits = r.Exits();
  ASSERT_EQ(exits.size(), 6u) << Log();
  EXPECT_EQ(exits[0].worker_id(), "w1");
  EXPECT_EQ(exits[0].signal(), SIGKILL);
  EXPECT_EQ(exits[0].cause(), "crash");
  std::set<std::string> stopped, finished;
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(exits[i].cause(), "group-restart") << exits[i].ShortDebugString();
    EXPECT_EQ(exits[i].signal(), SIGTERM) << exits[i].ShortDebugString();
    stopped.insert(exits[i].worker_id());
  }
  for (size_t i = 3; i < 6; ++i) {
    EXPECT_EQ(exits[i].cause(), "finished") << exits[i].ShortDebugString();
    EXPECT_EQ(exits[i].exit_code(), 0);
    finished.insert(exits[i].worker_id());
  }
  EXPECT_EQ(stopped, (std::set<std::string>{"w0", "w2"}));
  EXPECT_EQ(finished, (std::set<std::string>{"w0", "w1", "w2"}));
  EXPECT_NE(Log().find("restarting the group of 3 worker(s), restart 1/3"), std::string::npos) << Log();
}

// (c) Past --max-restarts the agent gives up: exit 3, a message naming the worker and the limit,
// no worker left running.
TEST_F(AgentGroupRestartTest, ARankThatKeepsCrashingEndsTheAgentPastMaxRestarts) {
  AgentServer server;
  AgentRegistry& r = server.registry();
  StartAgent(server.address(), 3, {"crash", "--after-ms", "0", "--code", "5", "--only", "w1"},
             {"--max-restarts", "2"});
  ASSERT_EQ(AgentExitCode(), 3) << Log();
  const std::string log = Log();
  EXPECT_NE(log.find("pacer-agent: giving up: worker w1 crashed (code 5) after 2 restart(s) of the "
                     "group: restart limit (--max-restarts 2) reached"),
            std::string::npos)
      << log;
  // Three starts of the group (restart counts 0, 1, 2), none a fourth time. (w1 writes its
  // file before it crashes; w0 and w2 may be stopped before they get to theirs.)
  for (int restart = 0; restart <= 2; ++restart) {
    EXPECT_FALSE(EnvOf("w1", restart).empty()) << "restart " << restart;
  }
  for (const std::string id : {"w0", "w1", "w2"}) EXPECT_TRUE(EnvOf(id, 3).empty()) << id;
  ASSERT_TRUE(WaitFor([&] {
    return W(r, "w1").state() == WORKER_STATE_FAILED && W(r, "w0").state() == WORKER_STATE_STOPPED &&
           W(r, "w2").state() == WORKER_STATE_STOPPED;
  }, 20s)) << Log();
  int crashes = 0;
  for (const WorkerExit& e : r.Exits()) crashes += e.cause() == "crash";
  EXPECT_EQ(crashes, 3);
}

// A controller RESTART of one worker under the group scope restarts the whole group (one rank
// cannot rejoin a running synchronous group); it does not use up --max-restarts.
TEST_F(AgentGroupRestartTest, RestartCommandForOneWorkerRestartsTheGroup) {
  AgentServer server;
  AgentRegistry& r = server.registry();
  const std::vector<std::string> ids = {"w0", "w1", "w2"};
  StartAgent(server.address(), 3, {"sleep"}, {"--max-restarts", "0"});
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& id : ids) {
      if (W(r, id).state() != WORKER_STATE_RUNNING || W(r, id).pid() <= 0) return false;
    }
    return AllWrote(ids, 0);
  }, 30s)) << Log();
  std::map<std::string, pid_t> pids;
  for (const auto& id : ids) pids[id] = W(r, id).pid();
  auto cmd = r.RestartWorker("w1");
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  ASSERT_TRUE(WaitFor([&] {
    auto c = r.Command(*cmd);
    return c.ok() && c->state != CommandState::kPending;
  }, 30s)) << Log();
  EXPECT_EQ(r.Command(*cmd)->state, CommandState::kDone) << r.Command(*cmd)->reason;
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& id : ids) {
      WorkerProcess w = W(r, id);
      if (w.state() != WORKER_STATE_RUNNING || w.pid() <= 0 || w.pid() == pids[id] || w.restarts() != 1) {
        return false;
      }
    }
    return AllWrote(ids, 1);
  }, 30s)) << Log();
  for (const auto& id : ids) {
    EXPECT_EQ(W(r, id).crash_restarts(), 0u) << id;
    EXPECT_EQ(EnvOf(id, 1)["TORCHELASTIC_RESTART_COUNT"], "1");
    EXPECT_EQ(EnvOf(id, 1)["MASTER_PORT"], EnvOf("w0", 1)["MASTER_PORT"]);
  }
  EXPECT_NE(EnvOf("w0", 1)["MASTER_PORT"], EnvOf("w0", 0)["MASTER_PORT"]);
  EXPECT_TRUE(agent_.running()) << "a command restart does not count against --max-restarts 0";
}

// Nonsense numbers are refused before anything starts: exit 2 and the flag named.
TEST_F(AgentGroupRestartTest, BadTopologyFlagsAreRefused) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--workers", "-1"}, "--workers must be at least 1, not -1"},
      {{"--workers", "0"}, "--workers must be at least 1, not 0"},
      {{"--nnodes", "2", "--node-rank", "2"}, "--node-rank 2 must be below --nnodes 2"},
      {{"--master-port", "70000"}, "--master-port must be in 0..65535"},
      {{"--max-restarts", "-3"}, "--max-restarts must be at least 0, not -3"},
      {{"--restart-scope", "node"}, "--restart-scope must be group or worker, not 'node'"},
      {{"--first-rank", "3", "--world-size", "2"}, "do not fit world size 2"},
  };
  int n = 0;
  for (const auto& [flags, want] : cases) {
    const std::string log = dir_.Sub("bad" + std::to_string(n++) + ".log");
    std::vector<std::string> argv = {BinaryPath("pacer-agent"), "--node", "n", "--addr", ""};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--", BinaryPath("agent_test_worker"), "sleep"});
    Subprocess p = Subprocess::Start(argv, {}, log);
    const int status = p.Wait(30s);
    ASSERT_GE(status, 0) << "pacer-agent did not exit for " << want;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << want << ": " << ReadFileOrEmpty(log);
    EXPECT_NE(ReadFileOrEmpty(log).find(want), std::string::npos) << ReadFileOrEmpty(log);
  }
}

}  // namespace
}  // namespace pacer
