// StepTimeModel: recovers fixed + per-sample costs from varied batch sizes, falls back to a
// proportional model for a constant batch, resists outlier steps and follows real changes.
#include "monitor/step_time_model.h"

#include <gtest/gtest.h>

#include <random>

namespace pacer {
namespace {

TEST(StepTimeModelTest, RecoversFixedAndPerSampleCostFromVariedBatches) {
  StepTimeModel m(0.99);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  const uint32_t batches[] = {16, 32, 48, 64};
  for (int i = 0; i < 400; ++i) {
    const double b = batches[i % 4];
    m.Add(b, (0.3 + 0.02 * b) * noise(rng));
  }
  const auto fit = m.Current();
  EXPECT_TRUE(fit.slope_identified);
  EXPECT_NEAR(fit.fixed_s, 0.3, 0.06);
  EXPECT_NEAR(fit.per_sample_s, 0.02, 0.002);
  EXPECT_NEAR(m.Predict(100), 0.3 + 2.0, 0.15);
}

TEST(StepTimeModelTest, ConstantBatchGoesThroughTheOrigin) {
  StepTimeModel m;
  for (int i = 0; i < 50; ++i) m.Add(32, 1.0);
  const auto fit = m.Current();
  EXPECT_FALSE(fit.slope_identified);
  EXPECT_EQ(fit.fixed_s, 0);
  EXPECT_NEAR(m.Predict(32), 1.0, 1e-9);
  EXPECT_NEAR(m.Predict(16), 0.5, 1e-9);
}

TEST(StepTimeModelTest, OutlierStepIsWinsorisedButARealChangeIsFollowed) {
  StepTimeModel m(0.95);
  for (int i = 0; i < 100; ++i) m.Add(32, 1.0);
  m.Add(32, 1000.0);  // one absurd step: counted as at most 3x
  EXPECT_LT(m.Predict(32), 1.2);
  for (int i = 0; i < 200; ++i) m.Add(32, 2.0);  // the worker really slowed down
  EXPECT_NEAR(m.Predict(32), 2.0, 0.05);
}

TEST(StepTimeModelTest, EmptyModelPredictsZeroAndIgnoresGarbage) {
  StepTimeModel m;
  EXPECT_EQ(m.Predict(10), 0);
  m.Add(0, 1);
  m.Add(10, -1);
  m.Add(10, std::nan(""));
  EXPECT_EQ(m.Current().observations, 0u);
}

}  // namespace
}  // namespace pacer
