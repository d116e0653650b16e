// Hot reload of the monitor's detection settings (a policy applied at run time): new
// thresholds decide from the next window on; a change of window geometry or an invalid value
// is refused and nothing changes.
#include <gtest/gtest.h>

#include "tests/monitor/scenario_driver.h"

namespace pacer {
namespace {

using testing::ScenarioDriver;
using Kind = SyntheticTrace::SlowdownKind;

constexpr int64_t kWindow = 10'000;

SyntheticTraceOptions Cluster() {
  SyntheticTraceOptions o;
  o.workers = 16;
  o.workers_per_node = 4;
  o.seed = 11;
  return o;
}

TEST(DetectionReloadTest, NewThresholdTakesEffectFromTheNextWindow) {
  ScenarioDriver d(Cluster());
  d.RunForMs(6 * kWindow);
  // w5 at 1/1.25 = 0.8 of the median: below 0.85, a straggler.
  d.trace().AddSlowdown({Kind::kHardware, "w5", 1.25, d.now_ms()});
  ASSERT_GE(d.RunUntil([&] { return d.Class("w5") == WORKER_CLASS_STRAGGLER; }, 5), 0);

  // 0.7 leaves 0.8 normal (past the hysteresis band): w5 clears at the next window.
  MonitorOptions o = d.state().options();
  o.straggler_threshold = 0.7;
  ASSERT_TRUE(d.state().UpdateDetection(o).ok());
  EXPECT_DOUBLE_EQ(d.state().options().straggler_threshold, 0.7);
  EXPECT_EQ(d.RunUntil([&] { return d.Class("w5") == WORKER_CLASS_NORMAL; }, 5), 1)
      << "cleared at the first window closed under the new threshold";
  d.RunForMs(3 * kWindow);
  EXPECT_EQ(d.Class("w5"), WORKER_CLASS_NORMAL);

  // Back to 0.85: flagged again.
  o.straggler_threshold = 0.85;
  ASSERT_TRUE(d.state().UpdateDetection(o).ok());
  EXPECT_EQ(d.RunUntil([&] { return d.Class("w5") == WORKER_CLASS_STRAGGLER; }, 5), 1);
}

TEST(DetectionReloadTest, WindowChangeAndInvalidValuesAreRefusedAndChangeNothing) {
  ScenarioDriver d(Cluster());
  d.RunForMs(3 * kWindow);
  const MonitorOptions before = d.state().options();
  MonitorOptions o = before;
  o.window_ms = 2 * before.window_ms;
  o.straggler_threshold = 0.5;
  absl::Status s = d.state().UpdateDetection(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("restart"), std::string::npos) << s;
  EXPECT_DOUBLE_EQ(d.state().options().straggler_threshold, before.straggler_threshold);

  o = before;
  o.straggler_threshold = 1.5;  // above the leader threshold: not a valid band
  s = d.state().UpdateDetection(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_DOUBLE_EQ(d.state().options().straggler_threshold, before.straggler_threshold);

  o = before;
  o.persistent_k = o.persistent_w + 1;  // K of W with K > W
  s = d.state().UpdateDetection(o);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(d.state().options().persistent_k, before.persistent_k);
}

}  // namespace
}  // namespace pacer
