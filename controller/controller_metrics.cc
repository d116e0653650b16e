#include "controller/controller_metrics.h"

#include "controller/action.h"

namespace pacer {
namespace {

constexpr const char* kKinds[] = {"ADJUST_BS", "REALLOCATE", "RESTART", "MIGRATE",
                                  "RESTART_SERVER", "RELIEVE_SERVER", "EXCLUDE_WORKERS"};
constexpr const char* kOutcomes[] = {"executed", "dry-run", "vetoed"};

}  // namespace

ControllerMetrics::ControllerMetrics(MetricsRegistry* r) : m_(r) {
  // Every (kind, outcome) pair exists from the start at 0, so increase() sees the first one.
  for (const char* kind : kKinds) {
    for (const char* outcome : kOutcomes) m_.actions.With({kind, outcome});
    m_.rollbacks.With({kind});
  }
  m_.actions.With({"POLICY", "policy"});
  m_.plan_version.Get();
  m_.predicted_gain.Get();
  m_.measured_gain.Get();
  m_.excluded_workers.Get();
  m_.exclusion_version.Get();
  m_.dry_run.Get();
  m_.run_generation.Get();
  m_.job_step.Get();
}

void ControllerMetrics::Publish(const Reconciler& reconciler, SpeedSource& speeds) {
  ListActionsRequest req;
  req.set_limit(kMaxAuditScanned);
  ListActionsResponse resp;
  reconciler.ListActions(req, &resp);  // newest first
  m_.plan_version.Get().Set(static_cast<double>(resp.plan_version()));
  m_.dry_run.Get().Set(resp.dry_run() ? 1 : 0);
  bool gain_set = false;
  std::map<uint64_t, int64_t> counted;
  std::map<uint64_t, bool> rolled_back;
  for (const ActionRecord& a : resp.actions()) {
    const int64_t occurrences = 1 + std::max<int64_t>(0, a.repeats());
    auto it = counted_.find(a.id());
    const int64_t before = it == counted_.end() ? 0 : it->second;
    if (occurrences > before) {
      m_.actions.With({a.kind(), a.outcome()}).Increment(static_cast<double>(occurrences - before));
    }
    counted[a.id()] = std::max(occurrences, before);
    auto rb = rolled_back_.find(a.id());
    const bool was_rolled_back = rb != rolled_back_.end() && rb->second;
    if (a.rolled_back() && !was_rolled_back) m_.rollbacks.With({a.kind()}).Increment();
    rolled_back[a.id()] = a.rolled_back() || was_rolled_back;
    if (!gain_set && a.outcome() == "executed" && a.measured()) {
      m_.predicted_gain.Get().Set(a.predicted_gain());
      m_.measured_gain.Get().Set(a.measured_gain());
      gain_set = true;
    }
  }
  counted_.swap(counted);  // only records still among the newest: bounded by kMaxAuditScanned
  rolled_back_.swap(rolled_back);

  const auto [generation, step] = reconciler.Run();
  m_.run_generation.Get().Set(static_cast<double>(generation));
  m_.job_step.Get().Set(static_cast<double>(step));
  const auto [exclusion_version, excluded] = reconciler.Exclusion();
  m_.exclusion_version.Get().Set(static_cast<double>(exclusion_version));
  m_.excluded_workers.Get().Set(static_cast<double>(excluded.size()));

  ListWorkersResponse workers;
  if (!speeds.ListWorkers(&workers).ok()) return;
  for (auto& [worker, in_plan] : planned_) in_plan = false;
  for (const WorkerStatus& w : workers.workers()) {
    const auto command = reconciler.PlanFor(w.id());
    if (!command || resp.plan_version() == 0) continue;
    m_.plan_batch.With({w.id()}).Set(static_cast<double>(command->samples()));
    planned_[w.id()] = true;
  }
  // A worker that left the plan: its planned batch reads 0.
  for (const auto& [worker, in_plan] : planned_) {
    if (!in_plan) m_.plan_batch.With({worker}).Set(0);
  }
}

}  // namespace pacer
