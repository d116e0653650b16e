// ContentionSwitchService: pacerd's admin handle on the agents' contention switch
// (proto/pacer/agent.proto, service ContentionSwitch), used by `pacerctl contention` and the
// demo to put real CPU contention on one worker while a job runs.
//
// SetContention finds the live agent that supervises the worker (AgentRegistry::Agents()) and
// queues a SetContention command (factor > 1) or a ClearContention command (factor 0) for it;
// GetCommand reports that command's state. Both require the admin token. Bad input
// (empty worker, factor not 0 and not in (1, 100]) is INVALID_ARGUMENT, an unknown worker or
// command NOT_FOUND; neither queues anything.
//
// Owns nothing: `agents` and `auth` must outlive it. Thread-safe (the registry is), handlers
// finish inline and never block.
#pragma once

#include "agent/agent_registry.h"
#include "common/auth.h"
#include "proto/pacer/agent.grpc.pb.h"

namespace pacer {

class ContentionSwitchService final : public ContentionSwitch::CallbackService {
 public:
  ContentionSwitchService(AgentRegistry* agents, const Authenticator* auth)
      : agents_(agents), auth_(auth) {}

  grpc::ServerUnaryReactor* SetContention(grpc::CallbackServerContext* ctx,
                                          const ContentionRequest* req,
                                          ContentionReply* reply) override;
  grpc::ServerUnaryReactor* GetCommand(grpc::CallbackServerContext* ctx,
                                       const GetCommandRequest* req,
                                       GetCommandReply* reply) override;

  // The service layer behind the handlers (no auth), for in-process callers and tests.
  absl::Status Set(const ContentionRequest& req, ContentionReply* reply);
  absl::Status Get(const GetCommandRequest& req, GetCommandReply* reply) const;

 private:
  AgentRegistry* agents_;
  const Authenticator* auth_;
};

}  // namespace pacer
