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

std::shared_ptr<const FetchRates> PlannedFetchRates::Get() {
  std::shared_ptr<const std::map<std::string, double>> now = sessions_->PlannedSamples();
  absl::MutexLock l(&mu_);
  if (now != seen_) {
    auto rates = std::make_shared<FetchRates>();
    for (const auto& [worker, samples] : *now) rates->Set(worker, samples);
    rates_ = rates->empty() ? nullptr : std::move(rates);
    seen_ = std::move(now);
  }
  return rates_;
}

}  // namespace pacer
