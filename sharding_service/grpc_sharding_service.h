// GrpcShardingService: the gRPC adapter of the sharding service (callback API).
//
// Each handler authorizes the caller and hands the request to a ShardingApi (ShardingServiceImpl,
// or in pacerd its worker-session service, cmd/pacerd/worker_session_service.h); the RPC
// finishes when the impl's `done` runs (after the journal made the update durable), so no
// server thread blocks on an fsync. Worker calls (RegisterWorker, FetchShard, ReportProgress,
// CompleteShard, ReleaseShard, Heartbeat) need a credential for the request's worker_id (or the
// job or admin token), and a worker registers on the node its agent runs on, if a live agent
// lists it (common/identity_rules.h); checkpoints need the chief credential (or the job or admin
// token); RegisterDataset and ListDatasets a worker or chief credential or a token;
// SetAllocation, SetTailBackup, DeleteDataset and ResetDataset the admin token (common/auth.h,
// docs/security.md). `directory` may be null (no node rule: an embedder without agents).
#pragma once

#include "common/auth.h"
#include "common/identity_rules.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "sharding_service/sharding_api.h"

namespace pacer {

class GrpcShardingService final : public ShardingService::CallbackService {
 public:
  GrpcShardingService(ShardingApi* impl, const Authenticator* auth,
                      const WorkerDirectory* directory = nullptr)
      : impl_(impl), auth_(auth), directory_(directory) {}

#define PACER_SHARDING_RPC(Method, Request, Response)                                    \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx, const Request* req, \
                                   Response* resp) override;
  PACER_SHARDING_METHODS(PACER_SHARDING_RPC)
#undef PACER_SHARDING_RPC

 private:
  absl::Status CheckRegister(const Authenticator::Metadata& md, const RegisterWorkerRequest& req) const;

  ShardingApi* impl_;
  const Authenticator* auth_;
  const WorkerDirectory* directory_;
};

}  // namespace pacer
