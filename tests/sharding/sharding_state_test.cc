// Pure-state tests of ShardingState, built from Update messages (no mocks, no I/O).
#include "sharding_service/sharding_state.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/sharding/state_driver.h"

namespace pacer {
namespace {

using testing::StateDriver;

uint64_t Done(const ShardingState& st, const std::string& ds) {
  const auto* d = st.FindDataset(ds);
  uint64_t done = 0;
  for (const auto& ep : d->open)
    for (const auto& dom : ep.partitions) done += dom.done;
  return done;
}

TEST(ShardingStateTest, LeasesCoverTheEpochInOrderThenEndOfData) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 95, 10)).ok());
  d.AddWorker("w0");
  uint64_t expected_begin = 0;
  while (true) {
    FetchPlan::Kind kind;
    auto lease = d.Fetch("w0", "train", &kind);
    if (!lease) {
      EXPECT_EQ(kind, FetchPlan::kEndOfData);
      break;
    }
    EXPECT_EQ(lease->begin, expected_begin);
    EXPECT_EQ(lease->end, std::min<uint64_t>(95, expected_begin + 10));
    expected_begin = lease->end;
    ASSERT_TRUE(d.Complete(lease->id).ok());
  }
  EXPECT_EQ(expected_begin, 95u);
  const auto* ds = d.state().FindDataset("train");
  EXPECT_TRUE(ds->Finished());
  EXPECT_EQ(ds->completed_epochs, 1u);
  EXPECT_EQ(ds->records_done_total, 95u);
}

TEST(ShardingStateTest, FailureRequeuesOnlyTheUnconsumedSuffixAtTheFront) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 100, 10)).ok());
  d.AddWorker("w0");
  d.AddWorker("w1");
  auto a = d.Fetch("w0", "train");  // [0,10)
  auto b = d.Fetch("w1", "train");  // [10,20)
  ASSERT_TRUE(d.Progress(a->id, 4).ok());
  ASSERT_TRUE(d.End(a->id, LEASE_EXPIRED, 4).ok());
  EXPECT_EQ(Done(d.state(), "train"), 4u);
  // The next fetch gets exactly the suffix [4,10) before any fresh record.
  auto c = d.Fetch("w1", "train");
  EXPECT_EQ(c->begin, 4u);
  EXPECT_EQ(c->end, 10u);
  auto e = d.Fetch("w1", "train");
  EXPECT_EQ(e->begin, 20u);
  (void)b;
}

TEST(ShardingStateTest, StaleTokensAndOldIncarnationsAreRefused) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 100, 10)).ok());
  const uint64_t inc = d.AddWorker("w0");
  auto a = d.Fetch("w0", "train");
  EXPECT_TRUE(d.state().CheckLease("w0", inc, a->id, a->token).ok());
  EXPECT_EQ(d.state().CheckLease("w0", inc, a->id, a->token + 1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.state().CheckLease("w0", inc + 7, a->id, a->token).code(),
            absl::StatusCode::kFailedPrecondition);
  // The worker restarts: the old incarnation's lease ends (suffix requeued), its reports are stale.
  const uint64_t inc2 = d.AddWorker("w0");
  EXPECT_NE(inc, inc2);
  EXPECT_EQ(d.state().CheckLease("w0", inc, a->id, a->token).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.state().CheckLease("w0", inc2, a->id, a->token).code(),
            absl::StatusCode::kFailedPrecondition);
  const auto& ended = d.state().FindWorker("w0")->ended;
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended.rbegin()->second.lease_id(), a->id);
  EXPECT_EQ(ended.rbegin()->second.reason(), LEASE_WORKER_LOST);
  EXPECT_EQ(ended.rbegin()->second.incarnation(), inc);
  EXPECT_EQ(d.state().CheckLease("w9", 1, a->id, a->token).code(), absl::StatusCode::kNotFound);
}

TEST(ShardingStateTest, ProgressOnlyGrowsAndIsBounded) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 100, 10)).ok());
  d.AddWorker("w0");
  auto a = d.Fetch("w0", "train");
  ASSERT_TRUE(d.Progress(a->id, 6).ok());
  ASSERT_TRUE(d.Progress(a->id, 3).ok());  // a late retry: no change
  EXPECT_EQ(d.state().FindLease(a->id)->done, 6u);
  EXPECT_EQ(Done(d.state(), "train"), 6u);
  EXPECT_EQ(d.Progress(a->id, 11).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Progress(999, 1).code(), absl::StatusCode::kNotFound);
}

