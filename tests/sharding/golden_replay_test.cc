// A data dir written by the v2 journal format (tests/sharding/golden/, made by
// make_v2_golden.cc with the last v2 code) still opens and replays to exactly the state v2 had:
// v2's CreateLeaseUpdates carry no outcome and are decided again by the kept v2 planner, so
// this test is what fails first if a planner change would alter an old journal's meaning.
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/clock.h"
#include "sharding_service/sharding_service.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

// Fields v3 added (absent in v2's state), and what v3 keeps that v2 dropped: cleared on both
// sides so that the comparison is of everything v2 had.
void ClearV3Fields(ShardingSnapshot& s) {
  for (auto& l : *s.mutable_leases()) {
    l.clear_incarnation();
    l.clear_request_id();
  }
  for (auto& w : *s.mutable_workers()) w.clear_recent_ended();  // v2 kept 8, v3 every one
  for (auto& cp : *s.mutable_checkpoints()) {
    for (auto& d : *cp.mutable_datasets()) {
      d.clear_records_done_total();
      d.clear_has_records_done_total();
    }
  }
}

TEST(GoldenReplayTest, V2DataDirReplaysToTheV2State) {
  const std::string golden = std::string(PACER_SOURCE_DIR) + "/tests/sharding/golden";
  testing::TempDir dir;
  const std::string data = dir.Sub("journal");
  std::filesystem::copy(golden + "/v2-journal", data);
  ShardingSnapshot expected;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      testing::ReadFileOrEmpty(golden + "/v2-state.txtpb"), &expected));
  ASSERT_GT(expected.seq(), 700u);

  SimulatedClock clock;
  ShardingServiceOptions o;
  o.data_dir = data;
  auto svc = ShardingServiceImpl::Open(o, &clock, nullptr);
  ASSERT_TRUE(svc.ok()) << svc.status();
  ShardingSnapshot got = (*svc)->SnapshotForTest();
  EXPECT_GT((*svc)->stats().recovered_updates, 100u) << "the golden dir must have a tail to replay";
  // The v3 view of v2 data: every remembered ended lease names its incarnation.
  for (const auto& w : got.workers()) {
    for (const auto& e : w.recent_ended()) EXPECT_NE(e.incarnation(), 0u);
  }
  ClearV3Fields(got);
  ClearV3Fields(expected);
  std::string want_text, got_text;
  google::protobuf::TextFormat::PrintToString(expected, &want_text);
  google::protobuf::TextFormat::PrintToString(got, &got_text);
  EXPECT_EQ(got_text, want_text);

  // After the upgrade the dir is v3 and keeps working: reopened, it holds the same state.
  const ShardingSnapshot live = (*svc)->SnapshotForTest();
  svc->reset();
  auto again = ShardingServiceImpl::Open(o, &clock, nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->SnapshotForTest().SerializeAsString(), live.SerializeAsString());
}

}  // namespace
}  // namespace pacer
