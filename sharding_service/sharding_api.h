// ShardingApi: the sharding service's requests, as its callers make them.
//
// ShardingServiceImpl implements it. The gRPC adapter (grpc_sharding_service.h) serves whatever
// ShardingApi it is given: in pacerd that is the worker-session service
// (cmd/pacerd/worker_session_service.h), which answers heartbeats and registrations with the
// control plane's part added and forwards every other request unchanged.
//
// Every method answers `done` exactly once: when the update the request made is durable, or at
// once with the refusal. PACER_SHARDING_METHODS lists them, in the proto's order, for the
// classes that implement or forward all of them.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "proto/pacer/sharding.pb.h"

#define PACER_SHARDING_METHODS(X)                                          \
  X(RegisterDataset, RegisterDatasetRequest, RegisterDatasetResponse)      \
  X(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse)         \
  X(FetchShard, FetchShardRequest, FetchShardResponse)                     \
  X(ReportProgress, ProgressRequest, ProgressResponse)                     \
  X(CompleteShard, CompleteShardRequest, CompleteShardResponse)            \
  X(ReleaseShard, ReleaseShardRequest, ReleaseShardResponse)               \
  X(Heartbeat, HeartbeatRequest, HeartbeatResponse)                        \
  X(SaveCheckpoint, CheckpointRequest, CheckpointResponse)                 \
  X(RestoreCheckpoint, CheckpointRequest, CheckpointResponse)              \
  X(ListDatasets, ListDatasetsRequest, ListDatasetsResponse)               \
  X(SetAllocation, SetAllocationRequest, SetAllocationResponse)            \
  X(SetTailBackup, SetTailBackupRequest, SetTailBackupResponse)            \
  X(DeleteDataset, DeleteDatasetRequest, DeleteDatasetResponse)            \
  X(ResetDataset, ResetDatasetRequest, ResetDatasetResponse)

namespace pacer {

class ShardingApi {
 public:
  using Done = std::function<void(absl::Status)>;
  virtual ~ShardingApi() = default;

#define PACER_SHARDING_API_METHOD(Method, Request, Response) \
  virtual void Method(const Request& req, Response* resp, Done done) = 0;
  PACER_SHARDING_METHODS(PACER_SHARDING_API_METHOD)
#undef PACER_SHARDING_API_METHOD
};

}  // namespace pacer