TEST(ShardingStateTest, EpochsOpenInTurnAndTheBarrierHoldsTheNextOne) {
  for (bool barrier : {false, true}) {
    StateDriver d;
    auto spec = StateDriver::Records("train", 20, 10, /*epochs=*/3);
    spec.set_epoch_barrier(barrier);
    ASSERT_TRUE(d.AddDataset(spec).ok());
    d.AddWorker("w0");
    d.AddWorker("w1");
    auto a = d.Fetch("w0", "train");  // e0 [0,10)
    // w1 trains the rest of epoch 0, [10,20), in leases that shrink near its end.
    FetchPlan::Kind kind;
    auto c = d.Fetch("w1", "train", &kind);
    while (c && c->epoch == 0) {
      ASSERT_TRUE(d.Complete(c->id).ok());
      c = d.Fetch("w1", "train", &kind);
    }
    if (barrier) {  // a holds epoch 0 open
      EXPECT_FALSE(c.has_value());
      EXPECT_EQ(kind, FetchPlan::kWait);
      ASSERT_TRUE(d.Complete(a->id).ok());
      c = d.Fetch("w1", "train");
    }
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->epoch, 1u);
  }
}

TEST(ShardingStateTest, PerWorkerShardSizeSplitsOnFetch) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 1000, 100)).ok());
  d.AddWorker("slow");
  d.AddWorker("fast");
  ASSERT_TRUE(d.SetAllocation("slow", 0.25, 0).ok());
  auto a = d.Fetch("slow", "train");
  EXPECT_EQ(a->end - a->begin, 25u);
  auto b = d.Fetch("fast", "train");
  EXPECT_EQ(b->end - b->begin, 100u);
  // A requeued range is split by the fetcher's size too.
  ASSERT_TRUE(d.End(b->id, LEASE_RELEASED, 0).ok());
  auto c = d.Fetch("slow", "train");
  EXPECT_EQ(c->begin, b->begin);
  EXPECT_EQ(c->end, b->begin + 25);
  ASSERT_TRUE(d.SetAllocation("slow", 0, 7).ok());
  auto e = d.Fetch("slow", "train");
  EXPECT_EQ(e->begin, b->begin + 25);
  EXPECT_EQ(e->end - e->begin, 7u);
  EXPECT_EQ(d.SetAllocation("nobody", 1, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.SetAllocation("slow", -1, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardingStateTest, QuotaLimitsConcurrentLeases) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 1000, 10)).ok());
  d.AddWorker("w0");
  ASSERT_TRUE(d.SetAllocation("w0", 1, 0, /*max_leases=*/2).ok());
  EXPECT_TRUE(d.Fetch("w0", "train").has_value());
  EXPECT_TRUE(d.Fetch("w0", "train").has_value());
  FetchPlan::Kind kind;
  EXPECT_FALSE(d.Fetch("w0", "train", &kind).has_value());
  EXPECT_EQ(kind, FetchPlan::kWait);
}

TEST(ShardingStateTest, TailBackupFirstCompletionWinsAndCountsOnce) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 20, 10)).ok());
  ASSERT_TRUE(d.SetTailBackup("train", true).ok());
  d.AddWorker("slow");
  d.AddWorker("fast");
  auto s = d.Fetch("slow", "train");  // [0,10)
  ASSERT_TRUE(d.Progress(s->id, 3).ok());
  // fast trains [10,20) (in leases that shrink near the epoch's end); then, with nothing
  // fresh, it gets a backup of slow's suffix.
  auto backup = d.Fetch("fast", "train");
  while (backup && !backup->backup) {
    ASSERT_TRUE(d.Complete(backup->id).ok());
    backup = d.Fetch("fast", "train");
  }
  ASSERT_TRUE(backup.has_value());
  EXPECT_TRUE(backup->backup);
  EXPECT_EQ(backup->begin, 3u);
  EXPECT_EQ(backup->end, 10u);
  ASSERT_TRUE(d.Progress(backup->id, 5).ok());  // positions [3,8) done
  ASSERT_TRUE(d.Progress(s->id, 6).ok());       // slow catches up to 6: nothing new counted
  EXPECT_EQ(Done(d.state(), "train"), 8u + 10u);
  ASSERT_TRUE(d.Complete(backup->id).ok());
  // The slow copy is fenced off; the epoch is done with every record counted once.
  EXPECT_EQ(d.state().FindLease(s->id), nullptr);
  const auto* ds = d.state().FindDataset("train");
  EXPECT_EQ(ds->completed_epochs, 1u);
  EXPECT_EQ(ds->records_done_total, 20u);
  auto cancelled = d.TakeCancelled();
  ASSERT_EQ(cancelled.size(), 1u);
  EXPECT_EQ(cancelled[0].first, "slow");
  EXPECT_EQ(cancelled[0].second, s->id);
}

