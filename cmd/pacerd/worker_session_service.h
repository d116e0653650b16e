// WorkerSessionService: pacerd's answer to every sharding request, and the one owner of a
// worker's heartbeat and registration replies.
//
// The gRPC adapter (sharding_service/grpc_sharding_service.h) serves this ShardingApi. Most
// requests go to the sharding service unchanged. Four are the job's, not only the data's:
//   Heartbeat       1. the sharding part, applied: reports counted, the lease part of the reply
//                      (cancelled leases, leases released because their fetch reply was lost,
//                      the lease deadline);
//                   2. the reconciler notes the worker's step -- a new run begins here, and the
//                      old plan is withdrawn before any command is assembled -- and the step
//                      timings the heartbeat carries go to the burst rule, which may decide now
//                      (Reconciler::OnHeartbeat); it says whether the worker's process is known
//                      to be of the current run (controller/run_tracker.h); the running step
//                      goes to the monitor too (MonitorServiceImpl::NoteRunningStep);
//                   3. the controller's commands from the worker's session
//                      (controller/worker_sessions.h): the batch plan (held back from a process
//                      not known to be of the run) and the exclusion it does not hold yet;
//                   4. the rendezvous store's regroup command, when the collective group
//                      re-formed under a generation the worker does not hold;
//                   then one reply, once step 1's updates are durable.
//   RegisterWorker  the sharding part, then the reconciler (a new process may begin a new run).
//   DeleteDataset,  the sharding part, then the act goes in the audit trail (`pacerctl actions`)
//   ResetDataset    and pacerd's log.
// Every command is re-sent until the worker's heartbeat says it holds its version, so a lost
// reply only delays it. Thread-safe, as each part it calls is.
#pragma once

#include "controller/reconciler.h"
#include "controller/worker_sessions.h"
#include "monitor/monitor_service.h"
#include "rendezvous/rendezvous_service.h"
#include "sharding_service/sharding_api.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

class WorkerSessionService final : public ShardingApi {
 public:
  // All must outlive this service; `monitor` may be null (running steps are not noted).
  WorkerSessionService(ShardingServiceImpl* sharding, Reconciler* reconciler,
                       WorkerSessions* sessions, RendezvousServiceImpl* rendezvous,
                       MonitorServiceImpl* monitor = nullptr)
      : sharding_(sharding),
        reconciler_(reconciler),
        sessions_(sessions),
        rendezvous_(rendezvous),
        monitor_(monitor) {}

  void Heartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp, Done done) override;
  void RegisterWorker(const RegisterWorkerRequest& req, RegisterWorkerResponse* resp,
                      Done done) override;
  void DeleteDataset(const DeleteDatasetRequest& req, DeleteDatasetResponse* resp,
                     Done done) override;
  void ResetDataset(const ResetDatasetRequest& req, ResetDatasetResponse* resp, Done done) override;

#define PACER_FORWARD_TO_SHARDING(Method, Request, Response)            \
  void Method(const Request& req, Response* resp, Done done) override { \
    sharding_->Method(req, resp, std::move(done));                      \
  }
  PACER_FORWARD_TO_SHARDING(RegisterDataset, RegisterDatasetRequest, RegisterDatasetResponse)
  PACER_FORWARD_TO_SHARDING(FetchShard, FetchShardRequest, FetchShardResponse)
  PACER_FORWARD_TO_SHARDING(ReportProgress, ProgressRequest, ProgressResponse)
  PACER_FORWARD_TO_SHARDING(CompleteShard, CompleteShardRequest, CompleteShardResponse)
  PACER_FORWARD_TO_SHARDING(ReleaseShard, ReleaseShardRequest, ReleaseShardResponse)
  PACER_FORWARD_TO_SHARDING(SaveCheckpoint, CheckpointRequest, CheckpointResponse)
  PACER_FORWARD_TO_SHARDING(RestoreCheckpoint, CheckpointRequest, CheckpointResponse)
  PACER_FORWARD_TO_SHARDING(ListDatasets, ListDatasetsRequest, ListDatasetsResponse)
  PACER_FORWARD_TO_SHARDING(SetAllocation, SetAllocationRequest, SetAllocationResponse)
  PACER_FORWARD_TO_SHARDING(SetTailBackup, SetTailBackupRequest, SetTailBackupResponse)
#undef PACER_FORWARD_TO_SHARDING

 private:
  // An operator act on the sharding state that was applied: logged and audited.
  void AuditOperatorAct(const std::string& what);

  ShardingServiceImpl* sharding_;
  Reconciler* reconciler_;
  WorkerSessions* sessions_;
  RendezvousServiceImpl* rendezvous_;
  MonitorServiceImpl* monitor_;
};

}  // namespace pacer
