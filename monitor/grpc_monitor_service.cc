#include "monitor/grpc_monitor_service.h"

#include "common/grpc_unary.h"

namespace pacer {

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

grpc::ServerUnaryReactor* GrpcMonitorService::RegisterWorker(grpc::CallbackServerContext* ctx,
                                                             const MonitorRegisterRequest* req,
                                                             MonitorRegisterResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerNow(ctx, *resp, "RegisterWorker", CheckRegister(md, *req),
                   [&] { return impl_->RegisterWorker(*req, resp); });
}

grpc::ServerUnaryReactor* GrpcMonitorService::ReportSteps(grpc::CallbackServerContext* ctx,
                                                          const ReportStepsRequest* req,
                                                          ReportStepsResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerNow(ctx, *resp, "ReportSteps", RequireOwnReports(*auth_, md, *req),
                   [&] { return impl_->ReportSteps(*req, resp); });
}

grpc::ServerUnaryReactor* GrpcMonitorService::ReportNode(grpc::CallbackServerContext* ctx,
                                                         const ReportNodeRequest* req,
                                                         ReportNodeResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerNow(ctx, *resp, "ReportNode", auth_->RequireNode(md, req->metrics().node(), "report node"),
                   [&] { return impl_->ReportNode(*req, resp); });
}

grpc::ServerUnaryReactor* GrpcMonitorService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                          const ListWorkersRequest* req,
                                                          ListWorkersResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerNow(ctx, *resp, "ListWorkers", auth_->RequireWorkerSide(md, "list workers"),
                   [&] { return impl_->ListWorkers(*req, resp); });
}

}  // namespace pacer
