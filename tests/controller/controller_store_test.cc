// ControllerStore: the controller's audit, plan, allocations and node incidents round-trip
// through its journal on a real RocksDB; records the history dropped are deleted; a corrupt
// record is DATA_LOSS, never a crash or a silent reset.
#include "controller/controller_store.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include "tests/testing/test_util.h"

namespace pacer {
namespace {

BatchPlan SamplePlan(uint64_t version) {
  BatchPlan p;
  p.version = version;
  p.effective_step = 120;
  p.global_batch = 300;
  p.predicted_step_s = 0.25;
  p.workers = {{"w0", 200, 100, 2, 0.24}, {"w1", 100, 100, 1, 0.25}};
  p.basis_share = {{"w0", 0.66}, {"w1", 0.34}};
  return p;
}

AuditRecord SampleRecord(int64_t t) {
  AuditRecord r;
  r.time_ms = t;
  r.policy = "dd";
  r.outcome = AuditRecord::Outcome::kExecuted;
  r.inputs = "4 live, B=300";
  r.action.kind = ActionKind::kAdjustBatch;
  r.action.reason = "w1 slow";
  r.action.predicted_gain = 0.2;
  r.action.plan = SamplePlan(2);
  r.baseline_throughput = 1234.5;
  r.previous_plan = SamplePlan(1);
  return r;
}

void ExpectSamePlan(const BatchPlan& a, const BatchPlan& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.effective_step, b.effective_step);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_DOUBLE_EQ(a.predicted_step_s, b.predicted_step_s);
  ASSERT_EQ(a.workers.size(), b.workers.size());
  for (size_t i = 0; i < a.workers.size(); ++i) {
    EXPECT_EQ(a.workers[i].worker_id, b.workers[i].worker_id);
    EXPECT_EQ(a.workers[i].samples, b.workers[i].samples);
    EXPECT_EQ(a.workers[i].micro_batch, b.workers[i].micro_batch);
    EXPECT_EQ(a.workers[i].accumulation, b.workers[i].accumulation);
  }
  EXPECT_EQ(a.basis_share, b.basis_share);
}

TEST(ControllerStoreTest, AuditRecordRoundTrips) {
  AuditRecord r = SampleRecord(1000);
  r.id = 7;
  r.action.id = 7;
  r.measured_gain = 0.15;
  r.measured_at_ms = 5000;
  r.rolled_back = true;
  r.previous_allocations = {{"w0", 1.5, 0.5}};
  r.previous_tail_backups = false;
  r.previous_excluded = {"w3"};
  r.action.allocations = {{"w1", 0.5, 0.25}};
  r.action.tail_backups = true;
  r.action.node = "n1";
  r.action.avoid_nodes = {"n2"};
  auto back = AuditFromProto(AuditToProto(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, 7u);
  EXPECT_EQ(back->time_ms, 1000);
  EXPECT_EQ(back->outcome, AuditRecord::Outcome::kExecuted);
  EXPECT_EQ(back->action.kind, ActionKind::kAdjustBatch);
  EXPECT_EQ(back->action.reason, "w1 slow");
  EXPECT_DOUBLE_EQ(back->baseline_throughput, 1234.5);
  ASSERT_TRUE(back->measured_gain.has_value());
  EXPECT_DOUBLE_EQ(*back->measured_gain, 0.15);
  EXPECT_TRUE(back->rolled_back);
  ASSERT_TRUE(back->action.plan && back->previous_plan);
  ExpectSamePlan(*back->action.plan, *r.action.plan);
  ExpectSamePlan(*back->previous_plan, *r.previous_plan);
  ASSERT_EQ(back->previous_allocations.size(), 1u);
  EXPECT_DOUBLE_EQ(back->previous_allocations[0].shard_scale, 0.5);
  EXPECT_EQ(back->previous_tail_backups, std::optional<bool>(false));
  EXPECT_EQ(back->previous_excluded, std::vector<std::string>{"w3"});
  EXPECT_EQ(back->action.tail_backups, std::optional<bool>(true));
  EXPECT_EQ(back->action.avoid_nodes, std::vector<std::string>{"n2"});
  // Absent optionals stay absent.
  AuditRecord plain = SampleRecord(1);
  plain.previous_plan.reset();
  auto plain_back = AuditFromProto(AuditToProto(plain));
  ASSERT_TRUE(plain_back.ok());
  EXPECT_FALSE(plain_back->measured_gain.has_value());
  EXPECT_FALSE(plain_back->previous_plan.has_value());
  EXPECT_FALSE(plain_back->previous_tail_backups.has_value());
}

TEST(ControllerStoreTest, SavesChangesAndRestoresThemAfterReopen) {
  testing::TempDir dir;
  History h;
  h.set_journaled(true);
  {
    auto store = ControllerStore::Open(dir.Sub("c"));
    ASSERT_TRUE(store.ok()) << store.status();
    auto empty = (*store)->Load();
    ASSERT_TRUE(empty.ok());
    EXPECT_TRUE(empty->empty);
    for (int i = 0; i < 5; ++i) h.Record(SampleRecord(100 * i), /*max_records=*/3);
    h.SetPlan(SamplePlan(2));
    h.AddNodeIncident("n1", 400);
    h.AddNodeIncident("n1", 450);
    h.SetMeasuredGain(h.audit().back().id, 0.3, 500);
    std::vector<ControllerUpdate> updates = h.TakeUpdates();
    int records = 0;
    for (const auto& u : updates) records += u.has_record();
    EXPECT_GE(records, 5) << "every record written, even those dropped since";
    DispatchNote* note = updates.emplace_back().mutable_dispatch();
    note->set_id(h.audit().back().id);
    note->set_note("plan sent");
    ASSERT_TRUE((*store)->Commit(std::move(updates)).ok());
    EXPECT_TRUE(h.TakeUpdates().empty());
    std::vector<ControllerUpdate> policy(1);
    AppliedPolicy* p = policy[0].mutable_policy();
    p->set_yaml("version: 1\n");
    p->set_file_name("p.yaml");
    p->set_base_digest("abc");
    ASSERT_TRUE((*store)->Commit(std::move(policy)).ok());
  }
  auto store = ControllerStore::Open(dir.Sub("c"));
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->empty);
  ASSERT_EQ(loaded->audit.size(), 3u) << "only the records the history keeps";
  History restored;
  RestoreHistory((*store)->state(), &restored);
  ASSERT_EQ(restored.audit().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(restored.audit()[i].id, h.audit()[i].id);
    EXPECT_EQ(restored.audit()[i].time_ms, h.audit()[i].time_ms);
  }
  ASSERT_TRUE(restored.audit().back().measured_gain.has_value());
  EXPECT_DOUBLE_EQ(*restored.audit().back().measured_gain, 0.3);
  EXPECT_EQ(loaded->dispatch.at(h.audit().back().id), "plan sent");
  ASSERT_TRUE(restored.plan().has_value());
  ExpectSamePlan(*restored.plan(), SamplePlan(2));
  EXPECT_EQ(restored.NodeIncidents("n1"), 2);
  EXPECT_EQ(restored.next_id(), h.next_id());
  EXPECT_NE(restored.LastExecuted(ActionKind::kAdjustBatch, ""), nullptr) << "cooldowns see it";
  // New records continue the id sequence.
  const uint64_t next = restored.Record(SampleRecord(900), 10);
  EXPECT_EQ(next, h.next_id());
  ASSERT_TRUE(loaded->policy.has_value());
  EXPECT_EQ(loaded->policy->file_name(), "p.yaml");
}

TEST(ControllerStoreTest, RecordsTheHistoryDropsAreDeleted) {
  testing::TempDir dir;
  auto store = ControllerStore::Open(dir.Sub("c"));
  ASSERT_TRUE(store.ok());
  History h;
  h.set_journaled(true);
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 2; ++i) h.Record(SampleRecord(100 * (2 * round + i)), /*max_records=*/3);
    ASSERT_TRUE((*store)->Commit(h.TakeUpdates()).ok());
  }
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->audit.size(), 3u);
  EXPECT_EQ(loaded->audit.front().id, h.audit().front().id);
  EXPECT_EQ(loaded->audit.back().id, h.audit().back().id);
}

TEST(ControllerStoreTest, CorruptRecordIsDataLoss) {
  testing::TempDir dir;
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir.Sub("c"), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "audit/00000000000000000001", "\xff\xff not a proto").ok());
  }
  // A store of the code before the journal (format v0) is read when it is opened, to be
  // migrated: the corrupt record refuses the open itself (controller_journal_test has more).
  auto store = ControllerStore::Open(dir.Sub("c"));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
}

TEST(ControllerStoreTest, UnknownKindIsRefused) {
  AuditState p = AuditToProto(SampleRecord(1));
  p.mutable_action()->set_kind("TELEPORT");
  EXPECT_EQ(AuditFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = AuditToProto(SampleRecord(1));
  p.set_outcome("maybe");
  EXPECT_EQ(AuditFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pacer
