#include "sim/comparison.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "controller/policy_loader.h"

namespace pacer::sim {

std::vector<std::string> DefaultPolicies() {
  return {"none", "backup-workers", "lb-bsp", "timeout-relaunch", "non-dedicated", "dedicated"};
}

absl::StatusOr<PolicyChoice> ResolvePolicy(const std::string& spec, const std::string& policy_dir) {
  namespace fs = std::filesystem;
  std::string path = spec;
  std::string name = spec;
  const bool looks_like_file = absl::EndsWith(spec, ".yaml") || absl::EndsWith(spec, ".yml") ||
                               spec.find('/') != std::string::npos;
  if (!looks_like_file) {
    const fs::path preset = fs::path(policy_dir) / (spec + ".yaml");
    const fs::path baseline = fs::path(policy_dir) / ("baseline-" + spec + ".yaml");
    std::error_code ec;
    if (fs::exists(preset, ec)) path = preset.string();
    else if (fs::exists(baseline, ec)) path = baseline.string();
    else
      return absl::NotFoundError(absl::StrCat("policy '", spec, "': neither ", preset.string(),
                                              " nor ", baseline.string(), " exists (--policy-dir)"));
  } else {
    name = fs::path(spec).stem().string();
  }
  absl::StatusOr<PolicyConfig> cfg = LoadPolicyFile(path);
  if (!cfg.ok()) return cfg.status();
  return PolicyChoice{name, *cfg};
}

absl::StatusOr<Comparison> RunComparison(const Scenario& scenario,
                                         const std::vector<PolicyChoice>& policies, int threads) {
  const auto wall0 = std::chrono::steady_clock::now();
  Comparison c;
  c.scenario = &scenario;
  const SpeedModel model(scenario);
  // Without a limit, runs stop at 20 × the bound (a policy that never finishes is a result).
  const double nominal = static_cast<double>(scenario.job.total_samples) /
                         (scenario.speeds.median * static_cast<double>(scenario.job.workers));
  const double bound_limit = scenario.sim.max_sim_s > 0 ? scenario.sim.max_sim_s : 1000 * nominal + 3600;
  c.bound = ComputeBalancedBound(model, bound_limit);
  const double max_sim_s = scenario.sim.max_sim_s > 0
                               ? scenario.sim.max_sim_s
                               : (std::isfinite(c.bound.jct_s) ? 20 * c.bound.jct_s + 600 : bound_limit);
  std::vector<absl::StatusOr<PolicyRun>> results(policies.size(), absl::UnknownError("not run"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < policies.size();)
      results[i] = RunPolicy(model, policies[i].config, policies[i].name, max_sim_s);
  };
  std::vector<std::thread> pool;
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(policies.size())));
  for (int i = 1; i < n; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok())
      return absl::Status(results[i].status().code(),
                          absl::StrCat("policy ", policies[i].name, ": ", results[i].status().message()));
    c.model_events += results[i]->model_events;
    c.runs.push_back(std::move(*results[i]));
  }
  c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return c;
}

}  // namespace pacer::sim
