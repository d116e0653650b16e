// pacer-agent's Kubernetes form against FakeKubeApi (a real HTTPS server on a loopback port
// with its own CA) and a real AgentService (tests/agent/agent_test_server.h):
//  - migrate with --k8s-mark-node labels exactly the own node, then deletes exactly the own
//    pod (uid precondition), in that order; the label is the one the shipped example's pod
//    template avoids, so a scheduler evaluating that template skips the node;
//  - a 403 gives a clear, RBAC-naming error, deletes nothing, and repeated migrate commands do
//    not become a storm of API requests (requests counted);
//  - the sidecar form (--attach): the trainer is a process the test started, not the agent;
//    the agent finds it by its command line, reports it and its CPU, restarts it by signal
//    (the test plays the kubelet and starts it again), reports exits, refuses stop, and leaves
//    it alone when the agent itself is stopped; a migrate from the sidecar marks the node and
//    deletes the pod without signalling the trainer (the pod's deletion ends it).
#include <signal.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/agent/agent_test_server.h"
#include "tests/agent/fake_kube_api.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using namespace std::chrono_literals;
using testing::AgentServer;
using testing::BinaryPath;
using testing::FakeKubeApi;
using testing::FakeKubeReply;
using testing::KubeStatusBody;
using testing::kToken;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

WorkerProcess W(AgentRegistry& r, const std::string& id) {
  auto w = r.Worker(id);
  return w.ok() ? *w : WorkerProcess();
}
bool CommandEnded(AgentRegistry& r, const std::string& id) {
  auto c = r.Command(id);
  return c.ok() && c->state != CommandState::kPending;
}

class K8sAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Sub("token")) << kToken << "\n";
    ::chmod(dir_.Sub("token").c_str(), 0600);
    std::ofstream(dir_.Sub("sa-token")) << "sa-token-123\n";
  }
  void TearDown() override {
    if (agent_.running()) agent_.Kill();
  }
  // pacer-agent in Kubernetes mode; `tail` ends the command line (-- worker, or --attach).
  void StartAgent(AgentServer& server, FakeKubeApi& api, const std::string& job,
                  std::vector<std::string> extra, std::vector<std::string> tail) {
    std::vector<std::string> argv = {
        BinaryPath("pacer-agent"), "--addr", server.address(), "--token-file", dir_.Sub("token"),
        "--node", "node-a", "--job", job, "--heartbeat-ms", "200", "--metrics-ms", "250",
        "--heartbeat-backoff-max-ms", "500", "--stop-grace-ms", "2000", "--no-nvml",
        "--kubernetes", "--k8s-token-file", dir_.Sub("sa-token"), "--k8s-ca-file", api.ca_file(),
        "--k8s-namespace", "pacer-jobs", "--k8s-max-attempts", "3", "--k8s-backoff-initial-ms", "100",
        "--k8s-request-timeout-ms", "5000"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), tail.begin(), tail.end());
    agent_ = Subprocess::Start(argv,
                               {{"KUBERNETES_SERVICE_HOST", "127.0.0.1"},
                                {"KUBERNETES_SERVICE_PORT", std::to_string(api.port())},
                                {"POD_NAME", "trainer-pod-a"},
                                {"POD_UID", "0b4c1a2e-7d6f-4e8a-9b1c-2d3e4f5a6b7c"},
                                {"NODE_NAME", "node-a"}},
                               dir_.Sub("agent.log"));
  }
  std::string Log() const { return ReadFileOrEmpty(dir_.Sub("agent.log")); }

  TempDir dir_;
  Subprocess agent_;
};

