#include "agent/grpc_agent_service.h"

#include "common/status.h"

namespace pacer {

grpc::ServerUnaryReactor* GrpcAgentService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                      const AgentHeartbeat* req,
                                                      AgentHeartbeatReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = auth_->RequireNode(ctx->client_metadata(), req->node(), "agent heartbeat");
  reactor->Finish(ToGrpcStatus(s.ok() ? registry_->Heartbeat(*req, reply) : s));
  return reactor;
}

}  // namespace pacer
