#include "sharding_service/grpc_sharding_service.h"

#include "common/reply_limit.h"

namespace pacer {

absl::Status GrpcShardingService::CheckRegister(const Authenticator::Metadata& md,
                                                const RegisterWorkerRequest& req) const {
  auto caller = auth_->Identify(md);
  if (!caller.ok()) return caller.status();
  RETURN_IF_ERROR(auth_->RequireWorker(md, req.worker_id(), "register worker"));
  return directory_ ? CheckNodeClaim(*caller, *directory_, req.worker_id(), req.node(), "register worker")
                    : absl::OkStatus();
}

// One line per RPC: authorize, delegate, finish when the impl is done. `Check` is evaluated with
// the call's metadata `md` and request `req` in scope and yields an absl::Status.
#define PACER_SHARDING_HANDLER(Method, Request, Response, Check)                                \
  grpc::ServerUnaryReactor* GrpcShardingService::Method(grpc::CallbackServerContext* ctx,       \
                                                        const Request* req, Response* resp) {   \
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();                                  \
    const auto& md = ctx->client_metadata();                                                    \
    if (absl::Status s = (Check); !s.ok()) {                                                    \
      reactor->Finish(ToGrpcStatus(s));                                                         \
      return reactor;                                                                           \
    }                                                                                           \
    impl_->Method(*req, resp, [reactor, resp](absl::Status s) {                                 \
      reactor->Finish(ReplyStatus(s, *resp, #Method));                                          \
    });                                                                                         \
    return reactor;                                                                             \
  }

#define PACER_WORKER_SIDE(what) auth_->RequireWorkerSide(md, what)
#define PACER_AS_WORKER(what) auth_->RequireWorker(md, req->worker_id(), what)

PACER_SHARDING_HANDLER(RegisterDataset, RegisterDatasetRequest, RegisterDatasetResponse, PACER_WORKER_SIDE("register dataset"))
PACER_SHARDING_HANDLER(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse, CheckRegister(md, *req))
PACER_SHARDING_HANDLER(FetchShard, FetchShardRequest, FetchShardResponse, PACER_AS_WORKER("fetch shard"))
PACER_SHARDING_HANDLER(ReportProgress, ProgressRequest, ProgressResponse, PACER_AS_WORKER("report progress"))
PACER_SHARDING_HANDLER(CompleteShard, CompleteShardRequest, CompleteShardResponse, PACER_AS_WORKER("complete shard"))
PACER_SHARDING_HANDLER(ReleaseShard, ReleaseShardRequest, ReleaseShardResponse, PACER_AS_WORKER("release shard"))
PACER_SHARDING_HANDLER(Heartbeat, HeartbeatRequest, HeartbeatResponse, PACER_AS_WORKER("heartbeat"))
PACER_SHARDING_HANDLER(SaveCheckpoint, CheckpointRequest, CheckpointResponse, auth_->RequireChief(md, "save checkpoint"))
PACER_SHARDING_HANDLER(RestoreCheckpoint, CheckpointRequest, CheckpointResponse, auth_->RequireChief(md, "restore checkpoint"))
PACER_SHARDING_HANDLER(ListDatasets, ListDatasetsRequest, ListDatasetsResponse, PACER_WORKER_SIDE("list datasets"))
PACER_SHARDING_HANDLER(SetAllocation, SetAllocationRequest, SetAllocationResponse, auth_->Require(md, Role::kAdmin))
PACER_SHARDING_HANDLER(SetTailBackup, SetTailBackupRequest, SetTailBackupResponse, auth_->Require(md, Role::kAdmin))
PACER_SHARDING_HANDLER(DeleteDataset, DeleteDatasetRequest, DeleteDatasetResponse, auth_->Require(md, Role::kAdmin))
PACER_SHARDING_HANDLER(ResetDataset, ResetDatasetRequest, ResetDatasetResponse, auth_->Require(md, Role::kAdmin))

#undef PACER_AS_WORKER
#undef PACER_WORKER_SIDE
#undef PACER_SHARDING_HANDLER

}  // namespace pacer
