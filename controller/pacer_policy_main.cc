// pacer-policy: checks policy files the way pacerd loads them.
//
//   pacer-policy validate FILE...   exit 0 when every file loads; 1 and the error otherwise
//   pacer-policy list               the decision functions a file may name in `policy`
//
// pacerctl's `policy validate` calls the same ValidatePolicyFiles() below.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/version.h"
#include "controller/policies/policy.h"
#include "controller/policy_loader.h"

namespace {

constexpr char kUsage[] =
    "usage: pacer-policy validate FILE...   check policy files (exit 0 ok, 1 invalid)\n"
    "       pacer-policy list               list the policy names a file may use\n"
    "       pacer-policy --version          print the version\n";

int ValidatePolicyFiles(const std::vector<std::string>& files) {
  int rc = 0;
  for (const auto& file : files) {
    absl::StatusOr<pacer::PolicyConfig> config = pacer::LoadPolicyFile(file);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
      rc = 1;
      continue;
    }
    std::printf("%s: ok (name '%s', policy %s%s)\n", file.c_str(), config->name.c_str(),
                config->policy.c_str(), config->dry_run ? ", dry run" : "");
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc == 2 && !std::strcmp(argv[1], "--version")) {
    std::printf("pacer-policy %s\n", pacer::PacerVersion());
    return 0;
  }
  if (argc >= 3 && !std::strcmp(argv[1], "validate"))
    return ValidatePolicyFiles(std::vector<std::string>(argv + 2, argv + argc));
  if (argc == 2 && !std::strcmp(argv[1], "list")) {
    for (const auto& name : pacer::PolicyNames()) std::printf("%s\n", name.c_str());
    return 0;
  }
  std::fprintf(stderr, "pacer-policy: expected 'validate FILE...' or 'list' (see --help)\n");
  return 2;
}
