// Small robust statistics used by the monitor's estimators: medians and spread of short
// vectors. Pure functions; they reorder the scratch vector they are given.
#pragma once

#include <vector>

namespace pacer {

// Median of `values` (reorders them); 0 when empty. Even sizes average the two middle values.
double MedianInPlace(std::vector<double>& values);
float MedianInPlace(std::vector<float>& values);

// Coefficient of variation (stddev / mean) of `values`; 0 for fewer than two values or a zero
// mean.
double CoefficientOfVariation(const std::vector<double>& values);

}  // namespace pacer
