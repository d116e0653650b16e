#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/policies/policy.h"

namespace pacer {
namespace {

struct Entry {
  std::string_view name;
  DecideFn fn;
  PolicyTraits traits;
};

constexpr Entry kPolicies[] = {
    {"none", &DecideNone, {}},
    {"non-dedicated", &DecideNonDedicated,
     {.burst_rule = true, .step_statistics = true, .manages_exclusions = true}},
    {"dedicated", &DecideDedicated, {.step_statistics = true}},
    {"backup-workers", &DecideBackupWorkers, {.manages_exclusions = true}},
    {"lb-bsp", &DecideLbBsp, {}},
    {"timeout-relaunch", &DecideTimeoutRelaunch, {}},
};

}  // namespace

absl::StatusOr<DecideFn> FindPolicy(std::string_view name) {
  for (const auto& e : kPolicies)
    if (e.name == name) return e.fn;
  return absl::NotFoundError(
      absl::StrCat("unknown policy '", std::string(name), "'; known: ", absl::StrJoin(PolicyNames(), ", ")));
}

PolicyTraits TraitsOf(std::string_view name) {
  for (const auto& e : kPolicies)
    if (e.name == name) return e.traits;
  return {};
}

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const auto& e : kPolicies) names.emplace_back(e.name);
  return names;
}

}  // namespace pacer
