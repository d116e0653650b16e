// sharding_state_fuzz: structure-aware fuzzing of ShardingState, the pure core of pacerd's
// sharding service (docs/security.md, "Fuzzing"). An input is a StateFuzzInput
// (sharding_state_fuzz.proto): raw updates, dataset specs registered as the service does
// (NormalizeSpec, then Apply) and fetches decided as it does (DecideFetch, Commit),
// mutated by ProtoMutator. Checked:
//   - nothing crashes, whatever the update (ASan / UBSan in the libFuzzer build);
//   - an update the service decided after validation applies (tf.data's rule, docs/style.md:
//     "an update that passed validation cannot fail to apply");
//   - replaying the accepted updates on a fresh state rebuilds it byte for byte, and so does
//     its snapshot (what a pacerd restart relies on).
// With clang and -DPACER_FUZZ=ON a libFuzzer binary; otherwise main() replays the files given
// and runs --mutations=N seeded mutants of them (ctest sharding_state_fuzz_smoke).
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sharding_service/sharding_state.h"
#include "sharding_state_fuzz.pb.h"
#include "tests/fuzz/proto_mutator.h"

namespace pacer::fuzz {
namespace {

constexpr size_t kMaxInputBytes = 16 << 10;
constexpr int kMaxSteps = 64;

const StateFuzzInput* g_current = nullptr;

[[noreturn]] void Fail(const std::string& what) {
  std::string text;
  if (g_current) google::protobuf::TextFormat::PrintToString(*g_current, &text);
  if (text.size() > 64 << 10) text.resize(64 << 10);
  std::fprintf(stderr, "sharding_state_fuzz: FAILED: %s\n--- the input ---\n%s--- end ---\n", what.c_str(),
               text.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string Serialize(const ShardingState& st) {
  std::string s;
  google::protobuf::io::StringOutputStream out(&s);
  google::protobuf::io::CodedOutputStream coded(&out);
  coded.SetSerializationDeterministic(true);
  st.ToSnapshot().SerializeToCodedStream(&coded);
  coded.Trim();
  return s;
}

void Run(const StateFuzzInput& input) {
  g_current = &input;
  ShardingState st;
  std::vector<Update> log;
  int64_t now_ms = 1'700'000'000'000;
  auto apply = [&](Update u) {
    absl::StatusOr<ApplyEffects> effects = st.Commit(&u, now_ms);
    if (effects.ok()) log.push_back(std::move(u));
    return effects.status();
  };
  const int n = std::min(input.steps_size(), kMaxSteps);
  for (int i = 0; i < n; ++i) {
    const StateStep& step = input.steps(i);
    switch (step.step_case()) {
      case StateStep::kUpdate:
        (void)apply(step.update());
        break;
      case StateStep::kRegisterDataset: {
        auto spec = ShardingState::NormalizeSpec(step.register_dataset());
        if (!spec.ok() || st.FindDataset(spec->name()) != nullptr) break;
        Update u;
        *u.mutable_register_dataset()->mutable_spec() = *spec;
        if (absl::Status s = apply(u); !s.ok()) Fail("a spec NormalizeSpec accepted did not apply: " + s.ToString());
        break;
      }
      case StateStep::kFetch: {
        const StateFetch& f = step.fetch();
        auto decision = st.DecideFetch(f.worker(), f.dataset(), f.request_id());
        if (!decision.ok() || !decision->update) break;
        if (absl::Status s = apply(*decision->update); !s.ok()) {
          Fail("a lease DecideFetch decided did not apply: " + s.ToString());
        }
        break;
      }
      case StateStep::kAdvanceMs:
        now_ms += std::min<uint32_t>(step.advance_ms(), 600'000);
        break;
      default:
        break;
    }
  }
  if (std::getenv("PACER_FUZZ_VERBOSE")) {
    std::fprintf(stderr, "  %d steps, %zu updates applied, %zu datasets, %zu leases\n", n, log.size(),
                 st.datasets().size(), st.leases().size());
  }
  const std::string live = Serialize(st);
  ShardingState replayed;
  for (const Update& u : log) {
    if (absl::Status s = replayed.ApplyChecked(u); !s.ok()) Fail("replay refused update " + std::to_string(u.seq()) + ": " + s.ToString());
  }
  if (Serialize(replayed) != live) Fail("the replayed state differs from the live one");
  auto restored = ShardingState::FromSnapshot(st.ToSnapshot());
  if (!restored.ok()) Fail("the live state's snapshot does not load: " + restored.status().ToString());
  if (Serialize(*restored) != live) Fail("the snapshot's state differs from the live one");
  g_current = nullptr;
}

bool ParseInput(const uint8_t* data, size_t size, StateFuzzInput* input) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (text.substr(0, 1) == "#" || text.substr(0, 5) == "steps") {
    return google::protobuf::TextFormat::ParseFromString(std::string(text), input);
  }
  return input->ParseFromArray(data, static_cast<int>(size));
}

std::vector<std::string> Dictionary() {
  return {"w0", "w1", "w2", "ds0", "ds1", "s0", "f0", "a", "b", "c1", "part-0", "n0"};
}

}  // namespace
}  // namespace pacer::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // protobuf logs a line for every string of invalid UTF-8 it serializes.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel level, const char* file, int line,
                                     const std::string& message) {
    if (level >= google::protobuf::LOGLEVEL_FATAL) std::fprintf(stderr, "%s:%d %s\n", file, line, message.c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pacer::fuzz::StateFuzzInput input;
  if (!pacer::fuzz::ParseInput(data, size, &input)) return -1;
  pacer::fuzz::Run(input);
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  pacer::fuzz::StateFuzzInput input;
  if (!pacer::fuzz::ParseInput(data, size, &input)) input.Clear();
  pacer::fuzz::ProtoMutator mutator(seed);
  mutator.set_dictionary(pacer::fuzz::Dictionary());
  const size_t limit = std::min(max_size, pacer::fuzz::kMaxInputBytes);
  const int edits = 1 + static_cast<int>(mutator.rng()() % 3);
  for (int i = 0; i < edits; ++i) mutator.Mutate(&input, limit);
  std::string out;
  if (!input.SerializeToString(&out) || out.size() > max_size) return size;
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, size_t size1, const uint8_t* data2,
                                            size_t size2, uint8_t* out, size_t max_out_size,
                                            unsigned int seed) {
  pacer::fuzz::StateFuzzInput a, b;
  if (!pacer::fuzz::ParseInput(data1, size1, &a) || !pacer::fuzz::ParseInput(data2, size2, &b)) return 0;
  pacer::fuzz::ProtoMutator mutator(seed);
  mutator.CrossOver(b, &a, std::min(max_out_size, pacer::fuzz::kMaxInputBytes));
  std::string s;
  if (!a.SerializeToString(&s) || s.size() > max_out_size) return 0;
  std::memcpy(out, s.data(), s.size());
  return s.size();
}

#ifndef PACER_LIBFUZZER
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// sharding_state_fuzz [--mutations=N] [--seed=S] CORPUS_DIR_OR_FILE...
int main(int argc, char** argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  long mutations = 0;
  uint64_t seed = 1;
  std::vector<pacer::fuzz::StateFuzzInput> pool;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--mutations=", 0) == 0) { mutations = std::atol(arg.c_str() + 12); continue; }
    if (arg.rfind("--seed=", 0) == 0) { seed = std::strtoull(arg.c_str() + 7, nullptr, 10); continue; }
    std::vector<std::string> files;
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg, ec))
        if (entry.is_regular_file()) files.push_back(entry.path().string());
      std::sort(files.begin(), files.end());
    } else if (std::filesystem::is_regular_file(arg, ec)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "sharding_state_fuzz: no such file or folder: %s\n", arg.c_str());
      return 2;
    }
    for (const auto& f : files) {
      const std::string in = ReadAll(f);
      pacer::fuzz::StateFuzzInput parsed;
      if (!pacer::fuzz::ParseInput(reinterpret_cast<const uint8_t*>(in.data()), in.size(), &parsed)) {
        std::fprintf(stderr, "sharding_state_fuzz: %s does not parse as a StateFuzzInput\n", f.c_str());
        return 2;
      }
      pool.push_back(std::move(parsed));
    }
  }
  if (pool.empty()) {
    std::fprintf(stderr, "usage: sharding_state_fuzz [--mutations=N] [--seed=S] CORPUS_DIR_OR_FILE...\n");
    return 2;
  }
  const size_t corpus = pool.size();
  for (size_t i = 0; i < corpus; ++i) pacer::fuzz::Run(pool[i]);
  pacer::fuzz::ProtoMutator mutator(seed);
  mutator.set_dictionary(pacer::fuzz::Dictionary());
  for (long i = 0; i < mutations; ++i) {
    pacer::fuzz::StateFuzzInput m = pool[mutator.rng()() % pool.size()];
    if (mutator.rng()() % 8 == 0) mutator.CrossOver(pool[mutator.rng()() % pool.size()], &m, pacer::fuzz::kMaxInputBytes);
    const int edits = 1 + static_cast<int>(mutator.rng()() % 4);
    for (int e = 0; e < edits; ++e) mutator.Mutate(&m, pacer::fuzz::kMaxInputBytes);
    pacer::fuzz::Run(m);
    if (pool.size() < 4096 && mutator.rng()() % 4 == 0) pool.push_back(std::move(m));
  }
  std::printf("sharding_state_fuzz: %zu corpus inputs, %ld mutants, no failure\n", corpus, mutations);
  return 0;
}
#endif  // PACER_LIBFUZZER
