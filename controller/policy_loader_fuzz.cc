// Fuzz target for the policy loader: any bytes must give either a config that passes
// ValidatePolicyConfig or an INVALID_ARGUMENT naming the file — never a crash, hang or throw.
//
// Built with -DPACER_FUZZ=ON under clang this is a libFuzzer binary. Otherwise main() below
// replays every file of the given corpus folders/files, then runs a bounded, seeded mutation
// loop over them (--mutations=N, --seed=S), so ctest exercises the target on any compiler.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "controller/policy_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pacer::PolicyConfig> config = pacer::ParsePolicy(text, "fuzz.yaml");
  if (config.ok()) {
    if (!pacer::ValidatePolicyConfig(*config).ok()) std::abort();
  } else {
    if (config.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (config.status().message().substr(0, 9) != "fuzz.yaml") std::abort();
  }
  return 0;
}

#ifndef PACER_LIBFUZZER
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One random edit: flip/insert/delete bytes, splice from another input, or insert a YAML token.
std::string Mutate(const std::string& in, const std::vector<std::string>& pool, std::mt19937_64& rng) {
  static const char* kTokens[] = {":", "- ", "\n", "  ", "{", "}", "[", "]", "&a ", "*a", "!!int ",
                                  "\"", "'", "#", "---\n", "? ", "|\n", ">\n", "1e309", "-1",
                                  "true", "null", "~", ".nan", "0x7fffffffffffffff", "\t", "%YAML 1.2\n"};
  std::string s = in;
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0:
        if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng() % 256);
        break;
      case 1:
        if (!s.empty() && pos < s.size()) s.erase(pos, 1 + rng() % 8);
        break;
      case 2:
        s.insert(pos, kTokens[rng() % (sizeof kTokens / sizeof *kTokens)]);
        break;
      case 3: {
        const std::string& other = pool[rng() % pool.size()];
        if (other.empty()) break;
        const size_t from = rng() % other.size();
        s.insert(pos, other.substr(from, 1 + rng() % 64));
        break;
      }
      case 4:
        s.insert(pos, std::string(1 + rng() % 3, static_cast<char>(rng() % 128)));
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 0;
  uint64_t seed = 1;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--mutations=", 0) == 0) { mutations = std::atol(arg.c_str() + 12); continue; }
    if (arg.rfind("--seed=", 0) == 0) { seed = std::strtoull(arg.c_str() + 7, nullptr, 10); continue; }
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::string> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg, ec))
        if (entry.is_regular_file()) files.push_back(entry.path().string());
      std::sort(files.begin(), files.end());  // deterministic order
      for (const auto& f : files) inputs.push_back(ReadAll(f));
    } else if (std::filesystem::is_regular_file(arg, ec)) {
      inputs.push_back(ReadAll(arg));
    } else {
      std::fprintf(stderr, "policy_loader_fuzz: no such file or folder: %s\n", arg.c_str());
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: policy_loader_fuzz [--mutations=N] [--seed=S] CORPUS_DIR_OR_FILE...\n");
    return 2;
  }
  for (const auto& in : inputs)
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  std::mt19937_64 rng(seed);
  for (long i = 0; i < mutations; ++i) {
    const std::string m = Mutate(inputs[rng() % inputs.size()], inputs, rng);
    if (getenv("PACER_FUZZ_TRACE")) {  // debugging aid: the input about to run
      std::ofstream("policy_loader_fuzz.last", std::ios::binary) << m;
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(m.data()), m.size());
  }
  std::printf("policy_loader_fuzz: %zu corpus inputs, %ld mutations, no failure\n", inputs.size(),
              mutations);
  return 0;
}
#endif  // PACER_LIBFUZZER
