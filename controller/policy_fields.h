// The table of every field a policy file may hold: its YAML path, type, range and where it
// lives in PolicyConfig. The loader, ValidatePolicyConfig() and the schema test all read this
// one table, so the YAML format, the range checks and policies/policy.schema.json cannot drift
// apart silently (the schema test compares them field by field).
//
// Immutable after static initialisation; safe to read from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "controller/policy_config.h"

namespace pacer {

struct PolicyField {
  enum class Type { kBool, kInt, kDouble, kString, kEnum };
  std::string_view path;  // dotted YAML path, e.g. "safety.rollback.evaluate_after_s"
  Type type;
  double min = 0, max = 0;  // inclusive range for kInt/kDouble; length range for kString
  std::vector<std::string_view> choices;  // kEnum
  bool required = false;
  // Exactly one of these is set, matching `type` (kEnum and kString use `str`).
  bool* (*boolean)(PolicyConfig&) = nullptr;
  int64_t* (*integer)(PolicyConfig&) = nullptr;
  double* (*real)(PolicyConfig&) = nullptr;
  std::string* (*str)(PolicyConfig&) = nullptr;
};

// Every field, in file order.
const std::vector<PolicyField>& PolicyFields();

// The field with this dotted path, or nullptr.
const PolicyField* FindPolicyField(std::string_view path);

// Whether `path` is a section (a strict prefix of some field path, e.g. "safety.rollback").
bool IsPolicySection(std::string_view path);

// The keys allowed directly under section `path` ("" = top level), for error messages.
std::vector<std::string> PolicyKeysUnder(std::string_view path);

const char* PolicyFieldTypeName(PolicyField::Type type);

// Checks one field's current value in `config` against its range/choices.
// INVALID_ARGUMENT "field 'PATH': must be in [MIN, MAX], got V" on failure.
absl::Status CheckPolicyFieldRange(const PolicyField& field, PolicyConfig& config);

}  // namespace pacer
