#include "monitor/grpc_monitor_service.h"

#include "common/reply_limit.h"

namespace pacer {

// One line per RPC: authorize (`Check`, with the call's metadata `md` and request `req` in
// scope), delegate, finish.
#define PACER_MONITOR_HANDLER(Method, Request, Response, Check)                                 \
  grpc::ServerUnaryReactor* GrpcMonitorService::Method(grpc::CallbackServerContext* ctx,        \
                                                       const Request* req, Response* resp) {    \
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();                                  \
    const auto& md = ctx->client_metadata();                                                    \
    absl::Status s = (Check);                                                                   \
    reactor->Finish(ReplyStatus(s.ok() ? impl_->Method(*req, resp) : s, *resp, #Method));        \
    return reactor;                                                                             \
  }

namespace {

// Every step in a report must be the caller's own: one foreign step refuses the whole report.
absl::Status RequireOwnSteps(const Authenticator& auth, const Authenticator::Metadata& md,
                             const ReportStepsRequest& req) {
  auto p = auth.Identify(md);
  if (!p.ok()) return p.status();
  for (const StepReport& step : req.steps()) {
    if (!p->MayActAsWorker(step.worker_id())) {
      return absl::PermissionDeniedError("report steps: " + p->Describe() +
                                         " cannot report steps of worker '" + step.worker_id() + "'");
    }
  }
  return absl::OkStatus();
}

}  // namespace

PACER_MONITOR_HANDLER(RegisterWorker, MonitorRegisterRequest, MonitorRegisterResponse,
                      auth_->RequireWorker(md, req->worker_id(), "monitor register"))
PACER_MONITOR_HANDLER(ReportSteps, ReportStepsRequest, ReportStepsResponse, RequireOwnSteps(*auth_, md, *req))
PACER_MONITOR_HANDLER(ReportNode, ReportNodeRequest, ReportNodeResponse,
                      auth_->RequireNode(md, req->metrics().node(), "report node"))
PACER_MONITOR_HANDLER(ListWorkers, ListWorkersRequest, ListWorkersResponse, auth_->Require(md, Role::kWorker))

#undef PACER_MONITOR_HANDLER

}  // namespace pacer
