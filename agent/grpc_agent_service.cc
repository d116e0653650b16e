#include "agent/grpc_agent_service.h"

#include <utility>

#include "common/grpc_unary.h"

namespace pacer {

absl::Status GrpcAgentService::Scope(const Authenticator::Metadata& md, const AgentHeartbeat& req,
                                     std::set<std::string>* left_out) const {
  RETURN_IF_ERROR(auth_->RequireNode(md, req.node(), "agent heartbeat"));
  auto caller = auth_->Identify(md);
  if (!caller.ok()) return caller.status();
  if (caller->unrestricted()) return absl::OkStatus();
  // An agent credential is one agent: the agent of its node.
  if (req.agent_id() != caller->id) {
    return absl::PermissionDeniedError("agent heartbeat: " + caller->Describe() + " cannot act as agent '" +
                                       req.agent_id() + "'");
  }
  if (directory_ == nullptr) return absl::OkStatus();
  // It reports on the workers registered on its node; one registered elsewhere is refused, one
  // not registered yet (its process has not reached pacerd), or registered with no node, is left
  // out until it registers here.
  auto check = [&](const std::string& worker) -> absl::Status {
    const std::optional<WorkerDirectory::Registration> r = directory_->Registered(worker);
    if (r && r->node == req.node()) return absl::OkStatus();
    if (r && !r->node.empty()) {
      return absl::PermissionDeniedError("agent heartbeat: " + caller->Describe() +
                                         " cannot report on worker '" + worker +
                                         "', registered on another node");
    }
    left_out->insert(worker);
    return absl::OkStatus();
  };
  for (const WorkerProcess& w : req.workers()) RETURN_IF_ERROR(check(w.worker_id()));
  for (const WorkerExit& e : req.exits()) RETURN_IF_ERROR(check(e.worker_id()));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* GrpcAgentService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                      const AgentHeartbeat* req,
                                                      AgentHeartbeatReply* reply) {
  std::set<std::string> left_out;
  absl::Status allowed = Scope(ctx->client_metadata(), *req, &left_out);
  return AnswerNow(ctx, *reply, "agent heartbeat", std::move(allowed),
                   [&] { return registry_->Heartbeat(*req, reply, left_out); });
}

}  // namespace pacer
