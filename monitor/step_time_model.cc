#include "monitor/step_time_model.h"

#include <algorithm>
#include <cmath>

namespace pacer {
namespace {
constexpr uint64_t kWinsoriseAfter = 8;
constexpr double kWinsoriseFactor = 3.0;
constexpr double kMinRelativeSpread = 0.02;  // stddev(batch) / mean(batch) to fit a slope
}  // namespace

void StepTimeModel::Add(double batch, double compute_s) {
  if (!(batch > 0) || !(compute_s > 0) || !std::isfinite(batch) || !std::isfinite(compute_s)) return;
  if (n_ >= kWinsoriseAfter) {
    const double pred = Predict(batch);
    if (pred > 0) compute_s = std::clamp(compute_s, pred / kWinsoriseFactor, pred * kWinsoriseFactor);
  }
  w_ = w_ * forgetting_ + 1;
  sx_ = sx_ * forgetting_ + batch;
  sy_ = sy_ * forgetting_ + compute_s;
  sxx_ = sxx_ * forgetting_ + batch * batch;
  sxy_ = sxy_ * forgetting_ + batch * compute_s;
  ++n_;
}

StepTimeModel::Fit StepTimeModel::Current() const {
  Fit fit;
  fit.observations = n_;
  if (n_ == 0 || w_ <= 0) return fit;
  const double mx = sx_ / w_, my = sy_ / w_;
  const double var = std::max(0.0, sxx_ / w_ - mx * mx);
  const double cov = sxy_ / w_ - mx * my;
  if (n_ >= 3 && var > (kMinRelativeSpread * mx) * (kMinRelativeSpread * mx)) {
    const double slope = cov / var;
    const double intercept = my - slope * mx;
    if (slope > 0 && intercept >= 0) {
      fit.fixed_s = intercept;
      fit.per_sample_s = slope;
      fit.slope_identified = true;
      return fit;
    }
  }
  // Through the origin: least squares slope sxy / sxx.
  fit.per_sample_s = sxx_ > 0 ? sxy_ / sxx_ : 0;
  return fit;
}

double StepTimeModel::Predict(double batch) const {
  const Fit fit = Current();
  return fit.observations == 0 ? 0 : fit.fixed_s + fit.per_sample_s * batch;
}

}  // namespace pacer
