#include "sharding_service/grpc_sharding_service.h"

#include "common/status.h"

namespace pacer {

// One line per RPC: authenticate, delegate, finish when the impl is done.
#define PACER_SHARDING_HANDLER(Method, Request, Response, Role)                                 \
  grpc::ServerUnaryReactor* GrpcShardingService::Method(grpc::CallbackServerContext* ctx,       \
                                                        const Request* req, Response* resp) {   \
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();                                  \
    if (absl::Status s = auth_->Require(ctx->client_metadata(), Role); !s.ok()) {               \
      reactor->Finish(ToGrpcStatus(s));                                                         \
      return reactor;                                                                           \
    }                                                                                           \
    impl_->Method(*req, resp, [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); }); \
    return reactor;                                                                             \
  }

PACER_SHARDING_HANDLER(RegisterDataset, RegisterDatasetRequest, RegisterDatasetResponse, Role::kWorker)
PACER_SHARDING_HANDLER(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse, Role::kWorker)
PACER_SHARDING_HANDLER(FetchShard, FetchShardRequest, FetchShardResponse, Role::kWorker)
PACER_SHARDING_HANDLER(ReportProgress, ProgressRequest, ProgressResponse, Role::kWorker)
PACER_SHARDING_HANDLER(CompleteShard, CompleteShardRequest, CompleteShardResponse, Role::kWorker)
PACER_SHARDING_HANDLER(ReleaseShard, ReleaseShardRequest, ReleaseShardResponse, Role::kWorker)
PACER_SHARDING_HANDLER(Heartbeat, HeartbeatRequest, HeartbeatResponse, Role::kWorker)
PACER_SHARDING_HANDLER(SaveCheckpoint, CheckpointRequest, CheckpointResponse, Role::kWorker)
PACER_SHARDING_HANDLER(RestoreCheckpoint, CheckpointRequest, CheckpointResponse, Role::kWorker)
PACER_SHARDING_HANDLER(ListDatasets, ListDatasetsRequest, ListDatasetsResponse, Role::kWorker)
PACER_SHARDING_HANDLER(SetAllocation, SetAllocationRequest, SetAllocationResponse, Role::kAdmin)
PACER_SHARDING_HANDLER(SetTailBackup, SetTailBackupRequest, SetTailBackupResponse, Role::kAdmin)
PACER_SHARDING_HANDLER(DeleteDataset, DeleteDatasetRequest, DeleteDatasetResponse, Role::kAdmin)
PACER_SHARDING_HANDLER(ResetDataset, ResetDatasetRequest, ResetDatasetResponse, Role::kAdmin)

#undef PACER_SHARDING_HANDLER

}  // namespace pacer
