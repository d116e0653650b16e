// GrpcMonitorService: the gRPC adapter of the monitor (callback API).
//
// Each handler authenticates the caller (every Monitor RPC needs the job token, Role::kWorker,
// or the admin token) and hands the request to MonitorServiceImpl, whose calls are short and
// never block on I/O, so the reactor finishes inline. Owns nothing; `impl` and `auth` must
// outlive it. Thread-safe (the impl is).
#pragma once

#include "common/auth.h"
#include "monitor/monitor_service.h"
#include "proto/pacer/monitor.grpc.pb.h"

namespace pacer {

class GrpcMonitorService final : public Monitor::CallbackService {
 public:
  GrpcMonitorService(MonitorServiceImpl* impl, const Authenticator* auth) : impl_(impl), auth_(auth) {}

#define PACER_MONITOR_RPC(Method, Request, Response)                                        \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx, const Request* req, \
                                   Response* resp) override;
  PACER_MONITOR_RPC(RegisterWorker, MonitorRegisterRequest, MonitorRegisterResponse)
  PACER_MONITOR_RPC(ReportSteps, ReportStepsRequest, ReportStepsResponse)
  PACER_MONITOR_RPC(ReportNode, ReportNodeRequest, ReportNodeResponse)
  PACER_MONITOR_RPC(ListWorkers, ListWorkersRequest, ListWorkersResponse)
#undef PACER_MONITOR_RPC

 private:
  MonitorServiceImpl* impl_;
  const Authenticator* auth_;
};

}  // namespace pacer
