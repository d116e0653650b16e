#include "controller/policy_loader.h"

#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/policy_fields.h"

namespace pacer {
namespace {

// Walks the YAML tree against the field table, filling a PolicyConfig. The first error wins.
class PolicyParser {
 public:
  explicit PolicyParser(std::string_view file) : file_(file) {}

  absl::StatusOr<PolicyConfig> Parse(const YAML::Node& root) {
    if (!root.IsDefined() || root.IsNull())
      return Error(root.Mark(), "", "the file is empty; 'version' and 'policy' are required");
    if (!root.IsMap()) return Error(root.Mark(), "", "the top level must be a mapping of fields");
    if (absl::Status s = WalkMap(root, ""); !s.ok()) return s;
    for (const auto& field : PolicyFields()) {
      if (field.required && !marks_.contains(std::string(field.path)))
        return Error(root.Mark(), std::string(field.path), "is required");
    }
    PolicyConfigError err = FindPolicyConfigError(config_);
    if (!err.status.ok()) {
      auto it = marks_.find(err.path);
      return Located(it == marks_.end() ? root.Mark() : it->second,
                     std::string(err.status.message()));
    }
    return config_;
  }

  absl::Status Error(const YAML::Mark& mark, const std::string& path, const std::string& what) {
    if (path.empty()) return Located(mark, what);
    return Located(mark, absl::StrCat("field '", path, "': ", what));
  }

  absl::Status Located(const YAML::Mark& mark, const std::string& message) {
    if (mark.line < 0) return absl::InvalidArgumentError(absl::StrCat(file_, ": ", message));
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ":", mark.line + 1, ":", mark.column + 1, ": ", message));
  }

 private:
  absl::Status WalkMap(const YAML::Node& map, const std::string& path) {
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      // Copies (cheap, reference-counted): `it->` yields a temporary proxy, so references to
      // its members dangle at the end of the statement (ASan: stack-use-after-scope).
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) return Error(key.Mark(), path, "keys must be plain names");
      const std::string& name = key.Scalar();
      const std::string full = path.empty() ? name : absl::StrCat(path, ".", name);
      if (!seen.insert(name).second) return Error(key.Mark(), full, "appears twice");
      if (const PolicyField* field = FindPolicyField(full)) {
        marks_[full] = value.Mark();
        if (absl::Status s = ReadLeaf(*field, value, full); !s.ok()) return s;
      } else if (IsPolicySection(full)) {
        if (value.IsNull()) continue;  // an empty section keeps the defaults
        if (!value.IsMap()) return Error(value.Mark(), full, "must be a mapping (a section)");
        if (absl::Status s = WalkMap(value, full); !s.ok()) return s;
      } else {
        return Error(key.Mark(), full,
                     absl::StrCat("unknown field; known here: ",
                                  absl::StrJoin(PolicyKeysUnder(path), ", ")));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadLeaf(const PolicyField& field, const YAML::Node& value,
                        const std::string& full) {
    using T = PolicyField::Type;
    const std::string want = PolicyFieldTypeName(field.type);
    if (!value.IsScalar()) return Error(value.Mark(), full, absl::StrCat("must be ", want));
    // A quoted scalar ("0.1") has the non-specific tag "!": it is a string, not a number.
    const bool quoted = value.Tag() == "!";
    const std::string& text = value.Scalar();
    switch (field.type) {
      case T::kBool: {
        bool v = false;
        if (quoted || !YAML::convert<bool>::decode(value, v))
          return Error(value.Mark(), full, absl::StrCat("must be ", want, ", got '", text, "'"));
        *field.boolean(config_) = v;
        break;
      }
      case T::kInt: {
        long long v = 0;
        if (quoted || !YAML::convert<long long>::decode(value, v))
          return Error(value.Mark(), full, absl::StrCat("must be ", want, ", got '", text, "'"));
        *field.integer(config_) = static_cast<int64_t>(v);
        break;
      }
      case T::kDouble: {
        double v = 0;
        if (quoted || !YAML::convert<double>::decode(value, v))
          return Error(value.Mark(), full, absl::StrCat("must be ", want, ", got '", text, "'"));
        *field.real(config_) = v;
        break;
      }
      case T::kString:
      case T::kEnum:
        *field.str(config_) = text;
        break;
    }
    if (absl::Status s = CheckPolicyFieldRange(field, config_); !s.ok())
      return Located(value.Mark(), std::string(s.message()));
    return absl::OkStatus();
  }

  std::string file_;
  PolicyConfig config_;
  std::map<std::string, YAML::Mark> marks_;  // value position of every field seen
};

// Counts documents (at most two) and remembers where the second starts.
class DocumentCounter final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents == 2) second = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  int documents = 0;
  YAML::Mark second;
};

// Whether the text holds anything besides blanks and comments.
bool HasContent(const std::string& text) {
  bool in_comment = false;
  for (char c : text) {
    if (c == '\n') in_comment = false;
    else if (!in_comment && c == '#') in_comment = true;
    else if (!in_comment && c != ' ' && c != '\t' && c != '\r') return true;
  }
  return false;
}

}  // namespace

std::optional<std::pair<int, int>> SecondYamlDocument(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser events(in);
  DocumentCounter counter;
  while (counter.documents < 2 && events.HandleNextDocument(counter)) {
  }
  if (counter.documents < 2) return std::nullopt;
  return std::make_pair(counter.second.line + 1, counter.second.column + 1);
}

absl::StatusOr<PolicyConfig> ParsePolicy(std::string_view yaml_text,
                                         std::string_view file_name_view) {
  const std::string file_name(file_name_view);
  PolicyParser parser(file_name);
  if (yaml_text.size() > kMaxPolicyFileBytes)
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": larger than ", kMaxPolicyFileBytes, " bytes"));
  const std::string text(yaml_text);
  try {
    // YAML::Load reads the first document. (Not LoadAll: in yaml-cpp 0.7 it loops forever on
    // some malformed input such as a leading ',' — upstream PR #1319; found by our fuzzer.)
    YAML::Node root = YAML::Load(text);
    if ((!root.IsDefined() || root.IsNull()) && HasContent(text))
      return parser.Located(YAML::Mark(), "malformed YAML: no document could be read");
    // A second document ("---") is refused rather than silently ignored. Bounded to two
    // documents, so the LoadAll loop above cannot happen here.
    if (auto second = SecondYamlDocument(text)) {
      YAML::Mark at;
      at.line = second->first - 1;
      at.column = second->second - 1;
      return parser.Error(at, "", "only one YAML document is allowed");
    }
    return parser.Parse(root);
  } catch (const YAML::Exception& e) {
    return parser.Located(e.mark, absl::StrCat("malformed YAML: ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": cannot parse: ", e.what()));
  } catch (...) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": cannot parse"));
  }
}

absl::StatusOr<PolicyConfig> LoadPolicyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the policy file"));
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxPolicyFileBytes)
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": larger than ", kMaxPolicyFileBytes, " bytes"));
  }
  if (in.bad()) return absl::NotFoundError(absl::StrCat(path, ": cannot read the policy file"));
  return ParsePolicy(text, path);
}

}  // namespace pacer
