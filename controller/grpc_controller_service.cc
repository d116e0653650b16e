#include "controller/grpc_controller_service.h"

#include "common/grpc_unary.h"

namespace pacer {

grpc::ServerUnaryReactor* GrpcControllerService::ListActions(grpc::CallbackServerContext* ctx,
                                                             const ListActionsRequest* req,
                                                             ListActionsResponse* resp) {
  return AnswerNow(ctx, *resp, "ListActions", auth_->RequireWorkerSide(ctx->client_metadata(), "list actions"),
                   [&] { reconciler_->ListActions(*req, resp); });
}

grpc::ServerUnaryReactor* GrpcControllerService::ApplyPolicy(grpc::CallbackServerContext* ctx,
                                                             const ApplyPolicyRequest* req,
                                                             ApplyPolicyResponse* resp) {
  return AnswerNow(ctx, *resp, "ApplyPolicy", auth_->Require(ctx->client_metadata(), Role::kAdmin),
                   [&] { return reconciler_->ApplyPolicy(req->yaml(), req->file_name(), resp); });
}

}  // namespace pacer
