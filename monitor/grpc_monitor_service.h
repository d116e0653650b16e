// GrpcMonitorService: the gRPC adapter of the monitor (callback API).
//
// Each handler authorizes the caller and hands the request to MonitorServiceImpl, whose calls are
// short and never block on I/O, so the reactor finishes inline. RegisterWorker and ReportSteps
// act as the request's workers (every step's worker_id, every latency sample's reporter) and
// need their credentials or a token, and a worker registers on its agent's node, if a live
// agent lists it (common/identity_rules.h); ReportNode speaks for the request's node (its agent
// credential or a token); ListWorkers needs a worker or chief credential or a token. Owns
// nothing; `impl`, `auth` and `directory` (may be null: no node rule) must outlive it.
// Thread-safe (the impl is).
#pragma once

#include "common/auth.h"
#include "common/identity_rules.h"
#include "monitor/monitor_service.h"
#include "proto/pacer/monitor.grpc.pb.h"

namespace pacer {

class GrpcMonitorService final : public Monitor::CallbackService {
 public:
  GrpcMonitorService(MonitorServiceImpl* impl, const Authenticator* auth,
                     const WorkerDirectory* directory = nullptr)
      : impl_(impl), auth_(auth), directory_(directory) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx, const MonitorRegisterRequest* req,
                                           MonitorRegisterResponse* resp) override;
  grpc::ServerUnaryReactor* ReportSteps(grpc::CallbackServerContext* ctx, const ReportStepsRequest* req,
                                        ReportStepsResponse* resp) override;
  grpc::ServerUnaryReactor* ReportNode(grpc::CallbackServerContext* ctx, const ReportNodeRequest* req,
                                       ReportNodeResponse* resp) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const ListWorkersRequest* req,
                                        ListWorkersResponse* resp) override;

 private:
  absl::Status CheckRegister(const Authenticator::Metadata& md, const MonitorRegisterRequest& req) const;

  MonitorServiceImpl* impl_;
  const Authenticator* auth_;
  const WorkerDirectory* directory_;
};

}  // namespace pacer
