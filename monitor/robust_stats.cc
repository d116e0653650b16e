#include "monitor/robust_stats.h"

#include <algorithm>
#include <cmath>

namespace pacer {
namespace {

template <typename T>
T Median(std::vector<T>& v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  T upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  T lower = *std::max_element(v.begin(), v.begin() + mid);
  return (lower + upper) / 2;
}

}  // namespace

double MedianInPlace(std::vector<double>& values) { return Median(values); }
float MedianInPlace(std::vector<float>& values) { return Median(values); }

double CoefficientOfVariation(const std::vector<double>& values) {
  if (values.size() < 2) return 0;
  double mean = 0;
  for (double v : values) mean += v;
  mean /= static_cast<double>(values.size());
  if (mean == 0) return 0;
  double var = 0;
  for (double v : values) var += (v - mean) * (v - mean);
  var /= static_cast<double>(values.size() - 1);
  return std::sqrt(var) / std::abs(mean);
}

}  // namespace pacer
