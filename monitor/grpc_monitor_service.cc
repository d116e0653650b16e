#include "monitor/grpc_monitor_service.h"

#include "common/status.h"

namespace pacer {

// One line per RPC: authenticate, delegate, finish.
#define PACER_MONITOR_HANDLER(Method, Request, Response, Role)                                  \
  grpc::ServerUnaryReactor* GrpcMonitorService::Method(grpc::CallbackServerContext* ctx,        \
                                                       const Request* req, Response* resp) {    \
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();                                  \
    absl::Status s = auth_->Require(ctx->client_metadata(), Role);                              \
    reactor->Finish(ToGrpcStatus(s.ok() ? impl_->Method(*req, resp) : s));                      \
    return reactor;                                                                             \
  }

PACER_MONITOR_HANDLER(RegisterWorker, MonitorRegisterRequest, MonitorRegisterResponse, Role::kWorker)
PACER_MONITOR_HANDLER(ReportSteps, ReportStepsRequest, ReportStepsResponse, Role::kWorker)
PACER_MONITOR_HANDLER(ReportNode, ReportNodeRequest, ReportNodeResponse, Role::kWorker)
PACER_MONITOR_HANDLER(ListWorkers, ListWorkersRequest, ListWorkersResponse, Role::kWorker)

#undef PACER_MONITOR_HANDLER

}  // namespace pacer
