// pacerd's services as the Reconciler's sources (controller/sources.h), and the monitor's step
// reports to it: thin adapters, so the controller includes none of the services it steers.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "agent/agent_registry.h"
#include "controller/reconciler.h"
#include "controller/sources.h"
#include "controller/worker_sessions.h"
#include "monitor/monitor_service.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

class MonitorSpeedSource final : public SpeedSource {
 public:
  explicit MonitorSpeedSource(MonitorServiceImpl* monitor) : monitor_(monitor) {}
  absl::Status ListWorkers(ListWorkersResponse* out) override;
  void ForgetWorkerHistories() override { monitor_->ForgetWorkerHistories(); }

 private:
  MonitorServiceImpl* monitor_;
};

class ShardingLeaseSource final : public LeaseSource {
 public:
  explicit ShardingLeaseSource(ShardingServiceImpl* sharding) : sharding_(sharding) {}
  absl::Status ListDatasets(ListDatasetsResponse* out) override;
  LeaseFacts WorkerLeaseFacts() override { return sharding_->WorkerLeaseFacts(); }

 private:
  ShardingServiceImpl* sharding_;
};

// A worker is restarting when a live agent lists its process backing off or stopping.
class AgentRestartSource final : public RestartSource {
 public:
  explicit AgentRestartSource(const AgentRegistry* agents) : agents_(agents) {}
  std::set<std::string> RestartingWorkers() override;

 private:
  const AgentRegistry* agents_;
};

// The monitor's accepted step reports, to the reconciler's burst rule.
class StepsToReconciler final : public StepObserver {
 public:
  explicit StepsToReconciler(Reconciler* reconciler) : reconciler_(reconciler) {}
  void OnAcceptedSteps(const std::vector<StepReport>& steps) override {
    reconciler_->OnAcceptedSteps(steps);
  }

 private:
  Reconciler* reconciler_;
};

// The batch plans in force (WorkerSessions), as the rates the sharding service shares an
// epoch's end by (ShardingServiceImpl::SetFetchRatesSource): rebuilt only when the plans change.
class PlannedFetchRates {
 public:
  explicit PlannedFetchRates(const WorkerSessions* sessions) : sessions_(sessions) {}
  std::shared_ptr<const FetchRates> Get();

 private:
  const WorkerSessions* sessions_;
  absl::Mutex mu_;
  std::shared_ptr<const std::map<std::string, double>> seen_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const FetchRates> rates_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pacer
