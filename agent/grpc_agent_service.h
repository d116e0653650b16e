// GrpcAgentService: the gRPC adapter of AgentRegistry (callback API).
//
// One handler: authorize, hand the request to the registry, finish inline (the registry never
// blocks on I/O). pacer-agent holds the job token, which speaks for any node and agent. An agent
// credential speaks for its node only, as the agent whose id is that node, and reports on the
// workers registered on its node (the sharding registration, through `directory`): a worker
// registered on another node is refused, one not registered yet is left out of what the
// registry records until it registers (docs/security.md). Owns nothing: `registry`, `auth` and
// `directory` (may be null: no worker rule) must outlive it. Thread-safe.
#pragma once

#include "agent/agent_registry.h"
#include "common/auth.h"
#include "common/identity_rules.h"
#include "proto/pacer/agent.grpc.pb.h"

namespace pacer {

class GrpcAgentService final : public AgentService::CallbackService {
 public:
  GrpcAgentService(AgentRegistry* registry, const Authenticator* auth,
                   const WorkerDirectory* directory = nullptr)
      : registry_(registry), auth_(auth), directory_(directory) {}

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const AgentHeartbeat* req,
                                      AgentHeartbeatReply* reply) override;

 private:
  // OK when the caller may send `req`; fills `left_out` with the listed workers not to record.
  absl::Status Scope(const Authenticator::Metadata& md, const AgentHeartbeat& req,
                     std::set<std::string>* left_out) const;

  AgentRegistry* registry_;
  const Authenticator* auth_;
  const WorkerDirectory* directory_;
};

}  // namespace pacer
