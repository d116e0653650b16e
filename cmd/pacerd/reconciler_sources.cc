#include "cmd/pacerd/reconciler_sources.h"

namespace pacer {

absl::Status MonitorSpeedSource::ListWorkers(ListWorkersResponse* out) {
  return monitor_->ListWorkers(ListWorkersRequest(), out);
}

absl::Status ShardingLeaseSource::ListDatasets(ListDatasetsResponse* out) {
  return CallAndWait(*sharding_, &ShardingServiceImpl::ListDatasets, ListDatasetsRequest(), out);
}

std::set<std::string> AgentRestartSource::RestartingWorkers() {
  std::set<std::string> out;
  for (const AgentView& agent : agents_->Agents()) {
    if (agent.lost) continue;
    for (const WorkerProcess& p : agent.workers) {
      if (p.state() == WORKER_STATE_BACKOFF || p.state() == WORKER_STATE_STOPPING) out.insert(p.worker_id());
    }
  }
  return out;
}

}  // namespace pacer
