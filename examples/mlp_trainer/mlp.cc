#include "examples/mlp_trainer/mlp.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace pacer::examples {

Mlp::Mlp(uint32_t dims, uint32_t hidden, uint32_t classes, uint64_t seed)
    : d_(dims), h_dim_(hidden), c_(classes), h_(hidden), p_(classes) {
  w1_ = 0;
  b1_ = w1_ + size_t{hidden} * dims;
  w2_ = b1_ + hidden;
  b2_ = w2_ + size_t{classes} * hidden;
  params_.assign(b2_ + classes, 0.0f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / static_cast<float>(dims)));
  std::normal_distribution<float> n2(0.0f, std::sqrt(1.0f / static_cast<float>(hidden)));
  for (size_t i = w1_; i < b1_; ++i) params_[i] = n1(rng);
  for (size_t i = w2_; i < b2_; ++i) params_[i] = n2(rng);
}

void Mlp::Forward(const float* x) {
  const float* w1 = &params_[w1_];
  const float* b1 = &params_[b1_];
  for (uint32_t i = 0; i < h_dim_; ++i) {
    float a = b1[i];
    for (uint32_t j = 0; j < d_; ++j) a += w1[i * d_ + j] * x[j];
    h_[i] = a > 0 ? a : 0;
  }
  const float* w2 = &params_[w2_];
  const float* b2 = &params_[b2_];
  float mx = -1e30f;
  for (uint32_t k = 0; k < c_; ++k) {
    float a = b2[k];
    for (uint32_t i = 0; i < h_dim_; ++i) a += w2[k * h_dim_ + i] * h_[i];
    p_[k] = a;
    mx = std::max(mx, a);
  }
  float sum = 0;
  for (uint32_t k = 0; k < c_; ++k) sum += (p_[k] = std::exp(p_[k] - mx));
  for (uint32_t k = 0; k < c_; ++k) p_[k] /= sum;
}

double Mlp::Gradient(const float* x, const uint32_t* labels, size_t n, std::vector<float>* grad) {
  grad->assign(params_.size(), 0.0f);
  if (n == 0) return 0;
  float* g = grad->data();
  std::vector<float> dh(h_dim_);
  double loss = 0;
  const float* w2 = &params_[w2_];
  for (size_t s = 0; s < n; ++s) {
    const float* xs = x + s * d_;
    Forward(xs);
    loss -= std::log(std::max(p_[labels[s]], 1e-12f));
    std::fill(dh.begin(), dh.end(), 0.0f);
    for (uint32_t k = 0; k < c_; ++k) {
      const float dz = p_[k] - (k == labels[s] ? 1.0f : 0.0f);
      g[b2_ + k] += dz;
      for (uint32_t i = 0; i < h_dim_; ++i) {
        g[w2_ + k * h_dim_ + i] += dz * h_[i];
        dh[i] += dz * w2[k * h_dim_ + i];
      }
    }
    for (uint32_t i = 0; i < h_dim_; ++i) {
      if (h_[i] <= 0) continue;
      g[b1_ + i] += dh[i];
      for (uint32_t j = 0; j < d_; ++j) g[w1_ + i * d_ + j] += dh[i] * xs[j];
    }
  }
  const float inv = 1.0f / static_cast<float>(n);
  for (float& v : *grad) v *= inv;
  return loss / static_cast<double>(n);
}

uint32_t Mlp::Predict(const float* x) {
  Forward(x);
  return static_cast<uint32_t>(std::max_element(p_.begin(), p_.end()) - p_.begin());
}

void Mlp::Step(std::span<const float> grad, float lr) {
  for (size_t i = 0; i < params_.size(); ++i) params_[i] -= lr * grad[i];
}

}  // namespace pacer::examples
