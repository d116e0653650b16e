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

// Every step in a report must be the caller's own, and every latency sample must have been
// measured by the caller (its reporter is the calling worker): one foreign id refuses the whole
// report, and a sample without a reporter is refused. The job and admin tokens may report for
// any worker.
absl::Status RequireOwnReports(const Authenticator& auth, const Authenticator::Metadata& md,
                               const ReportStepsRequest& req) {
  auto p = auth.Identify(md);
  if (!p.ok()) return p.status();
  if (!p->worker_side()) {
    return absl::PermissionDeniedError("report steps needs a worker credential, the job token or the "
                                       "admin token, not " + p->Describe());
  }
  for (const StepReport& step : req.steps()) {
    if (!p->MayActAsWorker(step.worker_id())) {
      return absl::PermissionDeniedError("report steps: " + p->Describe() +
                                         " cannot report steps of worker '" + step.worker_id() + "'");
    }
  }
  for (const ServerLatency& sample : req.server_latency()) {
    if (sample.reporter().empty()) {
      return absl::InvalidArgumentError("report steps: a server latency sample of '" + sample.server_id() +
                                        "' names no reporter (the worker that measured it)");
    }
    if (!p->unrestricted() && sample.reporter() != p->id) {
      return absl::PermissionDeniedError("report steps: " + p->Describe() +
                                         " cannot report server latency measured by worker '" +
                                         sample.reporter() + "' (a sample's reporter is the worker "
                                         "that measured it)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GrpcMonitorService::CheckRegister(const Authenticator::Metadata& md,
                                               const MonitorRegisterRequest& req) const {
  auto caller = auth_->Identify(md);
  if (!caller.ok()) return caller.status();
  RETURN_IF_ERROR(auth_->RequireWorker(md, req.worker_id(), "monitor register"));
  return directory_ ? CheckNodeClaim(*caller, *directory_, req.worker_id(), req.node(), "monitor register")
                    : absl::OkStatus();
}

PACER_MONITOR_HANDLER(RegisterWorker, MonitorRegisterRequest, MonitorRegisterResponse, CheckRegister(md, *req))
PACER_MONITOR_HANDLER(ReportSteps, ReportStepsRequest, ReportStepsResponse, RequireOwnReports(*auth_, md, *req))
PACER_MONITOR_HANDLER(ReportNode, ReportNodeRequest, ReportNodeResponse,
                      auth_->RequireNode(md, req->metrics().node(), "report node"))
PACER_MONITOR_HANDLER(ListWorkers, ListWorkersRequest, ListWorkersResponse,
                      auth_->RequireWorkerSide(md, "list workers"))

#undef PACER_MONITOR_HANDLER

}  // namespace pacer
