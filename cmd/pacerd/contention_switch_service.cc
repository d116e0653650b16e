#include "cmd/pacerd/contention_switch_service.h"

#include "common/grpc_unary.h"

namespace pacer {

absl::Status ContentionSwitchService::Set(const ContentionRequest& req, ContentionReply* reply) {
  if (req.worker_id().empty()) return absl::InvalidArgumentError("worker_id is empty");
  const double f = req.factor();
  if (f != 0 && !(f > 1 && f <= 100)) {
    return absl::InvalidArgumentError("factor must be 0 (off) or in (1, 100]");
  }
  std::string node;
  for (const AgentView& a : agents_->Agents()) {
    if (a.lost || a.leaving) continue;
    for (const WorkerProcess& w : a.workers) {
      if (w.worker_id() == req.worker_id()) node = a.node;
    }
  }
  if (node.empty()) {
    return absl::NotFoundError("no live agent supervises worker '" + req.worker_id() + "'");
  }
  absl::StatusOr<std::string> id = f == 0 ? agents_->ClearContention(node, req.worker_id())
                                          : agents_->SetContention(req.worker_id(), f);
  if (!id.ok()) return id.status();
  reply->set_command_id(*id);
  reply->set_node(node);
  return absl::OkStatus();
}

absl::Status ContentionSwitchService::Get(const GetCommandRequest& req,
                                          GetCommandReply* reply) const {
  absl::StatusOr<CommandStatus> c = agents_->Command(req.command_id());
  if (!c.ok()) return c.status();
  reply->set_command_id(c->command_id);
  reply->set_state(CommandStateName(c->state));
  reply->set_reason(c->reason);
  reply->set_queued_ms(c->queued_ms);
  reply->set_delivered_ms(c->delivered_ms);
  reply->set_acked_ms(c->acked_ms);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ContentionSwitchService::SetContention(grpc::CallbackServerContext* ctx,
                                                                 const ContentionRequest* req,
                                                                 ContentionReply* reply) {
  return AnswerNow(ctx, *reply, "SetContention", auth_->Require(ctx->client_metadata(), Role::kAdmin),
                   [&] { return Set(*req, reply); });
}

grpc::ServerUnaryReactor* ContentionSwitchService::GetCommand(grpc::CallbackServerContext* ctx,
                                                              const GetCommandRequest* req,
                                                              GetCommandReply* reply) {
  return AnswerNow(ctx, *reply, "GetCommand", auth_->Require(ctx->client_metadata(), Role::kAdmin),
                   [&] { return Get(*req, reply); });
}

}  // namespace pacer
