// An operator's delete and reset of a dataset (journal v5), and the spec-mismatch error that
// points to them: pure-state tests built from Update messages (docs/style.md §1, §8).
#include <gtest/gtest.h>

#include "sharding_service/sharding_state.h"
#include "tests/sharding/state_driver.h"

namespace pacer {
namespace {

using testing::StateDriver;

std::string Serialize(const ShardingState& st) { return st.ToSnapshot().SerializeAsString(); }

TEST(DatasetLifecycleTest, DeleteEndsItsLeasesDropsItsCheckpointPositionsAndFreesTheName) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 100, 10)).ok());
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("eval", 50, 10)).ok());
  d.AddWorker("w0");
  auto a = d.Fetch("w0", "train");
  auto e = d.Fetch("w0", "eval");
  ASSERT_TRUE(d.Progress(a->id, 4).ok());
  ASSERT_TRUE(d.Save("ck").ok());
  d.TakeCancelled();

  ASSERT_TRUE(d.DeleteDataset("train").ok());
  EXPECT_EQ(d.state().FindDataset("train"), nullptr);
  EXPECT_EQ(d.state().FindLease(a->id), nullptr);
  ASSERT_NE(d.state().FindLease(e->id), nullptr) << "another dataset's lease is untouched";
  // The holder is told (heartbeat cancelled_leases) and its reports are refused.
  auto cancelled = d.TakeCancelled();
  ASSERT_EQ(cancelled.size(), 1u);
  EXPECT_EQ(cancelled[0], std::make_pair(std::string("w0"), a->id));
  const EndedLease* ended = d.state().FindEnded("w0", a->id);
  ASSERT_NE(ended, nullptr);
  EXPECT_EQ(ended->reason(), LEASE_CANCELLED);
  EXPECT_EQ(d.state().CheckLease("w0", d.state().FindWorker("w0")->incarnation, a->id, a->token)
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.state().PlanFetch("w0", "train").status().code(), absl::StatusCode::kNotFound);

  // The name is free for any spec; the checkpoint no longer pins a position of it, so a
  // restore delivers the new dataset from its start and eval from its checkpoint.
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 400, 25)).ok());
  auto b = d.Fetch("w0", "train");
  EXPECT_EQ(b->begin, 0u);
  EXPECT_EQ(b->end, 25u);
  ASSERT_TRUE(d.Complete(b->id).ok());
  ASSERT_TRUE(d.Restore("ck").ok());
  EXPECT_EQ(d.state().FindDataset("train")->records_done_total, 0u);
  EXPECT_EQ(d.state().FindDataset("train")->next_epoch, 0u);
  EXPECT_EQ(d.state().FindDataset("eval")->open.size(), 1u);
}

TEST(DatasetLifecycleTest, ResetStartsOverAtEpochZeroWithTheSameSpec) {
  StateDriver d;
  auto spec = StateDriver::Records("train", 30, 10, 2);
  spec.set_max_attempts(1);
  spec.set_on_poison(POISON_FAIL);
  ASSERT_TRUE(d.AddDataset(spec).ok());
  d.AddWorker("w0");
  // Epoch 0 done; in epoch 1 a poison record fails the dataset while another lease is held.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(d.Complete(d.Fetch("w0", "train")->id).ok());
  auto p = d.Fetch("w0", "train");
  auto held = d.Fetch("w0", "train");  // [10, 20) of epoch 1
  ASSERT_TRUE(d.Save("ck").ok());
  ASSERT_TRUE(held.has_value());
  ASSERT_TRUE(d.End(held->id, LEASE_FAILED, 0).ok());
  ASSERT_TRUE(d.state().FindDataset("train")->failed);
  const auto spec_before = d.state().FindDataset("train")->spec;

  ASSERT_TRUE(d.ResetDataset("train").ok());
  const auto* ds = d.state().FindDataset("train");
  EXPECT_EQ(ds->spec, spec_before) << "the same spec, not a copy";
  EXPECT_FALSE(ds->failed);
  EXPECT_TRUE(ds->quarantined.empty());
  EXPECT_EQ(ds->records_done_total, 0u);
  EXPECT_EQ(ds->records_quarantined_total, 0u);
  EXPECT_EQ(ds->completed_epochs, 0u);
  EXPECT_EQ(ds->next_epoch, 0u);
  EXPECT_TRUE(ds->open.empty());
  EXPECT_EQ(d.state().FindLease(p->id), nullptr) << "its lease ended";
  // Two full epochs again, from position 0.
  uint64_t served = 0;
  for (;;) {
    FetchPlan::Kind kind;
    auto l = d.Fetch("w0", "train", &kind);
    if (!l) {
      EXPECT_EQ(kind, FetchPlan::kEndOfData);
      break;
    }
    if (served == 0) EXPECT_EQ(l->begin, 0u);
    served += l->end - l->begin;
    ASSERT_TRUE(d.Complete(l->id).ok());
  }
  EXPECT_EQ(served, 60u);
  // The checkpoint taken before the reset no longer holds a position of it.
  ASSERT_TRUE(d.Restore("ck").ok());
  EXPECT_EQ(d.state().FindDataset("train")->records_done_total, 0u);
  EXPECT_FALSE(d.state().FindDataset("train")->failed);
}