TEST(ShardingStateTest, TailBackupSurvivorDoesNotRecountAfterPartnerDies) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 10, 10)).ok());
  ASSERT_TRUE(d.SetTailBackup("train", true).ok());
  d.AddWorker("slow");
  auto s = d.Fetch("slow", "train");  // the whole epoch: slow is the only worker yet
  d.AddWorker("fast");
  auto b = d.Fetch("fast", "train");
  ASSERT_TRUE(b->backup);
  ASSERT_TRUE(d.Progress(b->id, 8).ok());
  ASSERT_TRUE(d.End(b->id, LEASE_EXPIRED, 8).ok());  // the backup dies ahead of the primary
  EXPECT_EQ(d.state().FindLease(s->id)->done, 8u);   // the survivor skips what was counted
  ASSERT_TRUE(d.Progress(s->id, 9).ok());
  ASSERT_TRUE(d.Complete(s->id).ok());
  EXPECT_EQ(d.state().FindDataset("train")->records_done_total, 10u);
  EXPECT_EQ(d.state().FindDataset("train")->completed_epochs, 1u);
}

TEST(ShardingStateTest, PoisonRangeIsQuarantinedAfterMaxAttempts) {
  for (auto action : {POISON_CONTINUE, POISON_FAIL}) {
    StateDriver d;
    auto spec = StateDriver::Records("train", 30, 10);
    spec.set_max_attempts(3);
    spec.set_batch_size(2);
    spec.set_on_poison(action);
    ASSERT_TRUE(d.AddDataset(spec).ok());
    d.AddWorker("w0");
    auto a = d.Fetch("w0", "train");  // [0,10)
    ASSERT_TRUE(d.Progress(a->id, 4).ok());
    ASSERT_TRUE(d.End(a->id, LEASE_FAILED, 4, "decode error").ok());  // attempt 1 at 4
    auto b = d.Fetch("w0", "train");
    ASSERT_EQ(b->begin, 4u);
    ASSERT_TRUE(d.End(b->id, LEASE_EXPIRED, 0).ok());  // attempt 2 at 4 (worker went silent)
    auto c = d.Fetch("w0", "train");
    ASSERT_EQ(c->begin, 4u);
    ASSERT_TRUE(d.End(c->id, LEASE_FAILED, 0, "decode error").ok());  // attempt 3: quarantine
    const auto* ds = d.state().FindDataset("train");
    ASSERT_EQ(ds->quarantined.size(), 1u);
    EXPECT_EQ(ds->quarantined[0].begin(), 4u);
    EXPECT_EQ(ds->quarantined[0].end(), 6u);  // one batch
    EXPECT_EQ(ds->quarantined[0].attempts(), 3u);
    if (action == POISON_FAIL) {
      EXPECT_TRUE(ds->failed);
      EXPECT_EQ(d.state().PlanFetch("w0", "train").status().code(),
                absl::StatusCode::kFailedPrecondition);
      continue;
    }
    // The rest is delivered; the epoch ends with done + quarantined == all records.
    std::vector<uint64_t> begins;
    while (auto l = d.Fetch("w0", "train")) {
      begins.push_back(l->begin);
      ASSERT_TRUE(d.Complete(l->id).ok());
    }
    EXPECT_EQ(begins.front(), 6u);
    EXPECT_EQ(ds->records_done_total, 28u);
    EXPECT_EQ(ds->completed_epochs, 1u);
  }
}

TEST(ShardingStateTest, ProgressBetweenFailuresResetsTheAttemptCount) {
  StateDriver d;
  auto spec = StateDriver::Records("train", 100, 50);
  spec.set_max_attempts(2);
  ASSERT_TRUE(d.AddDataset(spec).ok());
  d.AddWorker("w0");
  uint64_t done = 0;
  for (int i = 0; i < 5; ++i) {  // fails five times, but each time further on
    auto l = d.Fetch("w0", "train");
    ASSERT_EQ(l->begin, done);
    ASSERT_TRUE(d.End(l->id, LEASE_FAILED, 1).ok());
    done += 1;
  }
  EXPECT_TRUE(d.state().FindDataset("train")->quarantined.empty());
}