// ---- The scheduler's side of "the replacement avoids the node" ----
// nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution of a pod template: terms are
// ORed, expressions within a term ANDed (only the operators the examples use).
struct Requirement {
  std::string key, op;
  std::vector<std::string> values;
};
bool NodeFits(const std::vector<std::vector<Requirement>>& terms,
              const std::map<std::string, std::string>& labels) {
  for (const auto& term : terms) {
    bool all = true;
    for (const Requirement& r : term) {
      const bool has = labels.count(r.key) > 0;
      if (r.op == "DoesNotExist") all &= !has;
      else if (r.op == "Exists") all &= has;
      else if (r.op == "In") all &= has && std::count(r.values.begin(), r.values.end(), labels.at(r.key)) > 0;
      else if (r.op == "NotIn") all &= !has || std::count(r.values.begin(), r.values.end(), labels.at(r.key)) == 0;
      else ADD_FAILURE() << "operator " << r.op << " not modelled";
    }
    if (all) return true;
  }
  return terms.empty();
}

// The shipped sidecar example: its pod template's required node terms and the agent's --job.
struct ExampleJob {
  std::string job;
  std::vector<std::vector<Requirement>> terms;
};
ExampleJob LoadSidecarExample() {
  ExampleJob e;
  YAML::Node doc = YAML::LoadFile(std::string(PACER_SOURCE_DIR) + "/deploy/examples/job-sidecar.yaml");
  YAML::Node spec = doc["spec"]["template"]["spec"];
  for (const auto& c : spec["initContainers"]) {
    if (c["name"].as<std::string>() != "pacer-agent") continue;
    for (const auto& a : c["args"]) {
      const std::string s = a.as<std::string>();
      if (s.rfind("--job=", 0) == 0) e.job = s.substr(6);
    }
  }
  for (const auto& t : spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                           ["nodeSelectorTerms"]) {
    std::vector<Requirement> term;
    for (const auto& m : t["matchExpressions"]) {
      Requirement r{m["key"].as<std::string>(), m["operator"].as<std::string>(), {}};
      if (m["values"]) r.values = m["values"].as<std::vector<std::string>>();
      term.push_back(r);
    }
    e.terms.push_back(term);
  }
  return e;
}

TEST_F(K8sAgentTest, MigrateMarksTheOwnNodeThenDeletesExactlyTheOwnPodAndTheReplacementAvoidsTheNode) {
  const ExampleJob example = LoadSidecarExample();
  ASSERT_EQ(example.job, "mlp");
  ASSERT_FALSE(example.terms.empty()) << "the example's pod template has no required node affinity";

  AgentServer server;
  FakeKubeApi api(dir_.path());  // 200 to everything
  StartAgent(server, api, example.job, {"--k8s-mark-node"},
             {"--", BinaryPath("agent_test_worker"), "sleep"});
  AgentRegistry& r = server.registry();
  ASSERT_TRUE(WaitFor([&] { return W(r, "w0").state() == WORKER_STATE_RUNNING; }, 20s)) << Log();
  // Nodes as the cluster has them before the migrate: both fit the template.
  std::map<std::string, std::map<std::string, std::string>> nodes = {
      {"node-a", {{"kubernetes.io/hostname", "node-a"}}}, {"node-b", {{"kubernetes.io/hostname", "node-b"}}}};
  for (const auto& [n, labels] : nodes) EXPECT_TRUE(NodeFits(example.terms, labels)) << n;

  auto id = r.Migrate("node-a", "node is slow");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(WaitFor([&] { return !agent_.running(); }, 30s)) << Log();
  ASSERT_TRUE(WIFEXITED(agent_.exit_status())) << Log();
  EXPECT_EQ(WEXITSTATUS(agent_.exit_status()), 75) << Log();
  EXPECT_EQ(r.Command(*id)->state, CommandState::kDone) << r.Command(*id)->reason;

  const auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 2u) << Log();
  // 1. The label on the own node, and only that: a JSON merge patch of one label.
  EXPECT_EQ(reqs[0].method, "PATCH");
  EXPECT_EQ(reqs[0].target, "/api/v1/nodes/node-a");
  EXPECT_EQ(reqs[0].content_type, "application/merge-patch+json");
  EXPECT_EQ(reqs[0].authorization, "Bearer sa-token-123");
  const nlohmann::json patch = nlohmann::json::parse(reqs[0].body);
  ASSERT_EQ(patch.size(), 1u) << reqs[0].body;
  ASSERT_EQ(patch["metadata"].size(), 1u) << reqs[0].body;
  ASSERT_EQ(patch["metadata"]["labels"].size(), 1u) << reqs[0].body;
  const std::string key = "bad-node.pacer.dev/" + example.job;
  ASSERT_TRUE(patch["metadata"]["labels"].contains(key)) << reqs[0].body;
  // 2. Then the own pod, by name and uid (never a replacement that took the name).
  EXPECT_EQ(reqs[1].method, "DELETE");
  EXPECT_EQ(reqs[1].target, "/api/v1/namespaces/pacer-jobs/pods/trainer-pod-a");
  const nlohmann::json del = nlohmann::json::parse(reqs[1].body);
  EXPECT_EQ(del["preconditions"]["uid"], "0b4c1a2e-7d6f-4e8a-9b1c-2d3e4f5a6b7c");
  EXPECT_LE(reqs[0].time_ms, reqs[1].time_ms);

  // The replacement: apply the patch to node-a as the API server would, then schedule the
  // example's pod template: node-a is out, node-b still fits.
  for (const auto& [k, v] : patch["metadata"]["labels"].items()) nodes["node-a"][k] = v.get<std::string>();
  EXPECT_FALSE(NodeFits(example.terms, nodes["node-a"])) << "the replacement could land on the bad node";
  EXPECT_TRUE(NodeFits(example.terms, nodes["node-b"]));
}

