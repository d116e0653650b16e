// AgentRegistry (pacerd's side of the agents) on a simulated clock: registration and
// re-registration, the command queue (resent until acknowledged, outcomes recorded), exits
// recorded once, node metrics forwarded, and every bad input refused without changing anything.
#include "agent/agent_registry.h"

#include <gtest/gtest.h>

namespace pacer {
namespace {

AgentHeartbeat Beat(const std::string& agent, uint64_t incarnation,
                    std::vector<std::string> workers = {"w0", "w1"}) {
  AgentHeartbeat h;
  h.set_job("job");
  h.set_node("node-" + agent);
  h.set_agent_id(agent);
  h.set_incarnation(incarnation);
  int pid = 100;
  for (const auto& w : workers) {
    WorkerProcess* p = h.add_workers();
    p->set_worker_id(w);
    p->set_pid(pid++);
    p->set_state(WORKER_STATE_RUNNING);
  }
  return h;
}

class AgentRegistryTest : public ::testing::Test {
 protected:
  AgentRegistryTest() : registry_(Options(), &clock_) {}
  static AgentRegistryOptions Options() {
    AgentRegistryOptions o;
    o.id_nonce = 0xabc;
    o.agent_timeout_ms = 5000;
    return o;
  }
  AgentHeartbeatReply Send(const AgentHeartbeat& h) {
    AgentHeartbeatReply r;
    absl::Status s = registry_.Heartbeat(h, &r);
    EXPECT_TRUE(s.ok()) << s;
    return r;
  }
  SimulatedClock clock_;
  AgentRegistry registry_;
};

TEST_F(AgentRegistryTest, FirstHeartbeatRegistersAndNewIncarnationReRegisters) {
  EXPECT_TRUE(Send(Beat("a", 10)).registered());
  EXPECT_FALSE(Send(Beat("a", 10)).registered());
  EXPECT_TRUE(Send(Beat("a", 11)).registered());  // the agent restarted
  auto agents = registry_.Agents();
  ASSERT_EQ(agents.size(), 1u);
  EXPECT_EQ(agents[0].registrations, 2u);
  EXPECT_EQ(agents[0].incarnation, 11u);
  EXPECT_EQ(agents[0].heartbeats, 3u);
  EXPECT_EQ(registry_.Worker("w1")->pid(), 101);
}

TEST_F(AgentRegistryTest, CommandIsResentUntilAckedThenRecorded) {
  Send(Beat("a", 1));
  auto id = registry_.RestartWorker("w1");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->rfind("0000000000000abc-", 0), 0u) << *id;
  for (int i = 0; i < 2; ++i) {  // a lost reply: the next heartbeat carries it again
    AgentHeartbeatReply r = Send(Beat("a", 1));
    ASSERT_EQ(r.commands_size(), 1);
    EXPECT_EQ(r.commands(0).command_id(), *id);
    EXPECT_EQ(r.commands(0).restart_worker().worker_id(), "w1");
  }
  AgentHeartbeat h = Beat("a", 1);
  CommandAck* ack = h.add_acks();
  ack->set_command_id(*id);
  ack->set_ok(true);
  EXPECT_EQ(Send(h).commands_size(), 0);
  auto c = registry_.Command(*id);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state, CommandState::kDone);
  EXPECT_EQ(c->deliveries, 2u);
  // A repeated ack (the agent's reply was lost) changes nothing.
  ack->set_ok(false);
  Send(h);
  EXPECT_EQ(registry_.Command(*id)->state, CommandState::kDone);
  // The next command gets a different id.
  auto id2 = registry_.RestartWorker("w1");
  ASSERT_TRUE(id2.ok());
  EXPECT_NE(*id, *id2);
}

TEST_F(AgentRegistryTest, RefusalReasonIsRecorded) {
  Send(Beat("a", 1));
  auto id = registry_.SetContention("w0", 2.0);
  ASSERT_TRUE(id.ok());
  AgentHeartbeat h = Beat("a", 1);
  CommandAck* ack = h.add_acks();
  ack->set_command_id(*id);
  ack->set_ok(false);
  ack->set_reason("no cgroup");
  Send(h);
  EXPECT_EQ(registry_.Command(*id)->state, CommandState::kRefused);
  EXPECT_EQ(registry_.Command(*id)->reason, "no cgroup");
}

