#include "controller/grpc_controller_service.h"

#include "common/reply_limit.h"

namespace pacer {

grpc::ServerUnaryReactor* GrpcControllerService::ListActions(grpc::CallbackServerContext* ctx,
                                                             const ListActionsRequest* req,
                                                             ListActionsResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::Status s = auth_->RequireWorkerSide(ctx->client_metadata(), "list actions");
  if (s.ok()) reconciler_->ListActions(*req, resp);
  reactor->Finish(ReplyStatus(s, *resp, "ListActions"));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcControllerService::ApplyPolicy(grpc::CallbackServerContext* ctx,
                                                             const ApplyPolicyRequest* req,
                                                             ApplyPolicyResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::Status s = auth_->Require(ctx->client_metadata(), Role::kAdmin);
  if (s.ok()) s = reconciler_->ApplyPolicy(req->yaml(), req->file_name(), resp);
  reactor->Finish(ReplyStatus(s, *resp, "ApplyPolicy"));
  return reactor;
}

}  // namespace pacer
