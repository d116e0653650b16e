// Loading policy files: YAML text → a validated PolicyConfig, or an error naming file, line and
// field.
//
// The format is the table in policy_fields.h (documented for operators by
// policies/policy.schema.json). The loader is strict: an unknown key, a duplicate key, a value
// of the wrong type (a quoted "0.1" where a number is expected counts), a value out of range,
// a missing required field (`version`, `policy`) or malformed YAML refuses the whole file.
// Messages look like
//   policies/x.yaml:12:5: field 'safety.min_gain': must be in [0, 10], got -1
// with 1-based line and column.
//
// Never throws: yaml-cpp exceptions (and any other) are caught at this boundary and returned
// as INVALID_ARGUMENT. Stateless and thread-safe.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "controller/policy_config.h"

namespace pacer {

// Largest policy file accepted.
inline constexpr size_t kMaxPolicyFileBytes = 1 << 20;

// Parses policy YAML. `file_name` is used only in messages.
absl::StatusOr<PolicyConfig> ParsePolicy(std::string_view yaml_text, std::string_view file_name);

// Where a second YAML document ("---") starts in `text`: 1-based {line, column}, or nullopt
// when there is at most one. Reads at most two documents (never yaml-cpp's LoadAll, which can
// loop forever on malformed input). May throw YAML::Exception on malformed input.
std::optional<std::pair<int, int>> SecondYamlDocument(const std::string& text);

// Reads and parses a file. NOT_FOUND when it cannot be opened; otherwise as ParsePolicy.
absl::StatusOr<PolicyConfig> LoadPolicyFile(const std::string& path);

}  // namespace pacer