TEST_F(AgentRegistryTest, ControllerCallsValidateAndQueueNothingOnError) {
  Send(Beat("a", 1));
  EXPECT_EQ(registry_.RestartWorker("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.RestartWorker("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.Migrate("no-such-node", "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.SetContention("w0", 0.5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.SetContention("w0", 1.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.SetContention("w0", 1000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.ClearContention("node-b", "w0").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Send(Beat("a", 1)).commands_size(), 0);
  EXPECT_TRUE(registry_.Migrate("node-a", "bad node").ok());
  EXPECT_TRUE(registry_.StopAllWorkers("node-a").ok());
  EXPECT_EQ(Send(Beat("a", 1)).commands_size(), 2);
}

TEST_F(AgentRegistryTest, BadHeartbeatsAreRefusedAndChangeNothing) {
  Send(Beat("a", 5));
  auto before = registry_.Agents();
  auto refuse = [&](AgentHeartbeat h, absl::StatusCode code) {
    AgentHeartbeatReply r;
    absl::Status s = registry_.Heartbeat(h, &r);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_FALSE(s.message().empty());
  };
  AgentHeartbeat h = Beat("a", 5);
  h.clear_agent_id();
  refuse(h, absl::StatusCode::kInvalidArgument);
  h = Beat("a", 5);
  h.clear_node();
  refuse(h, absl::StatusCode::kInvalidArgument);
  refuse(Beat("a", 0), absl::StatusCode::kInvalidArgument);
  refuse(Beat("a", 5, {"w0", "w0"}), absl::StatusCode::kInvalidArgument);
  refuse(Beat("a", 5, {""}), absl::StatusCode::kInvalidArgument);
  h = Beat("a", 5);
  h.mutable_workers(0)->set_state(static_cast<WorkerProcessState>(42));
  refuse(h, absl::StatusCode::kInvalidArgument);
  h = Beat("a", 5);
  h.add_exits()->set_worker_id("w0");  // seq 0
  refuse(h, absl::StatusCode::kInvalidArgument);
  h = Beat("a", 5);
  h.mutable_node_metrics()->set_node("elsewhere");
  refuse(h, absl::StatusCode::kInvalidArgument);
  refuse(Beat("a", 4), absl::StatusCode::kFailedPrecondition);       // zombie incarnation
  refuse(Beat("b", 1, {"w1"}), absl::StatusCode::kFailedPrecondition);  // w1 belongs to live a
  auto after = registry_.Agents();
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(after[0].heartbeats, before[0].heartbeats);
  EXPECT_EQ(after[0].incarnation, before[0].incarnation);
  // Once `a` is lost, another agent may take its worker over (a migration).
  clock_.AdvanceMs(6000);
  EXPECT_TRUE(Send(Beat("b", 1, {"w1"})).registered());
  EXPECT_EQ(registry_.Worker("w1")->pid(), 100);
}

TEST_F(AgentRegistryTest, ExitsAreRecordedOnceAndAcknowledged) {
  AgentHeartbeat h = Beat("a", 1);
  for (uint64_t seq : {1, 2}) {
    WorkerExit* e = h.add_exits();
    e->set_seq(seq);
    e->set_worker_id("w0");
    e->set_signal(9);
  }
  EXPECT_EQ(Send(h).exits_acked_through(), 2u);
  EXPECT_EQ(Send(h).exits_acked_through(), 2u);  // resent: not recorded twice
  EXPECT_EQ(registry_.Exits().size(), 2u);
  // A new incarnation numbers its exits from 1 again.
  AgentHeartbeat h2 = Beat("a", 2);
  WorkerExit* e = h2.add_exits();
  e->set_seq(1);
  e->set_worker_id("w1");
  EXPECT_EQ(Send(h2).exits_acked_through(), 1u);
  EXPECT_EQ(registry_.Exits().size(), 3u);
}

TEST_F(AgentRegistryTest, NodeMetricsGoToTheSinkAndAgentsGoLost) {
  std::vector<NodeMetrics> got;
  registry_.SetNodeMetricsSink([&](const NodeMetrics& m) { got.push_back(m); });
  AgentHeartbeat h = Beat("a", 1);
  h.mutable_node_metrics()->set_cpu_busy_frac(0.5);
  Send(h);
  Send(Beat("a", 1));  // no metrics: nothing forwarded
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].node(), "node-a");  // filled in from the heartbeat
  EXPECT_DOUBLE_EQ(got[0].cpu_busy_frac(), 0.5);
  EXPECT_FALSE(registry_.Agents()[0].lost);
  clock_.AdvanceMs(5001);
  EXPECT_TRUE(registry_.Agents()[0].lost);
}

}  // namespace
}  // namespace pacer
