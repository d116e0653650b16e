// Policy files: every shipped file loads; bad files are refused with file, line and field; the
// JSON Schema and the loader's field table agree.
#include "controller/policy_loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "controller/policies/policy.h"
#include "controller/policy_fields.h"

namespace pacer {
namespace {

const std::string kPolicies = std::string(PACER_SOURCE_DIR) + "/policies";

absl::Status Refusal(const std::string& yaml) {
  auto c = ParsePolicy(yaml, "bad.yaml");
  EXPECT_FALSE(c.ok()) << yaml;
  return c.status();
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(PolicyLoaderTest, EveryShippedPolicyFileLoads) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kPolicies)) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    auto c = LoadPolicyFile(entry.path().string());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(FindPolicy(c->policy).ok());
    EXPECT_TRUE(ValidatePolicyConfig(*c).ok());
  }
  EXPECT_GE(files, 6);
}

TEST(PolicyLoaderTest, PresetsSayWhatTheyAre) {
  auto nd = LoadPolicyFile(kPolicies + "/non-dedicated.yaml");
  ASSERT_TRUE(nd.ok()) << nd.status();
  EXPECT_EQ(nd->policy, "non-dedicated");
  EXPECT_TRUE(nd->adjust_batch.enabled);
  EXPECT_TRUE(nd->restart.enabled);
  EXPECT_FALSE(nd->dry_run);
  auto dd = LoadPolicyFile(kPolicies + "/dedicated.yaml");
  ASSERT_TRUE(dd.ok()) << dd.status();
  EXPECT_EQ(dd->policy, "dedicated");
  EXPECT_TRUE(dd->adjust_batch.accumulation);
  EXPECT_FALSE(dd->restart.enabled);
}

TEST(PolicyLoaderTest, MinimalFileGetsDefaults) {
  auto c = ParsePolicy("version: 1\npolicy: none\n", "min.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->safety.min_gain, PolicyConfig().safety.min_gain);
  EXPECT_EQ(c->name, "unnamed");
}

TEST(PolicyLoaderTest, UnknownKeyNamesFileLineAndField) {
  absl::Status s = Refusal("version: 1\npolicy: none\nsafety:\n  min_gian: 0.1\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s).rfind("bad.yaml:4:3: field 'safety.min_gian': unknown field", 0), 0u) << s;
  EXPECT_NE(Msg(s).find("min_gain"), std::string::npos);  // lists what is known there
  s = Refusal("version: 1\npolicy: none\nsaftey: {}\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:3:1: field 'saftey': unknown field", 0), 0u) << s;
}

TEST(PolicyLoaderTest, WrongTypeNamesFileLineAndField) {
  absl::Status s = Refusal("version: 1\npolicy: none\nactions:\n  restart:\n    enabled: maybe\n");
  EXPECT_EQ(Msg(s), "bad.yaml:5:14: field 'actions.restart.enabled': must be a boolean, got 'maybe'");
  s = Refusal("version: 1\npolicy: none\nsafety:\n  min_gain: \"0.1\"\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:4:13: field 'safety.min_gain': must be a number", 0), 0u) << s;
  s = Refusal("version: 1\npolicy: none\nsafety:\n  max_actions_per_window: 2.5\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:4:27: field 'safety.max_actions_per_window': must be an integer", 0), 0u) << s;
  s = Refusal("version: 1\npolicy: none\nsafety: 3\n");
  EXPECT_EQ(Msg(s), "bad.yaml:3:9: field 'safety': must be a mapping (a section)");
  s = Refusal("version: 1\npolicy: none\nsafety:\n  min_gain: [1, 2]\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:4:13: field 'safety.min_gain': must be a number", 0), 0u) << s;
}

TEST(PolicyLoaderTest, OutOfRangeNamesFileLineAndField) {
  absl::Status s = Refusal("version: 1\npolicy: none\nsafety:\n  min_gain: -1\n");
  EXPECT_EQ(Msg(s), "bad.yaml:4:13: field 'safety.min_gain': must be in [0, 10], got -1");
  s = Refusal("version: 2\npolicy: none\n");
  EXPECT_EQ(Msg(s), "bad.yaml:1:10: field 'version': must be in [1, 1], got 2");
  s = Refusal("version: 1\npolicy: fastest\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:2:9: field 'policy': must be one of none, non-dedicated", 0), 0u) << s;
  s = Refusal("version: 1\npolicy: none\nsafety:\n  cooldown_s: .nan\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:4:15: field 'safety.cooldown_s': must be in", 0), 0u) << s;
  // Cross-field rules point at the field to change.
  s = Refusal("version: 1\npolicy: none\ndetection:\n  persistent_windows: 6\n  history_windows: 5\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:4:23: field 'detection.persistent_windows'", 0), 0u) << s;
  // A share of the job's workers without a count to start from: the rule is off (max_workers 0).
  s = Refusal("version: 1\npolicy: non-dedicated\nactions:\n  burst_exclusion:\n    max_fraction: 0.1\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:5:19: field 'actions.burst_exclusion.max_fraction': needs", 0), 0u) << s;
  s = Refusal("version: 1\npolicy: non-dedicated\nactions:\n  burst_exclusion:\n    max_workers: 4\n    max_fraction: 1.5\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:6:19: field 'actions.burst_exclusion.max_fraction': must be in", 0), 0u) << s;
}