TEST_F(K8sAgentTest, ForbiddenNodeLabelIsAClearErrorDeletesNothingAndIsNotRetriedIntoAStorm) {
  AgentServer server;
  FakeKubeApi api(dir_.path());
  api.SetDefault({403, KubeStatusBody(403, "Forbidden",
                                      "nodes node-a is forbidden: User system:serviceaccount:pacer-jobs:"
                                      "pacer-agent cannot patch resource nodes in API group at the cluster scope")});
  StartAgent(server, api, "mlp", {"--k8s-mark-node"}, {"--", BinaryPath("agent_test_worker"), "sleep"});
  AgentRegistry& r = server.registry();
  ASSERT_TRUE(WaitFor([&] { return W(r, "w0").state() == WORKER_STATE_RUNNING; }, 20s)) << Log();
  const pid_t pid = W(r, "w0").pid();

  auto first = r.Migrate("node-a", "node is slow");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(WaitFor([&] { return CommandEnded(r, *first); }, 30s)) << Log();
  const auto cmd = *r.Command(*first);
  EXPECT_EQ(cmd.state, CommandState::kRefused);
  EXPECT_EQ(cmd.reason.find("\"kind\""), std::string::npos) << "the raw body, not the API's message: " << cmd.reason;
  for (const char* part : {"node not marked (pod not deleted)", "403 Forbidden", "cannot patch resource",
                           "RBAC", "'patch' on 'nodes'", "deploy/node-marking"}) {
    EXPECT_NE(cmd.reason.find(part), std::string::npos) << part << " missing from: " << cmd.reason;
  }
  ASSERT_EQ(api.Requests().size(), 1u) << "a 403 was retried, or the pod was deleted anyway";

  // The controller tries again and again: each command is answered, none reaches the API.
  for (int i = 0; i < 3; ++i) {
    auto again = r.Migrate("node-a", "still slow");
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(WaitFor([&] { return CommandEnded(r, *again); }, 10s)) << Log();
    const auto c = *r.Command(*again);
    EXPECT_EQ(c.state, CommandState::kRefused);
    EXPECT_NE(c.reason.find("not asked again"), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find("403 Forbidden"), std::string::npos) << c.reason;
  }
  EXPECT_EQ(api.Requests().size(), 1u) << "requests to the API server: a retry storm";
  EXPECT_TRUE(agent_.running());
  EXPECT_EQ(W(r, "w0").pid(), pid);
  EXPECT_EQ(W(r, "w0").state(), WORKER_STATE_RUNNING);
  EXPECT_EQ(kill(pid, 0), 0);
}

