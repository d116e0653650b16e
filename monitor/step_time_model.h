// StepTimeModel: one worker's compute time per step as a function of its batch size,
//   compute_s(b) ~= fixed_s + per_sample_s * b,
// fitted online by exponentially weighted least squares (decayed sufficient statistics, so each
// report costs O(1) and memory is constant). The controller's batch planner uses Predict() to
// ask "how long would this worker take for b samples".
//
// Robustness: once fitted, an observation is winsorised to [pred/3, 3*pred] before it is
// added, so one absurd step cannot move the fit far while a real change of speed still moves
// it at the normal rate. While every report has (nearly) the same batch size, the slope is not
// identifiable: the model then goes through the origin (fixed_s = 0), which predicts the
// current batch exactly and scales proportionally.
//
// Thread-compatible value type.
#pragma once

#include <cstdint>

namespace pacer {

class StepTimeModel {
 public:
  struct Fit {
    double fixed_s = 0;
    double per_sample_s = 0;
    bool slope_identified = false;  // batch sizes varied enough to separate the two costs
    uint64_t observations = 0;
  };

  // `forgetting` in (0.5, 1]: the weight of past observations is multiplied by it per report.
  explicit StepTimeModel(double forgetting = 0.98) : forgetting_(forgetting) {}

  void Add(double batch, double compute_s);
  Fit Current() const;
  // Predicted compute seconds for `batch` samples; 0 before any observation.
  double Predict(double batch) const;

 private:
  double forgetting_;
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  uint64_t n_ = 0;
};

}  // namespace pacer
