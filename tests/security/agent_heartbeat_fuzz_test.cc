// Robustness of the agent heartbeat, the one call every agent credential can send: raw random
// bytes parsed as an AgentHeartbeat and structured hostile heartbeats (ids near the live ones,
// huge lists, zombie incarnations, acks and exits out of order, time jumping) are answered with
// a status and never crash the registry or break its invariants:
//   - at most max_agents agents, each listing at most max_workers_per_agent workers;
//   - no worker listed by two live, non-leaving agents;
//   - every worker's supervising agent (Worker()) lists it.
// The registry keeps serving an honest agent afterwards. Bounded and seeded.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>

#include "agent/agent_registry.h"
#include "common/clock.h"

namespace pacer {
namespace {

AgentHeartbeat RandomHeartbeat(std::mt19937_64& rng) {
  AgentHeartbeat hb;
  auto pick = [&](const char* prefix, int n) { return prefix + std::to_string(rng() % n); };
  const std::string node = rng() % 20 == 0 ? "" : pick("n", 12);
  hb.set_node(node);
  hb.set_agent_id(rng() % 5 == 0 ? pick("a", 12) : node);
  hb.set_job("job");
  switch (rng() % 4) {
    case 0: hb.set_incarnation(0); break;
    case 1: hb.set_incarnation(~uint64_t{0} - rng() % 3); break;
    default: hb.set_incarnation(1 + rng() % 4); break;
  }
  const int workers = rng() % 10 == 0 ? 1000 + static_cast<int>(rng() % 100) : static_cast<int>(rng() % 6);
  for (int i = 0; i < workers; ++i) {
    WorkerProcess* w = hb.add_workers();
    w->set_worker_id(rng() % 30 == 0 ? "" : pick("w", 16));
    w->set_pid(static_cast<int32_t>(rng()));
    w->set_state(static_cast<WorkerProcessState>(rng() % 8));  // 6, 7: invalid
    w->set_rank(static_cast<uint32_t>(rng()));
    w->set_cpu_cores(rng() % 7 == 0 ? -1.0 : static_cast<double>(rng() % 400) / 100);
  }
  for (int i = static_cast<int>(rng() % 4); i > 0; --i) {
    WorkerExit* e = hb.add_exits();
    e->set_seq(rng() % 6);
    e->set_worker_id(pick("w", 16));
  }
  for (int i = static_cast<int>(rng() % 3); i > 0; --i) {
    CommandAck* a = hb.add_acks();
    a->set_command_id(rng() % 4 == 0 ? "" : std::to_string(rng() % 5));
    a->set_ok(rng() % 2);
  }
  if (rng() % 3 == 0) {
    hb.mutable_node_metrics()->set_node(rng() % 4 == 0 ? pick("n", 12) : node);
    hb.mutable_node_metrics()->set_cpu_busy_frac(static_cast<double>(rng() % 300) / 100 - 1);
  }
  hb.set_leaving(rng() % 10 == 0);
  return hb;
}

void CheckInvariants(const AgentRegistry& r, const AgentRegistryOptions& o, const SimulatedClock& clock) {
  const std::vector<AgentView> agents = r.Agents();
  ASSERT_LE(agents.size(), o.max_agents);
  std::map<std::string, std::string> live_owner;
  for (const AgentView& a : agents) {
    ASSERT_LE(a.workers.size(), o.max_workers_per_agent) << a.agent_id;
    const bool live = !a.lost && !a.leaving;
    for (const WorkerProcess& w : a.workers) {
      ASSERT_FALSE(w.worker_id().empty());
      if (!live) continue;
      auto [it, inserted] = live_owner.emplace(w.worker_id(), a.agent_id);
      ASSERT_TRUE(inserted) << "worker " << w.worker_id() << " listed by live agents " << it->second
                            << " and " << a.agent_id;
    }
  }
  for (const auto& [worker, owner] : live_owner) {
    auto w = r.Worker(worker);
    ASSERT_TRUE(w.ok()) << worker << ": " << w.status();
  }
  (void)clock;
}

TEST(AgentHeartbeatFuzzTest, HostileHeartbeatsNeverCrashOrBreakTheRegistry) {
  SimulatedClock clock;
  AgentRegistryOptions o;
  o.agent_timeout_ms = 5'000;
  o.max_agents = 8;
  o.max_workers_per_agent = 1024;
  o.id_nonce = 7;
  AgentRegistry registry(o, &clock);
  std::mt19937_64 rng(20261202);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 20'000; ++i) {
    AgentHeartbeat hb;
    if (i % 5 == 0) {
      // Raw bytes as the wire would bring them: either no message or some message.
      std::string bytes(rng() % 200, '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      if (!hb.ParseFromString(bytes)) continue;
    } else {
      hb = RandomHeartbeat(rng);
    }
    AgentHeartbeatReply reply;
    (registry.Heartbeat(hb, &reply).ok() ? accepted : refused)++;
    if (rng() % 50 == 0) clock.AdvanceMs(static_cast<int64_t>(rng() % 8'000));
    if (rng() % 40 == 0) (void)registry.RestartWorker("w" + std::to_string(rng() % 16));
    if (rng() % 60 == 0) (void)registry.Migrate("n" + std::to_string(rng() % 12), "fuzz");
    if (i % 500 == 0) ASSERT_NO_FATAL_FAILURE(CheckInvariants(registry, o, clock));
  }
  ASSERT_NO_FATAL_FAILURE(CheckInvariants(registry, o, clock));
  std::cout << accepted << " heartbeats accepted, " << refused << " refused" << std::endl;
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);

  // Still serving: an honest agent registers once the others have gone silent (a table full of
  // lost agents makes room).
  clock.AdvanceMs(60'000);
  AgentHeartbeat honest;
  honest.set_job("job");
  honest.set_node("honest-node");
  honest.set_agent_id("honest-node");
  honest.set_incarnation(1);
  honest.add_workers()->set_worker_id("w-honest");
  honest.mutable_workers(0)->set_state(WORKER_STATE_RUNNING);
  AgentHeartbeatReply reply;
  absl::Status s = registry.Heartbeat(honest, &reply);
  ASSERT_TRUE(s.ok()) << s;  // a lost agent makes room, pending commands or not
  EXPECT_TRUE(registry.Worker("w-honest").ok());
}

}  // namespace
}  // namespace pacer
