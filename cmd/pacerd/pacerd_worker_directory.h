// PacerdWorkerDirectory: what pacerd's identity rules (common/identity_rules.h) know of a worker,
// read from the sharding service (registrations, journaled) and the agent registry (which live
// agent lists it). Owns nothing; both must outlive it. Thread-safe: each call takes one service's
// lock at a time, never two.
#pragma once

#include "agent/agent_registry.h"
#include "common/identity_rules.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

class PacerdWorkerDirectory final : public WorkerDirectory {
 public:
  PacerdWorkerDirectory(const ShardingServiceImpl* sharding, const AgentRegistry* agents)
      : sharding_(sharding), agents_(agents) {}

  std::optional<Registration> Registered(std::string_view worker_id) const override {
    return sharding_->Registration(std::string(worker_id));
  }
  std::optional<std::string> AgentNode(std::string_view worker_id) const override {
    return agents_->LiveAgentNodeOf(std::string(worker_id));
  }

 private:
  const ShardingServiceImpl* sharding_;
  const AgentRegistry* agents_;
};

}  // namespace pacer