// The sidecar form. The test starts the trainer (as the trainer container would be) and plays
// the kubelet that starts it again after it ends.
class AttachTest : public K8sAgentTest {
 protected:
  void StartTrainer() {
    trainer_ = Subprocess::Start({BinaryPath("agent_test_worker"), "spin", "--progress", Pattern()}, {},
                                 dir_.Sub("trainer.log"));
  }
  // Unique to this test's trainer: its progress file.
  std::string Pattern() const { return dir_.Sub("trainer-progress"); }
  void TearDown() override {
    K8sAgentTest::TearDown();
    if (trainer_.running()) trainer_.Kill();
  }
  Subprocess trainer_;
};

TEST_F(AttachTest, FindsATrainerItDidNotStartRestartsItBySignalAndReportsItsExits) {
  StartTrainer();
  const pid_t first = trainer_.pid();
  AgentServer server;
  FakeKubeApi api(dir_.path());
  StartAgent(server, api, "mlp", {"--first-rank", "1", "--world-size", "2", "--attach-poll-ms", "100"},
             {"--attach", Pattern()});
  AgentRegistry& r = server.registry();
  // Found by its command line: the test's child, not the agent's.
  ASSERT_TRUE(WaitFor([&] { return W(r, "w1").pid() == first; }, 20s)) << Log();
  EXPECT_EQ(W(r, "w1").state(), WORKER_STATE_RUNNING);
  EXPECT_EQ(W(r, "w1").rank(), 1u);
  // Its CPU is measured although the agent is not its parent (it spins: about one core).
  ASSERT_TRUE(WaitFor([&] { return W(r, "w1").cpu_cores() > 0.02; }, 20s))
      << W(r, "w1").ShortDebugString() << "\n" << Log();

  // Restart by signal: SIGTERM reaches the trainer; "the kubelet" starts a new one; the
  // command completes once the agent has found the new process.
  auto restart = r.RestartWorker("w1");
  ASSERT_TRUE(restart.ok()) << restart.status();
  const int st = trainer_.Wait(20s);
  ASSERT_NE(st, -1) << "the trainer did not get the agent's signal\n" << Log();
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(WTERMSIG(st), SIGTERM);
  EXPECT_FALSE(CommandEnded(r, *restart)) << "acknowledged before the trainer was back";
  StartTrainer();
  const pid_t second = trainer_.pid();
  ASSERT_TRUE(WaitFor([&] { return CommandEnded(r, *restart); }, 20s)) << Log();
  EXPECT_EQ(r.Command(*restart)->state, CommandState::kDone) << r.Command(*restart)->reason;
  ASSERT_TRUE(WaitFor([&] { return W(r, "w1").pid() == second; }, 10s)) << Log();
  EXPECT_EQ(W(r, "w1").restarts(), 1u);

  // A crash the agent did not cause: reported as gone, status unknown.
  kill(second, SIGKILL);
  trainer_.Wait(10s);
  ASSERT_TRUE(WaitFor([&] { return r.Exits().size() >= 2; }, 20s)) << Log();
  const std::vector<WorkerExit> exits = r.Exits();
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_EQ(exits[0].pid(), first);
  EXPECT_EQ(exits[0].cause(), "command");
  EXPECT_EQ(exits[0].signal(), SIGTERM);
  EXPECT_EQ(exits[1].pid(), second);
  EXPECT_EQ(exits[1].cause(), "gone");
  EXPECT_EQ(exits[1].exit_code(), -1);
  EXPECT_EQ(exits[1].signal(), 0);
  EXPECT_EQ(W(r, "w1").state(), WORKER_STATE_BACKOFF);  // waiting for the kubelet
  StartTrainer();
  const pid_t third = trainer_.pid();
  ASSERT_TRUE(WaitFor([&] { return W(r, "w1").pid() == third; }, 20s)) << Log();
  EXPECT_EQ(W(r, "w1").restarts(), 2u);

  // Stop cannot be kept by a sidecar: refused, nothing signalled.
  auto stop = r.StopWorker("w1");
  ASSERT_TRUE(stop.ok()) << stop.status();
  ASSERT_TRUE(WaitFor([&] { return CommandEnded(r, *stop); }, 10s)) << Log();
  EXPECT_EQ(r.Command(*stop)->state, CommandState::kRefused);
  EXPECT_NE(r.Command(*stop)->reason.find("cannot keep it stopped"), std::string::npos) << r.Command(*stop)->reason;

  // The agent leaving (the kubelet's SIGTERM at the end of the pod) leaves the trainer alone.
  kill(agent_.pid(), SIGTERM);
  ASSERT_TRUE(WaitFor([&] { return !agent_.running(); }, 20s)) << Log();
  EXPECT_TRUE(WIFEXITED(agent_.exit_status()) && WEXITSTATUS(agent_.exit_status()) == 0) << Log();
  EXPECT_TRUE(trainer_.running()) << "the agent killed a trainer it did not start";
  EXPECT_EQ(r.Exits().size(), 2u);
}