TEST(ShardingStateTest, RestoreRedeliversExactlyTheRecordsConsumedAfterTheCheckpoint) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 100, 10, 2)).ok());
  d.AddWorker("w0");
  d.AddWorker("w1");
  auto a = d.Fetch("w0", "train");  // [0,10)
  auto b = d.Fetch("w1", "train");  // [10,20)
  ASSERT_TRUE(d.Complete(a->id).ok());
  ASSERT_TRUE(d.Progress(b->id, 5).ok());
  ASSERT_TRUE(d.Save("step-100").ok());  // consumed: [0,15)
  ASSERT_TRUE(d.Complete(b->id).ok());
  std::vector<std::pair<uint64_t, uint64_t>> after;
  for (int i = 0; i < 3; ++i) {
    auto l = d.Fetch("w0", "train");
    after.emplace_back(l->begin, l->end);
    ASSERT_TRUE(d.Complete(l->id).ok());
  }
  auto open_lease = d.Fetch("w1", "train");  // held across the restore: fenced
  ASSERT_TRUE(d.Restore("step-100").ok());
  EXPECT_EQ(d.state().FindLease(open_lease->id), nullptr);
  EXPECT_EQ(Done(d.state(), "train"), 15u);
  // Re-delivered: exactly [15,100) of epoch 0, nothing before 15.
  uint64_t covered = 0, first = UINT64_MAX;
  while (auto l = d.Fetch("w0", "train")) {
    if (l->epoch != 0) break;
    first = std::min(first, l->begin);
    covered += l->end - l->begin;
    ASSERT_TRUE(d.Complete(l->id).ok());
  }
  EXPECT_EQ(first, 15u);
  EXPECT_EQ(covered, 85u);
  EXPECT_EQ(d.Restore("nope").code(), absl::StatusCode::kNotFound);
}

// A checkpoint holds every partition's position: 64 of a stream of 65 536 partitions held
// ~50 MB. The oldest go once the kept checkpoints pass kMaxCheckpointBytes; the newest stays.
TEST(ShardingStateTest, CheckpointsAreBoundedInBytesAndTheNewestIsKept) {
  StateDriver d;
  DatasetSpec stream;
  stream.set_name("events");
  for (uint32_t p = 0; p < 65'536; ++p) {
    StreamPartition* part = stream.mutable_stream()->add_partitions();
    part->set_id(p);
    part->set_start_offset(uint64_t{1} << 40);  // positions of a few bytes each
  }
  ASSERT_TRUE(d.AddDataset(stream).ok());
  for (int c = 0; c < 40; ++c) {  // ~1.5 MB each: 60 MB in all
    d.now_ms += 1000;
    ASSERT_TRUE(d.Save("cp-" + std::to_string(c)).ok());
  }
  const ShardingSnapshot snap = d.state().ToJournalSnapshot().snapshot;
  uint64_t bytes = 0;
  for (const auto& cp : snap.checkpoints()) bytes += ShardingState::CheckpointHeldBytes(cp);
  EXPECT_LE(bytes, kMaxCheckpointBytes);
  EXPECT_LT(snap.checkpoints_size(), 40) << "40 checkpoints of " << bytes / 40 << " bytes kept";
  EXPECT_GT(snap.checkpoints_size(), 1);
  EXPECT_TRUE(d.state().HasCheckpoint("cp-39"));
  EXPECT_FALSE(d.state().HasCheckpoint("cp-0"));
}

TEST(ShardingStateTest, StreamPartitionsAreServedEvenly) {
  StateDriver d;
  DatasetSpec spec;
  spec.set_name("clicks");
  spec.set_shard_size(100);
  for (uint32_t p = 0; p < 3; ++p) {
    auto* part = spec.mutable_stream()->add_partitions();
    part->set_id(p);
    part->set_start_offset(1000 * p);
  }
  ASSERT_TRUE(d.AddDataset(spec).ok());
  d.AddWorker("w0");
  ASSERT_TRUE(d.SetAllocation("w0", 1, 0, 100).ok());
  std::map<uint32_t, int> per_partition;
  for (int i = 0; i < 9; ++i) {
    auto l = d.Fetch("w0", "clicks");
    ASSERT_TRUE(l.has_value());
    per_partition[l->partition]++;
    EXPECT_GE(l->begin, 1000u * l->partition);
  }
  EXPECT_EQ(per_partition[0], 3);
  EXPECT_EQ(per_partition[1], 3);
  EXPECT_EQ(per_partition[2], 3);
  const auto* ds = d.state().FindDataset("clicks");
  EXPECT_FALSE(ds->Finished());
}

