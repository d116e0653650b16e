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
  auto samples = std::make_shared<std::map<std::string, double>>();
  for (const auto& [id, cmd] : plans_) (*samples)[id] = static_cast<double>(cmd.samples());
  planned_samples_ = std::move(samples);
}

void WorkerSessions::WithdrawPlans() {
  absl::MutexLock l(&mu_);
  plans_.clear();
  planned_samples_ = std::make_shared<const std::map<std::string, double>>();
}

std::shared_ptr<const std::map<std::string, double>> WorkerSessions::PlannedSamples() const {
  absl::MutexLock l(&mu_);
  return planned_samples_;
}

void WorkerSessions::SetExclusion(uint64_t version, std::set<std::string> excluded,
                                  const std::string& reason) {
  absl::MutexLock l(&mu_);
  exclusion_reason_ = reason;
  exclusion_version_ = std::max(exclusion_version_, version);
  excluded_ = std::move(excluded);
}

void WorkerSessions::OnHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp, int64_t now_ms,
                                 bool hold_plan) {
  absl::MutexLock l(&mu_);
  Reported& r = reported_[req.worker_id()];
  r.honors_exclusion = req.honors_exclusion();
  r.max_local_batch = req.max_local_batch();
  // What the worker holds: nothing when it reports no version (a new process); the exclusion
  // in force when it reports its version (also after a pacerd restart, which sends nothing
  // again); else the command last sent to it, once it reports that version.
  auto sent = exclusion_sent_.find(req.worker_id());
  std::optional<bool> holds;
  if (req.exclusion_version() == 0) {
    holds = false;
  } else if (req.exclusion_version() >= exclusion_version_) {
    holds = excluded_.count(req.worker_id()) > 0;
  } else if (sent != exclusion_sent_.end() && !sent->second.empty() &&
             req.exclusion_version() >= sent->second.back().version) {
    holds = sent->second.back().excluded;
  }
  if (holds && *holds) holds_exclusion_.insert(req.worker_id());
  if (holds && !*holds) holds_exclusion_.erase(req.worker_id());
  if (req.honors_exclusion() && exclusion_version_ > req.exclusion_version()) {
    const bool excluded = excluded_.count(req.worker_id()) > 0;
    WorkerCommand* cmd = resp->add_commands();
    cmd->set_command_id(exclusion_version_);
    cmd->set_reason(exclusion_reason_);
    cmd->mutable_exclusion()->set_version(exclusion_version_);
    cmd->mutable_exclusion()->set_excluded(excluded);
    std::vector<SentExclusion>& list = exclusion_sent_[req.worker_id()];
    list.push_back({exclusion_version_, excluded, now_ms});
    if (list.size() > kSentKept) list.erase(list.begin());
  }
  if (hold_plan) return;
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

bool WorkerSessions::HoldsExclusion(const std::string& worker) const {
  absl::MutexLock l(&mu_);
  return holds_exclusion_.count(worker) > 0;
}

bool WorkerSessions::ProbeStep(const std::string& worker, int64_t start_ms) const {
  absl::MutexLock l(&mu_);
  auto sent = exclusion_sent_.find(worker);
  if (start_ms > 0 && sent != exclusion_sent_.end()) {
    for (auto it = sent->second.rbegin(); it != sent->second.rend(); ++it) {
      if (it->sent_ms <= start_ms) return it->excluded;
    }
    if (sent->second.size() < kSentKept) return false;  // began before the first command
  }
  return holds_exclusion_.count(worker) > 0;
}

std::pair<uint64_t, std::vector<std::string>> WorkerSessions::Exclusion() const {
  absl::MutexLock l(&mu_);
  return {exclusion_version_, std::vector<std::string>(excluded_.begin(), excluded_.end())};
}

}  // namespace pacer
