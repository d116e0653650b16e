// SyntheticTask: a learnable, nonlinear classification data set generated from record ids.
//
// Record id r maps deterministically (seeded hash, no storage) to a label in [0, classes) and
// a feature vector drawn from one of `clusters_per_class` Gaussian clusters of that label. The
// cluster centres are drawn once from the seed. With two or more clusters per class the classes
// are not linearly separable (a mixture, like XOR), so a hidden layer is needed. Every worker
// generates the same sample for the same id, so the sharding service's record ids are the data.
// Held-out samples use ids from kEvalIdBase upward. Immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace pacer::examples {

struct TaskSpec {
  uint32_t dims = 16;
  uint32_t classes = 4;
  uint32_t clusters_per_class = 3;
  float center_scale = 1.5f;  // std of the cluster centres' coordinates
  float noise = 1.0f;         // std of a sample around its centre
  uint64_t seed = 7;
};

inline constexpr uint64_t kEvalIdBase = uint64_t{1} << 40;

class SyntheticTask {
 public:
  explicit SyntheticTask(TaskSpec spec);
  const TaskSpec& spec() const { return spec_; }
  // Writes spec().dims features to `x` and returns the label.
  uint32_t Sample(uint64_t record_id, float* x) const;

 private:
  TaskSpec spec_;
  std::vector<float> centers_;  // (classes * clusters_per_class) x dims
};

}  // namespace pacer::examples