TEST(PolicyLoaderTest, MalformedYamlNamesFileAndLine) {
  absl::Status s = Refusal("version: 1\npolicy: [none\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:3:1: malformed YAML", 0), 0u) << s;
  s = Refusal("version: 1\n  policy: none\n");
  EXPECT_EQ(Msg(s).rfind("bad.yaml:2:", 0), 0u) << s;
  s = Refusal("");
  EXPECT_NE(Msg(s).find("empty"), std::string::npos);
  s = Refusal("- 1\n- 2\n");
  EXPECT_NE(Msg(s).find("top level must be a mapping"), std::string::npos);
  s = Refusal("version: 1\npolicy: none\n---\nversion: 1\n");
  EXPECT_NE(Msg(s).find("only one YAML document"), std::string::npos);
  s = Refusal("version: 1\nversion: 1\npolicy: none\n");
  EXPECT_EQ(Msg(s), "bad.yaml:2:1: field 'version': appears twice");
  s = Refusal("policy: none\n");
  EXPECT_EQ(Msg(s), "bad.yaml:1:1: field 'version': is required");
  s = Refusal(std::string(200, '[') + "\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(PolicyLoaderTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadPolicyFile("/nonexistent/p.yaml").status().code(), absl::StatusCode::kNotFound);
}

TEST(PolicyLoaderTest, ValidatorAgreesWithTheLoaderOnDefaults) {
  EXPECT_TRUE(ValidatePolicyConfig(PolicyConfig()).ok());
}

// Collects every leaf property of the schema as a dotted path.
void Leaves(const nlohmann::json& node, const std::string& prefix,
            std::map<std::string, nlohmann::json>& out) {
  for (auto& [key, value] : node.at("properties").items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.value("type", "") == "object") {
      EXPECT_EQ(value.value("additionalProperties", true), false) << path;
      Leaves(value, path, out);
    } else {
      out[path] = value;
    }
  }
}

TEST(PolicySchemaTest, SchemaAndFieldTableAgree) {
  std::ifstream in(kPolicies + "/policy.schema.json");
  ASSERT_TRUE(in.good());
  nlohmann::json schema = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(schema.is_discarded());
  EXPECT_EQ(schema.value("additionalProperties", true), false);
  std::map<std::string, nlohmann::json> leaves;
  Leaves(schema, "", leaves);
  std::set<std::string> table;
  for (const auto& f : PolicyFields()) {
    const std::string path(f.path);
    table.insert(path);
    ASSERT_TRUE(leaves.count(path)) << "schema lacks " << path;
    const nlohmann::json& s = leaves[path];
    using T = PolicyField::Type;
    switch (f.type) {
      case T::kBool: EXPECT_EQ(s["type"], "boolean") << path; break;
      case T::kInt:
        EXPECT_EQ(s["type"], "integer") << path;
        EXPECT_EQ(s["minimum"].get<double>(), f.min) << path;
        EXPECT_EQ(s["maximum"].get<double>(), f.max) << path;
        break;
      case T::kDouble:
        EXPECT_EQ(s["type"], "number") << path;
        EXPECT_EQ(s["minimum"].get<double>(), f.min) << path;
        EXPECT_EQ(s["maximum"].get<double>(), f.max) << path;
        break;
      case T::kString: EXPECT_EQ(s["type"], "string") << path; break;
      case T::kEnum: {
        std::vector<std::string> choices(f.choices.begin(), f.choices.end());
        EXPECT_EQ(s["enum"].get<std::vector<std::string>>(), choices) << path;
        EXPECT_EQ(choices, PolicyNames());
        break;
      }
    }
  }
  for (const auto& [path, _] : leaves) EXPECT_TRUE(table.count(path)) << "loader lacks " << path;
  std::set<std::string> required;
  for (const auto& r : schema["required"]) required.insert(r.get<std::string>());
  for (const auto& f : PolicyFields())
    EXPECT_EQ(required.count(std::string(f.path)) == 1, f.required) << f.path;
}

}  // namespace
}  // namespace pacer
