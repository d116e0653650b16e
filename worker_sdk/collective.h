// Collective: the all-reduce backend interface of the worker SDK (docs/design.md §6), and the
// weighted gradient averaging that makes uneven per-worker batches correct.
//
// With local batches b_i and local mean gradients g_i, the full-batch mean gradient over all
// B = sum b_i samples is sum_i b_i g_i / B. WeightedAverage computes exactly that with one
// all-reduce of [b_i g_i..., b_i]. A worker with no data this step passes weight 0 and still
// takes part (every rank must call the same collectives in the same order); when the total
// weight is 0 no worker had data and the gradient is left at zero.
//
// Implementations: GlooCollective (CPU, gloo_collective.h) and NcclCollective (GPU,
// nccl_collective.h, built only with CUDA + NCCL). One collective per training thread: not
// thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace pacer {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place element-wise sum over every rank. UNAVAILABLE when a peer is gone or the
  // operation timed out (the job must re-rendezvous); never hangs past the timeout.
  virtual absl::Status AllReduceSum(std::span<float> data) = 0;
  virtual absl::Status Barrier() = 0;
};

// Replaces `grad` (this worker's mean gradient over `weight` samples) by the weighted mean
// over every rank; sets *total_weight to the sum of weights. `scratch` is reused between calls
// to avoid allocating per step. Weights are exact in float up to 2^24 samples per step.
absl::Status WeightedAverage(Collective& collective, std::span<float> grad, double weight,
                             double* total_weight, std::vector<float>* scratch);

}  // namespace pacer