TEST(ShardingStateTest, BadSpecsAreRefusedWithTheField) {
  struct Case {
    std::function<void(DatasetSpec&)> mutate;
    std::string field;
  };
  std::vector<Case> cases = {
      {[](DatasetSpec& s) { s.set_name(""); }, "name"},
      {[](DatasetSpec& s) { s.set_name("bad name!"); }, "name"},
      {[](DatasetSpec& s) { s.set_num_records(0); }, "num_records"},
      {[](DatasetSpec& s) { s.set_num_records(uint64_t{1} << 60); }, "num_records"},
      {[](DatasetSpec& s) { s.clear_source(); }, "one of num_records"},
      {[](DatasetSpec& s) { s.set_shard_size(uint64_t{1} << 40); }, "shard_size"},
      {[](DatasetSpec& s) { s.set_shuffle(static_cast<ShuffleMode>(42)); }, "shuffle"},
      {[](DatasetSpec& s) {
         s.set_shuffle(SHUFFLE_RECORDS);
         s.set_shard_size(1 << 20);
       }, "shard_size"},
      {[](DatasetSpec& s) { s.mutable_files()->add_files()->set_num_records(3); }, "path"},
      {[](DatasetSpec& s) {
         s.mutable_stream()->add_partitions()->set_id(1);
         s.mutable_stream()->add_partitions()->set_id(1);
       }, "duplicate"},
  };
  for (const auto& c : cases) {
    DatasetSpec spec = StateDriver::Records("train", 10, 5);
    c.mutate(spec);
    auto r = ShardingState::NormalizeSpec(spec);
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status();
  }
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 10, 5)).ok());
  EXPECT_TRUE(d.AddDataset(StateDriver::Records("train", 10, 5)).ok());  // identical: no-op
  EXPECT_EQ(d.AddDataset(StateDriver::Records("train", 11, 5)).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(ShardingStateTest, TenBillionRecordsTakeNoMemoryPerRecord) {
  StateDriver d;
  auto spec = StateDriver::Records("huge", 10'000'000'000ULL, 1000, 0);
  spec.set_shuffle(SHUFFLE_SHARDS);
  ASSERT_TRUE(d.AddDataset(spec).ok());
  d.AddWorker("w0");
  auto l = d.Fetch("w0", "huge");
  ASSERT_TRUE(l.has_value());
  Lease described = d.state().DescribeLease(*l);
  ASSERT_EQ(described.records_size(), 1);
  EXPECT_EQ(described.records(0).end() - described.records(0).begin(), 1000u);
  EXPECT_LT(d.state().ToSnapshot().ByteSizeLong(), 1024u);
}

// The contract both durable state machines keep (controller/controller_durable_state.h): Validate
// makes every check and changes nothing; a refused update, of any kind, leaves the state as it
// was, through Validate, ApplyChecked and Commit alike; an update that passed Validate applies.
TEST(ShardingStateTest, RefusedUpdatesOfEveryKindChangeNothing) {
  StateDriver d;
  ASSERT_TRUE(d.AddDataset(StateDriver::Records("train", 30, 10)).ok());
  d.AddWorker("w0");
  auto lease = d.Fetch("w0", "train");
  ASSERT_TRUE(lease.has_value());
  ASSERT_TRUE(d.Progress(lease->id, 2).ok());
  ASSERT_TRUE(d.Save("c1").ok());
  ShardingState& st = d.state();

  std::vector<Update> refused;
  auto add = [&](auto fill) {
    Update u;
    fill(u);
    refused.push_back(u);
  };
  add([](Update& u) { u.mutable_register_dataset()->mutable_spec()->set_name("eval"); });
  add([](Update& u) { *u.mutable_register_dataset()->mutable_spec() = StateDriver::Records("train", 60, 10); });
  add([](Update& u) { u.mutable_register_worker()->set_worker_id("no spaces"); });
  add([](Update& u) {
    u.mutable_register_worker()->set_worker_id("w1");
    u.mutable_register_worker()->set_node(std::string(300, 'n'));
  });
  add([&](Update& u) {  // a decided lease that does not start at the frontier
    CreateLeaseUpdate* c = u.mutable_create_lease();
    c->set_decided(true);
    c->set_worker_id("w0");
    c->set_dataset("train");
    c->set_lease_id(st.last_lease_id() + 1);
    c->set_fencing_token(st.last_lease_id() + 1);
    c->set_begin(0);
    c->set_end(10);
  });
  add([](Update& u) { u.mutable_create_lease()->set_worker_id("w9"); });  // v2, unknown worker
  add([](Update& u) { u.mutable_progress()->set_lease_id(99); });
  add([&](Update& u) {
    u.mutable_progress()->set_lease_id(lease->id);
    u.mutable_progress()->set_records_done(11);
  });
  add([&](Update& u) {
    u.mutable_end_lease()->set_lease_id(lease->id);
    u.mutable_end_lease()->set_reason(LEASE_CANCELLED);
  });
  add([&](Update& u) {
    u.mutable_end_lease()->set_lease_id(lease->id);
    u.mutable_end_lease()->set_reason(LEASE_FAILED);
    u.mutable_end_lease()->set_records_done(11);
  });
  add([](Update& u) { u.mutable_worker_lost()->set_worker_id("w9"); });
  add([](Update& u) { u.mutable_save_checkpoint()->set_tag("bad tag"); });
  add([](Update& u) { u.mutable_restore_checkpoint()->set_tag("c2"); });
  add([](Update& u) { u.mutable_delete_checkpoint()->set_tag("c2"); });
  add([](Update& u) {
    u.mutable_set_allocation()->set_worker_id("w0");
    u.mutable_set_allocation()->set_max_leases(5000);
  });
  add([](Update& u) { u.mutable_set_allocation()->set_worker_id("w9"); });
  add([](Update& u) { u.mutable_set_tail_backup()->set_dataset("eval"); });
  add([](Update& u) { u.mutable_delete_dataset()->set_dataset("eval"); });
  add([](Update& u) { u.mutable_reset_dataset()->set_dataset("eval"); });
  add([](Update&) {});  // no kind
  // Every kind is refused at least once.
  std::set<int> kinds;
  for (const Update& u : refused) kinds.insert(u.kind_case());
  EXPECT_EQ(kinds.size(), static_cast<size_t>(Update::kResetDataset - Update::kRegisterDataset + 2));

  const std::string before = st.ToSnapshot().SerializeAsString();
  const uint64_t seq = st.last_seq();
  for (Update u : refused) {
    u.set_seq(seq + 1);
    u.set_time_ms(d.now_ms);
    EXPECT_FALSE(st.Validate(u).ok()) << u.ShortDebugString();
    EXPECT_FALSE(st.ApplyChecked(u).ok()) << u.ShortDebugString();
    EXPECT_FALSE(d.Apply(u).ok()) << u.ShortDebugString();  // Commit
    ASSERT_EQ(st.ToSnapshot().SerializeAsString(), before) << u.ShortDebugString();
    ASSERT_EQ(st.last_seq(), seq);
  }
  EXPECT_TRUE(d.TakeCancelled().empty());

  // An update that fits, but not at the next seq, is refused as well (a gap or a repeat in a
  // journal); at the next seq it applies, and Apply returns its effects.
  Update lost;
  lost.mutable_worker_lost()->set_worker_id("w0");
  for (uint64_t wrong : {seq, seq + 2, uint64_t{0}}) {
    lost.set_seq(wrong);
    EXPECT_EQ(st.ApplyChecked(lost).code(), absl::StatusCode::kInvalidArgument) << wrong;
    ASSERT_EQ(st.ToSnapshot().SerializeAsString(), before);
  }
  lost.set_seq(seq + 1);
  ASSERT_TRUE(st.Validate(lost).ok());
  const ApplyEffects effects = st.Apply(lost);
  ASSERT_EQ(effects.cancelled_leases.size(), 1u);
  EXPECT_EQ(effects.cancelled_leases[0], std::make_pair(std::string("w0"), lease->id));
  EXPECT_EQ(st.last_seq(), seq + 1);
  EXPECT_TRUE(st.FindWorker("w0")->lost);
}

}  // namespace
}  // namespace pacer