TEST_F(AttachTest, MigrateFromTheSidecarMarksDeletesAndLeavesTheTrainerToTheKubelet) {
  StartTrainer();
  AgentServer server;
  FakeKubeApi api(dir_.path());
  StartAgent(server, api, "mlp", {"--attach-poll-ms", "100", "--k8s-mark-node"}, {"--attach", Pattern()});
  AgentRegistry& r = server.registry();
  ASSERT_TRUE(WaitFor([&] { return W(r, "w0").pid() == trainer_.pid(); }, 20s)) << Log();
  auto id = r.Migrate("node-a", "node is slow");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(WaitFor([&] { return !agent_.running(); }, 30s)) << Log();
  ASSERT_TRUE(WIFEXITED(agent_.exit_status())) << Log();
  EXPECT_EQ(WEXITSTATUS(agent_.exit_status()), 75) << Log();
  EXPECT_EQ(r.Command(*id)->state, CommandState::kDone) << r.Command(*id)->reason;
  const auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 2u) << Log();
  EXPECT_EQ(reqs[0].method + " " + reqs[0].target, "PATCH /api/v1/nodes/node-a");
  EXPECT_EQ(reqs[1].method + " " + reqs[1].target, "DELETE /api/v1/namespaces/pacer-jobs/pods/trainer-pod-a");
  // The pod's deletion ends the trainer's container; the agent itself does not signal it.
  EXPECT_TRUE(trainer_.running());
  EXPECT_TRUE(r.Exits().empty());
}

TEST(AttachFlagsTest, AttachExcludesAWorkerCommandAndNeedsOneWorker) {
  TempDir dir;
  for (const auto& [argv, expect] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--attach", "train.py", "--", "sleep", "1"}, "exclude each other"},
           {{"--attach", "train.py", "--workers", "2"}, "--workers must be 1"},
           {{"--attach", "train.py", "--attach-poll-ms", "0"}, "--attach-poll-ms must be at least 1"},
           {{"--attach", "train.py", "--k8s-mark-node"}, "--k8s-mark-node needs --kubernetes"}}) {
    std::vector<std::string> full = {BinaryPath("pacer-agent"), "--node", "n", "--no-nvml"};
    full.insert(full.end(), argv.begin(), argv.end());
    Subprocess p = Subprocess::Start(full, {}, dir.Sub("log"));
    const int st = p.Wait(20s);
    ASSERT_NE(st, -1);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << argv[0];
    const std::string log = ReadFileOrEmpty(dir.Sub("log"));
    EXPECT_NE(log.find(expect), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace pacer
