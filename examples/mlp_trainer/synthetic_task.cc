#include "examples/mlp_trainer/synthetic_task.h"

#include <cmath>

namespace pacer::examples {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Deterministic standard normal from two hashes (Box-Muller).
float Normal(uint64_t a, uint64_t b) {
  const double u1 = (static_cast<double>(SplitMix(a) >> 11) + 1.0) / 9007199254740993.0;
  const double u2 = static_cast<double>(SplitMix(b) >> 11) / 9007199254740992.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

SyntheticTask::SyntheticTask(TaskSpec spec) : spec_(spec) {
  const uint32_t n = spec_.classes * spec_.clusters_per_class;
  centers_.resize(static_cast<size_t>(n) * spec_.dims);
  for (size_t i = 0; i < centers_.size(); ++i) {
    centers_[i] = spec_.center_scale * Normal(spec_.seed * 1'000'003 + 2 * i, spec_.seed * 7 + 2 * i + 1);
  }
}

uint32_t SyntheticTask::Sample(uint64_t id, float* x) const {
  const uint64_t h = SplitMix(id ^ (spec_.seed << 32));
  const uint32_t label = static_cast<uint32_t>(h % spec_.classes);
  const uint32_t cluster = static_cast<uint32_t>((h / spec_.classes) % spec_.clusters_per_class);
  const float* c = &centers_[(static_cast<size_t>(label) * spec_.clusters_per_class + cluster) * spec_.dims];
  for (uint32_t j = 0; j < spec_.dims; ++j) {
    x[j] = c[j] + spec_.noise * Normal(h + 2 * j + 1, h ^ (0x5bd1e995ull * (j + 1)));
  }
  return label;
}

}  // namespace pacer::examples
