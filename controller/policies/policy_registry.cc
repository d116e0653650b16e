#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/policies/policy.h"

namespace pacer {
namespace {

struct Entry {
  std::string_view name;
  DecideFn fn;
};

constexpr Entry kPolicies[] = {
    {"none", &DecideNone},
    {"non-dedicated", &DecideNonDedicated},
    {"dedicated", &DecideDedicated},
    {"backup-workers", &DecideBackupWorkers},
    {"lb-bsp", &DecideLbBsp},
    {"timeout-relaunch", &DecideTimeoutRelaunch},
};

}  // namespace

absl::StatusOr<DecideFn> FindPolicy(std::string_view name) {
  for (const auto& e : kPolicies)
    if (e.name == name) return e.fn;
  return absl::NotFoundError(
      absl::StrCat("unknown policy '", std::string(name), "'; known: ", absl::StrJoin(PolicyNames(), ", ")));
}

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const auto& e : kPolicies) names.emplace_back(e.name);
  return names;
}

}  // namespace pacer
