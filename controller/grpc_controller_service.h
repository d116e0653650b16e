// GrpcControllerService: the gRPC adapter of the controller on pacerd (callback API).
// ListActions needs a worker or chief credential or a token; ApplyPolicy (hot reload) the admin
// token (docs/security.md).
#pragma once

#include "common/auth.h"
#include "controller/reconciler.h"
#include "proto/pacer/controller.grpc.pb.h"

namespace pacer {

class GrpcControllerService final : public ControllerService::CallbackService {
 public:
  GrpcControllerService(Reconciler* reconciler, const Authenticator* auth)
      : reconciler_(reconciler), auth_(auth) {}

  grpc::ServerUnaryReactor* ListActions(grpc::CallbackServerContext* ctx,
                                        const ListActionsRequest* req,
                                        ListActionsResponse* resp) override;
  grpc::ServerUnaryReactor* ApplyPolicy(grpc::CallbackServerContext* ctx,
                                        const ApplyPolicyRequest* req,
                                        ApplyPolicyResponse* resp) override;

 private:
  Reconciler* reconciler_;
  const Authenticator* auth_;
};

}  // namespace pacer
