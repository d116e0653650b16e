#include "controller/policy_fields.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pacer {
namespace {

using T = PolicyField::Type;

// One line per field. The lambdas are captureless, so they convert to the accessor pointers.
#define PF_BOOL(p, member) \
  PolicyField { p, T::kBool, 0, 1, {}, false, [](PolicyConfig& c) { return &c.member; } }
#define PF_INT(p, member, lo, hi)                                                 \
  PolicyField {                                                                   \
    p, T::kInt, lo, hi, {}, false, nullptr, [](PolicyConfig& c) { return &c.member; } \
  }
#define PF_REAL(p, member, lo, hi)                                                          \
  PolicyField {                                                                             \
    p, T::kDouble, lo, hi, {}, false, nullptr, nullptr, [](PolicyConfig& c) { return &c.member; } \
  }
#define PF_STR(p, member, lo, hi)                                                    \
  PolicyField {                                                                      \
    p, T::kString, lo, hi, {}, false, nullptr, nullptr, nullptr,                     \
        [](PolicyConfig& c) { return &c.member; }                                    \
  }

std::vector<PolicyField> BuildFields() {
  std::vector<PolicyField> f = {
      PF_INT("version", version, 1, 1),
      PF_STR("name", name, 1, 128),
      PolicyField{"policy", T::kEnum, 0, 0,
                  {"none", "non-dedicated", "dedicated", "backup-workers", "lb-bsp",
                   "timeout-relaunch"},
                  true, nullptr, nullptr, nullptr, [](PolicyConfig& c) { return &c.policy; }},
      PF_BOOL("dry_run", dry_run),

      PF_REAL("detection.straggler_threshold", detection.straggler_threshold, 0.05, 1),
      PF_REAL("detection.leader_threshold", detection.leader_threshold, 1, 20),
      PF_REAL("detection.window_s", detection.window_s, 0.1, 3600),
      PF_INT("detection.persistent_windows", detection.persistent_windows, 1, 1000),
      PF_INT("detection.history_windows", detection.history_windows, 1, 1000),
      PF_REAL("detection.min_confidence", detection.min_confidence, 0, 1),
      PF_BOOL("detection.running_step_bound", detection.running_step_bound),

      PF_BOOL("actions.adjust_batch.enabled", adjust_batch.enabled),
      PF_BOOL("actions.adjust_batch.accumulation", adjust_batch.accumulation),
      PF_REAL("actions.adjust_batch.hysteresis", adjust_batch.hysteresis, 0, 1),
      PF_REAL("actions.adjust_batch.min_replan_gain", adjust_batch.min_replan_gain, 0, 10),
      PF_REAL("actions.adjust_batch.member_grace_s", adjust_batch.member_grace_s, 0, 86400),
      PF_INT("actions.adjust_batch.min_local_batch", adjust_batch.min_local_batch, 0, 1 << 20),
      PF_INT("actions.adjust_batch.lead_heartbeats", adjust_batch.lead_heartbeats, 1, 100),
      PF_INT("actions.adjust_batch.min_steps_ahead", adjust_batch.min_steps_ahead, 1, 1000000),
      PF_BOOL("actions.adjust_batch.use_last_window", adjust_batch.use_last_window),
      PF_REAL("actions.adjust_batch.speed_significance", adjust_batch.speed_significance, 0, 100),

      PF_BOOL("actions.reallocate.enabled", reallocate.enabled),
      PF_BOOL("actions.reallocate.tail_backups", reallocate.tail_backups),
      PF_REAL("actions.reallocate.tail_backup_progress", reallocate.tail_backup_progress, 0, 1),
      PF_REAL("actions.reallocate.hysteresis", reallocate.hysteresis, 0, 1),

      PF_BOOL("actions.restart.enabled", restart.enabled),
      PF_BOOL("actions.restart.migrate", restart.migrate),
      PF_REAL("actions.restart.margin", restart.margin, 0, 10),
      PF_REAL("actions.restart.migrate_cost_factor", restart.migrate_cost_factor, 1, 100),
      PF_INT("actions.restart.bad_node_threshold", restart.bad_node_threshold, 1, 1000),
      PF_REAL("actions.restart.bad_node_ttl_s", restart.bad_node_ttl_s, 0, 30 * 86400),
      PF_BOOL("actions.restart.restart_deterministic", restart.restart_deterministic),

      PF_BOOL("actions.server.enabled", server.enabled),
      PF_REAL("actions.server.hot_threshold", server.hot_threshold, 1, 100),
      PF_BOOL("actions.server.restart", server.restart),

      PF_INT("actions.backup_workers.count", backup_workers.count, 0, 1024),
      PF_INT("actions.burst_exclusion.max_workers", burst_exclusion.max_workers, 0, 1024),
      PF_REAL("actions.burst_exclusion.max_fraction", burst_exclusion.max_fraction, 0, 1),
      PF_REAL("actions.burst_exclusion.step_factor", burst_exclusion.step_factor, 0, 100),
      PF_REAL("actions.burst_exclusion.rejoin_factor", burst_exclusion.rejoin_factor, 1, 100),
      PF_REAL("actions.burst_exclusion.cooldown_s", burst_exclusion.cooldown_s, 0, 86400),
      PF_REAL("actions.timeout_relaunch.factor", timeout_relaunch.factor, 1, 1000),

      PF_REAL("safety.min_gain", safety.min_gain, 0, 10),
      PF_REAL("safety.cooldown_s", safety.cooldown_s, 0, 86400),
      PF_REAL("safety.adjust_batch_cooldown_s", safety.adjust_batch_cooldown_s, 0, 86400),
      PF_REAL("safety.window_s", safety.window_s, 1, 86400),
      PF_INT("safety.max_actions_per_window", safety.max_actions_per_window, 0, 100000),
      PF_INT("safety.max_restarts_per_window", safety.max_restarts_per_window, 0, 100000),
      PF_INT("safety.min_live_workers", safety.min_live_workers, 1, 1000000),
      PF_BOOL("safety.rollback.enabled", safety.rollback.enabled),
      PF_REAL("safety.rollback.evaluate_after_s", safety.rollback.evaluate_after_s, 0, 86400),
      PF_INT("safety.rollback.evaluate_after_steps", safety.rollback.evaluate_after_steps, 0,
             1000000),
      PF_REAL("safety.rollback.min_fraction_of_predicted",
              safety.rollback.min_fraction_of_predicted, 0, 1),

      PF_INT("audit.max_records", audit.max_records, 1, 1000000),
  };
  for (auto& field : f)
    if (field.path == "version") field.required = true;
  return f;
}

#undef PF_BOOL
#undef PF_INT
#undef PF_REAL
#undef PF_STR

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

}  // namespace

