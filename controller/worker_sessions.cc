#include "controller/worker_sessions.h"

#include <algorithm>

namespace pacer {

BatchPlanCommand PlanCommandFor(const BatchPlan& plan, const WorkerBatch& w) {
  BatchPlanCommand cmd;
  cmd.set_version(plan.version);
  cmd.set_effective_step(static_cast<uint64_t>(std::max<int64_t>(0, plan.effective_step)));
  cmd.set_micro_batch(static_cast<uint32_t>(w.micro_batch));
  cmd.set_accumulation_steps(static_cast<uint32_t>(std::max<int64_t>(1, w.accumulation)));
  cmd.set_global_batch(static_cast<uint64_t>(plan.global_batch));
  cmd.set_samples(static_cast<uint64_t>(w.samples));
  return cmd;
}

void WorkerSessions::SetPlan(const BatchPlan& plan, const std::string& reason) {
  absl::MutexLock l(&mu_);
  plan_reason_ = reason;
  for (const auto& w : plan.workers) plans_[w.worker_id] = PlanCommandFor(plan, w);
}

void WorkerSessions::WithdrawPlans() {
  absl::MutexLock l(&mu_);
  plans_.clear();
}

void WorkerSessions::SetExclusion(uint64_t version, std::set<std::string> excluded,
                                  const std::string& reason) {
  absl::MutexLock l(&mu_);
  exclusion_reason_ = reason;
  exclusion_version_ = std::max(exclusion_version_, version);
  excluded_ = std::move(excluded);
}

void WorkerSessions::OnHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp) {
  absl::MutexLock l(&mu_);
  Reported& r = reported_[req.worker_id()];
  r.honors_exclusion = req.honors_exclusion();
  r.max_local_batch = req.max_local_batch();
  if (req.honors_exclusion() && exclusion_version_ > req.exclusion_version()) {
    WorkerCommand* cmd = resp->add_commands();
    cmd->set_command_id(exclusion_version_);
    cmd->set_reason(exclusion_reason_);
    cmd->mutable_exclusion()->set_version(exclusion_version_);
    cmd->mutable_exclusion()->set_excluded(excluded_.count(req.worker_id()) > 0);
  }
  auto it = plans_.find(req.worker_id());
  if (it == plans_.end() || req.plan_version() >= it->second.version()) return;
  WorkerCommand* cmd = resp->add_commands();
  cmd->set_command_id(it->second.version());
  cmd->set_reason(plan_reason_);
  *cmd->mutable_batch_plan() = it->second;
}

std::map<std::string, WorkerSessions::Reported> WorkerSessions::Reports() const {
  absl::MutexLock l(&mu_);
  return reported_;
}

std::optional<BatchPlanCommand> WorkerSessions::PlanFor(const std::string& worker) const {
  absl::MutexLock l(&mu_);
  auto it = plans_.find(worker);
  if (it == plans_.end()) return std::nullopt;
  return it->second;
}

std::pair<uint64_t, std::vector<std::string>> WorkerSessions::Exclusion() const {
  absl::MutexLock l(&mu_);
  return {exclusion_version_, std::vector<std::string>(excluded_.begin(), excluded_.end())};
}

}  // namespace pacer
