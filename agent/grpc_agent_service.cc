#include "agent/grpc_agent_service.h"

#include "common/reply_limit.h"

namespace pacer {

grpc::ServerUnaryReactor* GrpcAgentService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                      const AgentHeartbeat* req,
                                                      AgentHeartbeatReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = auth_->RequireNode(ctx->client_metadata(), req->node(), "agent heartbeat");
  reactor->Finish(ReplyStatus(s.ok() ? registry_->Heartbeat(*req, reply) : s, *reply, "agent heartbeat"));
  return reactor;
}

}  // namespace pacer