const std::vector<PolicyField>& PolicyFields() {
  static const std::vector<PolicyField>* fields = new std::vector<PolicyField>(BuildFields());
  return *fields;
}

const PolicyField* FindPolicyField(std::string_view path) {
  for (const auto& f : PolicyFields())
    if (f.path == path) return &f;
  return nullptr;
}

bool IsPolicySection(std::string_view path) {
  if (path.empty()) return true;
  for (const auto& f : PolicyFields())
    if (f.path.size() > path.size() && f.path.substr(0, path.size()) == path &&
        f.path[path.size()] == '.')
      return true;
  return false;
}

std::vector<std::string> PolicyKeysUnder(std::string_view path) {
  std::set<std::string> keys;
  const size_t skip = path.empty() ? 0 : path.size() + 1;
  for (const auto& f : PolicyFields()) {
    if (!path.empty() &&
        !(f.path.size() > path.size() && f.path.substr(0, path.size()) == path &&
          f.path[path.size()] == '.'))
      continue;
    std::string_view rest = f.path.substr(skip);
    keys.insert(std::string(rest.substr(0, rest.find('.'))));
  }
  return {keys.begin(), keys.end()};
}

const char* PolicyFieldTypeName(PolicyField::Type type) {
  switch (type) {
    case T::kBool: return "a boolean";
    case T::kInt: return "an integer";
    case T::kDouble: return "a number";
    case T::kString: return "a string";
    case T::kEnum: return "one of the listed names";
  }
  return "?";
}

absl::Status CheckPolicyFieldRange(const PolicyField& field, PolicyConfig& config) {
  auto out_of_range = [&](const std::string& got) {
    return absl::InvalidArgumentError(absl::StrCat("field '", std::string(field.path), "': must be in [",
                                                   FormatNumber(field.min), ", ",
                                                   FormatNumber(field.max), "], got ", got));
  };
  switch (field.type) {
    case T::kBool:
      return absl::OkStatus();
    case T::kInt: {
      const int64_t v = *field.integer(config);
      if (static_cast<double>(v) < field.min || static_cast<double>(v) > field.max)
        return out_of_range(absl::StrCat(v));
      return absl::OkStatus();
    }
    case T::kDouble: {
      const double v = *field.real(config);
      if (!std::isfinite(v) || v < field.min || v > field.max) return out_of_range(absl::StrCat(v));
      return absl::OkStatus();
    }
    case T::kString: {
      const std::string& v = *field.str(config);
      if (static_cast<double>(v.size()) < field.min || static_cast<double>(v.size()) > field.max)
        return absl::InvalidArgumentError(absl::StrCat("field '", std::string(field.path), "': length must be in [",
                                                       FormatNumber(field.min), ", ",
                                                       FormatNumber(field.max), "]"));
      return absl::OkStatus();
    }
    case T::kEnum: {
      const std::string& v = *field.str(config);
      for (auto c : field.choices)
        if (c == v) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("field '", std::string(field.path), "': must be one of ",
                                                     absl::StrJoin(std::vector<std::string>(field.choices.begin(), field.choices.end()), ", "), ", got '",
                                                     v, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pacer
