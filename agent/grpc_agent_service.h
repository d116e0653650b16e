// GrpcAgentService: the gRPC adapter of AgentRegistry (callback API).
//
// One handler, one line: authenticate (agents hold the job token, Role::kWorker; the admin
// token is accepted too), hand the request to the registry, finish inline (the registry never
// blocks on I/O). Owns nothing: `registry` and `auth` must outlive it. Thread-safe.
#pragma once

#include "agent/agent_registry.h"
#include "common/auth.h"
#include "proto/pacer/agent.grpc.pb.h"

namespace pacer {

class GrpcAgentService final : public AgentService::CallbackService {
 public:
  GrpcAgentService(AgentRegistry* registry, const Authenticator* auth)
      : registry_(registry), auth_(auth) {}

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const AgentHeartbeat* req,
                                      AgentHeartbeatReply* reply) override;

 private:
  AgentRegistry* registry_;
  const Authenticator* auth_;
};

}  // namespace pacer
