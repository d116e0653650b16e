// Mlp: a one-hidden-layer ReLU classifier with softmax cross-entropy, in plain C++.
//
// Parameters live in one flat float vector (so a collective can all-reduce the gradient in one
// call): W1 [hidden x dims], b1 [hidden], W2 [classes x hidden], b2 [classes]. Gradient() returns
// the *mean* gradient over a batch, the quantity the SDK's WeightedAverage expects. Not
// thread-safe (scratch buffers are members).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pacer::examples {

class Mlp {
 public:
  Mlp(uint32_t dims, uint32_t hidden, uint32_t classes, uint64_t seed);

  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  size_t num_params() const { return params_.size(); }

  // Mean gradient of the loss over `n` samples (features row-major n x dims) into `grad`
  // (resized); returns the mean loss.
  double Gradient(const float* x, const uint32_t* labels, size_t n, std::vector<float>* grad);
  uint32_t Predict(const float* x);
  void Step(std::span<const float> grad, float lr);

 private:
  // Forward pass for one sample: fills h_ (post-ReLU) and p_ (softmax).
  void Forward(const float* x);
  uint32_t d_, h_dim_, c_;
  std::vector<float> params_;
  std::vector<float> h_, p_;
  size_t w1_, b1_, w2_, b2_;  // offsets into params_
};

}  // namespace pacer::examples