TEST(DatasetLifecycleTest, ResetOfAStreamReopensItsPartitionsAtTheirStartOffsets) {
  StateDriver d;
  DatasetSpec s;
  s.set_name("clicks");
  s.set_shard_size(5);
  s.mutable_stream()->add_partitions()->set_start_offset(100);
  ASSERT_TRUE(d.AddDataset(s).ok());
  d.AddWorker("w0");
  ASSERT_TRUE(d.Complete(d.Fetch("w0", "clicks")->id).ok());
  ASSERT_TRUE(d.ResetDataset("clicks").ok());
  auto l = d.Fetch("w0", "clicks");
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->begin, 100u);
}

TEST(DatasetLifecycleTest, UnknownDatasetsAreNotFoundWithTheNameAndChangeNothing) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 100, 10)).ok());
  const std::string before = Serialize(d.state());
  for (auto s : {d.DeleteDataset("nope"), d.ResetDataset("nope")}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_NE(s.message().find("'nope'"), std::string::npos) << s;
  }
  EXPECT_EQ(Serialize(d.state()), before);
}

TEST(DatasetLifecycleTest, DeleteAndResetReplayExactlyFromScratchAndFromSnapshots) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 100, 10)).ok());
  d.AddWorker("w0");
  d.AddWorker("w1");
  const size_t setup = d.log().size();
  std::vector<std::string> live{Serialize(d.state())};  // live[k]: after log[setup + k - 1]
  auto step = [&](absl::Status s) {
    ASSERT_TRUE(s.ok()) << s;
    live.push_back(Serialize(d.state()));
  };
  auto fetch = [&](const std::string& w) {
    auto l = d.Fetch(w, "train");
    live.push_back(Serialize(d.state()));
    return l;
  };
  auto a = fetch("w0");
  step(d.Progress(a->id, 3));
  step(d.Save("ck"));
  step(d.ResetDataset("train"));
  auto b = fetch("w1");
  step(d.Complete(b->id));
  step(d.DeleteDataset("train"));
  step(d.AddDataset(StateDriver::Records("train", 7, 3)));
  auto c = fetch("w0");
  step(d.Restore("ck"));
  const auto& log = d.log();
  ASSERT_EQ(log.size(), setup + live.size() - 1);
  ShardingState replay;
  for (size_t i = 0; i < log.size(); ++i) {
    ASSERT_TRUE(replay.ApplyChecked(log[i]).ok()) << i;
    if (i + 1 >= setup) EXPECT_EQ(Serialize(replay), live[i + 1 - setup]) << "after update " << i;
  }
  // From a snapshot at every point, plus the tail.
  for (size_t j = 0; j < live.size(); ++j) {
    ShardingSnapshot snap;
    ASSERT_TRUE(snap.ParseFromString(live[j]));
    auto st = ShardingState::FromSnapshot(snap);
    ASSERT_TRUE(st.ok()) << st.status();
    for (size_t i = setup + j; i < log.size(); ++i) ASSERT_TRUE(st->ApplyChecked(log[i]).ok());
    EXPECT_EQ(Serialize(*st), live.back()) << "from snapshot " << j;
  }
  (void)c;
}

TEST(DatasetLifecycleTest, ASpecMismatchNamesTheDifferingFieldsAndTheWayOut) {
  StateDriver d;
  auto spec = StateDriver::Records("train", 200000, 640);
  ASSERT_TRUE(d.AddDataset(spec).ok());
  auto other = StateDriver::Records("train", 400000, 1280);
  absl::Status s = d.AddDataset(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("num_records 200000 (registered) vs 400000 (requested)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("shard_size 640 vs 1280"), std::string::npos) << s;
  EXPECT_NE(s.message().find("pacerctl datasets delete train"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("seed"), std::string::npos) << "only fields that differ: " << s;

  // Sources and file lists.
  DatasetSpec files;
  files.set_name("train");
  auto* f = files.mutable_files()->add_files();
  f->set_path("a.rec");
  f->set_num_records(10);
  auto a = ShardingState::NormalizeSpec(spec);
  auto b = ShardingState::NormalizeSpec(files);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(DescribeSpecDifference(*a, *b).find("source num_records (registered) vs files"),
            std::string::npos)
      << DescribeSpecDifference(*a, *b);
  DatasetSpec files2 = *b;
  files2.mutable_files()->mutable_files(0)->set_path("b.rec");
  files2.set_shuffle(SHUFFLE_RECORDS);
  const std::string diff = DescribeSpecDifference(*b, files2);
  EXPECT_NE(diff.find("files[0] 'a.rec' (10 records) vs 'b.rec' (10)"), std::string::npos) << diff;
  EXPECT_NE(diff.find("shuffle SHUFFLE_NONE vs SHUFFLE_RECORDS"), std::string::npos) << diff;
  EXPECT_EQ(DescribeSpecDifference(*b, *b), "");
}

}  // namespace
}  // namespace pacer
