#include "worker_sdk/collective.h"

#include <algorithm>

namespace pacer {

absl::Status WeightedAverage(Collective& collective, std::span<float> grad, double weight,
                             double* total_weight, std::vector<float>* scratch) {
  if (weight < 0) return absl::InvalidArgumentError("WeightedAverage: negative weight");
  scratch->resize(grad.size() + 1);
  const float w = static_cast<float>(weight);
  for (size_t i = 0; i < grad.size(); ++i) (*scratch)[i] = w == 0 ? 0.0f : grad[i] * w;
  scratch->back() = w;
  if (absl::Status s = collective.AllReduceSum(*scratch); !s.ok()) return s;
  const float total = scratch->back();
  *total_weight = total;
  if (total <= 0) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    return absl::OkStatus();
  }
  const float inv = 1.0f / total;
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = (*scratch)[i] * inv;
  return absl::OkStatus();
}

}  // namespace pacer
