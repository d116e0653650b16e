#include "controller/policy_config.h"

#include "controller/policy_fields.h"

namespace pacer {

PolicyConfigError FindPolicyConfigError(const PolicyConfig& config) {
  PolicyConfig copy = config;  // the field accessors take a mutable config
  for (const auto& field : PolicyFields()) {
    absl::Status s = CheckPolicyFieldRange(field, copy);
    if (!s.ok()) return {std::string(field.path), s};
  }
  // Cross-field rules. Each names the field that has to change.
  if (config.detection.persistent_windows > config.detection.history_windows)
    return {"detection.persistent_windows",
            absl::InvalidArgumentError("field 'detection.persistent_windows': must not exceed "
                                       "detection.history_windows")};
  if (config.detection.leader_threshold <= config.detection.straggler_threshold)
    return {"detection.leader_threshold",
            absl::InvalidArgumentError("field 'detection.leader_threshold': must be above "
                                       "detection.straggler_threshold")};
  if (config.burst_exclusion.max_fraction > 0 && config.burst_exclusion.max_workers <= 0)
    return {"actions.burst_exclusion.max_fraction",
            absl::InvalidArgumentError("field 'actions.burst_exclusion.max_fraction': needs "
                                       "actions.burst_exclusion.max_workers above 0 (0 turns the "
                                       "rule off)")};
  if (config.burst_exclusion.step_factor > 0 &&
      config.burst_exclusion.step_factor <= 1)
    return {"actions.burst_exclusion.step_factor",
            absl::InvalidArgumentError("field 'actions.burst_exclusion.step_factor': must be 0 "
                                       "(off) or above 1 (a step slower than the median)")};
  if (config.burst_exclusion.step_factor > 0 &&
      config.burst_exclusion.rejoin_factor > config.burst_exclusion.step_factor)
    return {"actions.burst_exclusion.rejoin_factor",
            absl::InvalidArgumentError("field 'actions.burst_exclusion.rejoin_factor': must not "
                                       "exceed actions.burst_exclusion.step_factor")};
  return {};
}

absl::Status ValidatePolicyConfig(const PolicyConfig& config) {
  return FindPolicyConfigError(config).status;
}

}  // namespace pacer
