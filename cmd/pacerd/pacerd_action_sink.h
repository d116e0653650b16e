// PacerdActionSink: how pacerd carries out the controller's executed actions (action_sink.h).
//
//   ADJUST_BS        the plan goes to the workers' heartbeat sessions (WorkerSessions): each
//                    worker's next reply carries its BatchPlanCommand until it holds the version
//   EXCLUDE_WORKERS  the exclusion goes to the sessions (workers that honour exclusion get it)
//   REALLOCATE       the sharding service's SetAllocation for each worker of the new allocation,
//                    the default back for workers it leaves out, SetTailBackup on every dataset
//   RESTART, MIGRATE, RESTART_SERVER   the node agents (AgentRegistry); RELIEVE_SERVER is
//                    refused (pacer-ps has no re-sharding)
// Thread-safe: each part it calls is.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "agent/agent_registry.h"
#include "controller/action_sink.h"
#include "controller/worker_sessions.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

// Carries out RESTART / MIGRATE / RESTART_SERVER through the node agents (a parameter server
// runs under a pacer-agent like a worker); RELIEVE_SERVER is refused. Returns the audit's note.
absl::StatusOr<std::string> DispatchAgentAction(AgentRegistry& agents, const Action& a);

class PacerdActionSink : public ActionSink {
 public:
  // `agents` may be null (actions for agents are then noted "no agent registry"). `then`, when
  // set, is told of each action after it was carried out here (PacerdOptions::also_carry); its
  // note is appended.
  PacerdActionSink(WorkerSessions* sessions, ShardingServiceImpl* sharding, AgentRegistry* agents,
                   ActionSink* then = nullptr)
      : sessions_(sessions), sharding_(sharding), agents_(agents), then_(then) {}

  absl::StatusOr<std::string> Carry(const Action& action, const CarryContext& context) override;

 private:
  absl::StatusOr<std::string> CarryHere(const Action& action, const CarryContext& context);
  std::string Reallocate(const Action& a, const CarryContext& context);

  WorkerSessions* sessions_;
  ShardingServiceImpl* sharding_;
  AgentRegistry* agents_;
  ActionSink* then_;
};

}  // namespace pacer
