#include "cmd/pacerd/worker_session_service.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pacer {

void WorkerSessionService::Heartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp,
                                     Done done) {
  ShardingServiceImpl::Applied applied = sharding_->ApplyHeartbeat(req, resp);
  if (applied.ok()) {
    const bool in_run = reconciler_->OnHeartbeat(req);
    if (monitor_ != nullptr) {
      for (const HeartbeatStepTiming& t : req.step_timings())
        if (t.in_progress())
          monitor_->NoteRunningStep(req.worker_id(), t.samples(), t.compute_s(), t.samples_done(),
                                    t.done_compute_s());
    }
    sessions_->OnHeartbeat(req, resp, reconciler_->NowMs(), /*hold_plan=*/!in_run);
    if (req.honors_exclusion()) resp->set_step_line_s(reconciler_->StepLineS(req.worker_id()));
    rendezvous_->OnHeartbeat(req, resp);
  }
  sharding_->AnswerWhenDurable(std::move(applied), std::move(done));
}

void WorkerSessionService::RegisterWorker(const RegisterWorkerRequest& req,
                                          RegisterWorkerResponse* resp, Done done) {
  ShardingServiceImpl::Applied applied = sharding_->ApplyRegisterWorker(req, resp);
  if (applied.ok()) reconciler_->OnRegister(req);
  sharding_->AnswerWhenDurable(std::move(applied), std::move(done));
}

void WorkerSessionService::DeleteDataset(const DeleteDatasetRequest& req,
                                         DeleteDatasetResponse* resp, Done done) {
  ShardingServiceImpl::Applied applied = sharding_->ApplyDeleteDataset(req, resp);
  if (applied.ok()) {
    AuditOperatorAct(absl::StrCat("dataset '", req.dataset(), "' deleted (", resp->leases_ended(),
                                  " active leases ended, ", resp->records_done_dropped(),
                                  " records done dropped)"));
  }
  sharding_->AnswerWhenDurable(std::move(applied), std::move(done));
}

void WorkerSessionService::ResetDataset(const ResetDatasetRequest& req, ResetDatasetResponse* resp,
                                        Done done) {
  ShardingServiceImpl::Applied applied = sharding_->ApplyResetDataset(req, resp);
  if (applied.ok()) {
    AuditOperatorAct(absl::StrCat("dataset '", req.dataset(), "' reset to epoch 0 (",
                                  resp->leases_ended(), " active leases ended, ",
                                  resp->records_done_dropped(), " records done dropped)"));
  }
  sharding_->AnswerWhenDurable(std::move(applied), std::move(done));
}

void WorkerSessionService::AuditOperatorAct(const std::string& what) {
  PACER_LOG(WARNING) << "operator: " << what;
  reconciler_->RecordOperatorEvent(what);
}

}  // namespace pacer
