// The controller's durable state as a journaled state machine (controller/
// controller_durable_state.h, controller/controller_store.h), on a real RocksDB in a temp dir:
//  - Apply, unit by unit: what each update kind changes, what Validate refuses;
//  - replay: for random sequences of controller decisions, the newest snapshot plus the updates
//    after it rebuild exactly the live state (and so does a reopen of the store);
//  - damage is refused with DATA_LOSS naming the folder (a corrupt record, a lost tail, a record
//    a newer pacerd wrote), never a silent reset;
//  - a store written by the code before the journal (format v0; its writer is kept below) is
//    migrated on open, keeping every record, the plan, the exclusion, the nodes and the policy.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <random>

#include "controller/controller.h"
#include "controller/controller_durable_state.h"
#include "controller/controller_store.h"
#include "tests/testing/fault_injection_fs.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

BatchPlan Plan(uint64_t version) {
  BatchPlan p;
  p.version = version;
  p.effective_step = 100 + static_cast<int64_t>(version);
  p.global_batch = 256;
  p.predicted_step_s = 0.2;
  p.workers = {{"w0", 128, 128, 1, 0.2}, {"w1", 128, 64, 2, 0.2}};
  p.basis_share = {{"w0", 0.5}, {"w1", 0.5}};
  return p;
}

AuditRecord Exclusion(int64_t t, std::vector<std::string> who, bool step_rule) {
  AuditRecord r;
  r.time_ms = t;
  r.policy = "nd";
  r.outcome = AuditRecord::Outcome::kExecuted;
  r.inputs = step_rule ? std::string(kStepRuleInputs) + " of 4 workers" : "window view";
  r.action.kind = ActionKind::kExcludeWorkers;
  r.action.excluded_workers = std::move(who);
  r.action.reason = "burst: w1 at " + std::to_string(t);
  return r;
}

AuditRecord PlanRecord(int64_t t, uint64_t version) {
  AuditRecord r;
  r.time_ms = t;
  r.policy = "dd";
  r.outcome = AuditRecord::Outcome::kExecuted;
  r.action.kind = ActionKind::kAdjustBatch;
  r.action.plan = Plan(version);
  r.action.reason = "w1 slow";
  r.previous_plan = Plan(version - 1);
  return r;
}

ControllerUpdate U(uint64_t seq) {
  ControllerUpdate u;
  u.set_seq(seq);
  return u;
}

// Field by field (a map's serialized order varies).
bool Same(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}
bool Same(const ControllerDurableState& a, const ControllerDurableState& b) {
  return Same(a.ToSnapshot(), b.ToSnapshot());
}
bool Same(const AuditRecord& a, const AuditRecord& b) { return Same(AuditToProto(a), AuditToProto(b)); }

// ---- Apply ----

TEST(ControllerDurableStateTest, EachUpdateChangesWhatItNames) {
  ControllerDurableState s;
  EXPECT_TRUE(s.empty());
  ControllerUpdate u = U(1);
  *u.mutable_record() = AuditToProto(PlanRecord(10, 2));
  u.mutable_record()->set_id(5);
  u.mutable_record()->set_dispatch("ignored: notes are their own updates");
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_EQ(s.last_seq(), 1u);
  ASSERT_EQ(s.records().count(5), 1u);
  EXPECT_TRUE(s.records().at(5).dispatch().empty());
  EXPECT_EQ(s.next_audit_id(), 6u) << "ids below next_audit_id";

  u = U(2);
  u.mutable_dispatch()->set_id(5);
  u.mutable_dispatch()->set_note("plan sent");
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_EQ(s.dispatch().at(5), "plan sent");
  u = U(3);
  u.mutable_dispatch()->set_id(99);  // a record not held: nothing to annotate
  u.mutable_dispatch()->set_note("x");
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_EQ(s.dispatch().count(99), 0u);

  u = U(4);
  *u.mutable_plan()->mutable_plan() = PlanToProto(Plan(2));
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  ASSERT_TRUE(s.plan().has_value());
  EXPECT_EQ(s.plan()->version(), 2u);
  u = U(5);
  u.mutable_plan();  // none in force (a new run)
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_FALSE(s.plan().has_value());

  u = U(6);
  u.mutable_exclusion()->add_excluded("w1");
  u.mutable_exclusion()->set_version(5);
  u.mutable_exclusion()->set_reason("burst");
  u.mutable_exclusion()->set_step_rule(true);
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_EQ(s.exclusion().excluded_size(), 1);
  EXPECT_EQ(s.exclusion().version(), 5u);
  EXPECT_TRUE(s.exclusion().step_rule());

  u = U(7);
  u.mutable_node()->set_node("n1");
  u.mutable_node()->set_incidents(3);
  u.mutable_node()->set_last_ms(70);
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_EQ(s.nodes().at("n1").incidents, 3);

  u = U(8);
  u.mutable_allocations()->add_allocations()->set_worker_id("w0");
  u.mutable_allocations()->set_tail_backups(true);
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_EQ(s.allocations().size(), 1u);
  EXPECT_TRUE(s.tail_backups());

  u = U(9);
  u.mutable_policy()->set_file_name("p.yaml");
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  ASSERT_TRUE(s.policy().has_value());

  u = U(10);
  u.mutable_audit_trim()->set_oldest_id(6);
  ASSERT_TRUE(s.ApplyChecked(u).ok());
  EXPECT_TRUE(s.records().empty());
  EXPECT_TRUE(s.dispatch().empty()) << "a trimmed record's note goes with it";
  EXPECT_EQ(s.next_audit_id(), 6u) << "ids never go back";

  // The snapshot holds all of it.
  auto back = ControllerDurableState::FromSnapshot(s.ToSnapshot());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(Same(*back, s));
}

TEST(ControllerDurableStateTest, ValidateRefusesWhatCannotApply) {
  ControllerDurableState s;
  ControllerUpdate u = U(2);
  u.mutable_next_audit_id()->set_next_id(3);
  EXPECT_EQ(s.Validate(u).code(), absl::StatusCode::kInvalidArgument) << "not the next seq";
  EXPECT_EQ(s.Validate(U(1)).code(), absl::StatusCode::kInvalidArgument) << "no kind (newer pacerd)";
  u = U(1);
  *u.mutable_record() = AuditToProto(PlanRecord(1, 2));
  u.mutable_record()->set_id(1);
  u.mutable_record()->mutable_action()->set_kind("TELEPORT");
  EXPECT_EQ(s.Validate(u).code(), absl::StatusCode::kInvalidArgument) << "an unknown kind";
  u.mutable_record()->mutable_action()->set_kind("ADJUST_BS");
  u.mutable_record()->set_id(0);
  EXPECT_EQ(s.Validate(u).code(), absl::StatusCode::kInvalidArgument) << "no id";
  EXPECT_EQ(s.last_seq(), 0u) << "validation changes nothing";
}

TEST(ControllerDurableStateTest, AnExclusionFromBeforeTheJournalIsNamedByItsNewestDecision) {
  History h;
  h.Record(Exclusion(10, {"w1"}, /*step_rule=*/true), 100);
  h.SetExcluded({"w1"});  // as a store from before the journal restores it: no decision named
  EXPECT_EQ(h.exclusion().version(), 0u);
  ExclusionState e = NameExclusionInForce(h);
  EXPECT_EQ(e.version(), 1u);
  EXPECT_EQ(e.reason(), "burst: w1 at 10");
  EXPECT_TRUE(e.step_rule());
  h.Record(Exclusion(20, {}, /*step_rule=*/false), 100);
  h.SetExcluded({});
  e = NameExclusionInForce(h);
  EXPECT_EQ(e.version(), 2u);
  EXPECT_FALSE(e.step_rule());
  EXPECT_EQ(e.excluded_size(), 0);
}

// ---- Replay ----

// Random controller decisions, journaled as pacerd journals them (the History's updates, then
// the dispatch notes); returns the history.
void RandomDecisions(std::mt19937& rng, int n, History* h, std::map<uint64_t, std::string>* dispatch,
                     ControllerStore* store) {
  h->set_journaled(true);
  for (int i = 0; i < n; ++i) {
    std::vector<ControllerUpdate> notes;
    const int64_t t = 1000 * (i + 1);
    switch (rng() % 7) {
      case 0: {
        const uint64_t id = h->Record(PlanRecord(t, h->next_id() + 1), /*max_records=*/12);
        h->SetPlan(Plan(id + 1));
        break;
      }
      case 1: {
        std::vector<std::string> who;
        if (rng() % 2) who.push_back("w" + std::to_string(rng() % 4));
        const bool step_rule = rng() % 2;
        const uint64_t id = h->Record(Exclusion(t, who, step_rule), 12);
        h->SetExcluded(who, id, h->FindRecord(id)->action.reason, step_rule);
        break;
      }
      case 2:
        if (!h->audit().empty()) h->SetMeasuredGain(h->audit().back().id, 0.01 * (rng() % 50), t);
        break;
      case 3:
        if (!h->audit().empty()) {
          (*dispatch)[h->audit().back().id] = "sent " + std::to_string(t);
          DispatchNote* note = notes.emplace_back().mutable_dispatch();
          note->set_id(h->audit().back().id);
          note->set_note("sent " + std::to_string(t));
        }
        break;
      case 4:
        h->AddNodeIncident("n" + std::to_string(rng() % 3), t);
        break;
      case 5:
        h->SetAllocations({{"w" + std::to_string(rng() % 4), 1.0, 0.5 + 0.1 * (rng() % 5)}});
        h->SetTailBackups(rng() % 2);
        break;
      case 6:
        if (rng() % 4 == 0) h->ClearPlan();
        else if (!h->audit().empty()) h->MarkRolledBack(h->audit().front().id);
        break;
    }
    std::vector<ControllerUpdate> updates = h->TakeUpdates();
    for (auto& n : notes) updates.push_back(std::move(n));
    ASSERT_TRUE(store->Commit(std::move(updates)).ok());
  }
}

TEST(ControllerJournalReplayTest, SnapshotPlusJournalRebuildsTheLiveStateForRandomDecisions) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    testing::TempDir dir;
    std::mt19937 rng(seed);
    History h;
    std::map<uint64_t, std::string> dispatch;
    ControllerSnapshot live;
    uint64_t seq = 0;
    {
      auto store = ControllerStore::Open(dir.Sub("c"));
      ASSERT_TRUE(store.ok()) << store.status();
      // Past kSnapshotEvery updates for some seeds: a snapshot and a tail.
      ASSERT_NO_FATAL_FAILURE(RandomDecisions(rng, 60 * static_cast<int>(seed), &h, &dispatch, store->get()));
      live = (*store)->state().ToSnapshot();
      seq = (*store)->state().last_seq();
      if (seed >= 5) ASSERT_GE((*store)->stats().snapshots, 1u);
    }
    auto reopened = ControllerStore::Open(dir.Sub("c"), /*must_exist=*/true);
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    EXPECT_EQ((*reopened)->state().last_seq(), seq);
    EXPECT_TRUE(Same((*reopened)->state().ToSnapshot(), live));
    // What the reconciler restores equals the live history.
    auto loaded = (*reopened)->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    History restored;
    RestoreHistory((*reopened)->state(), &restored);
    ASSERT_EQ(restored.audit().size(), h.audit().size());
    for (size_t i = 0; i < h.audit().size(); ++i) {
      EXPECT_TRUE(Same(restored.audit()[i], h.audit()[i])) << "record " << h.audit()[i].id;
    }
    EXPECT_EQ(restored.excluded_workers(), h.excluded_workers());
    EXPECT_TRUE(Same(restored.exclusion(), h.exclusion()));
    EXPECT_EQ(restored.tail_backups(), h.tail_backups());
    EXPECT_EQ(restored.allocations().size(), h.allocations().size());
    EXPECT_EQ(restored.next_id(), h.next_id());
    EXPECT_EQ(restored.plan().has_value(), h.plan().has_value());
    EXPECT_EQ(restored.nodes().size(), h.nodes().size());
    for (const auto& r : h.audit()) {
      if (dispatch.count(r.id)) EXPECT_EQ(loaded->dispatch.at(r.id), dispatch.at(r.id));
    }
    // Restoring applies; it queues nothing to journal again.
    restored.set_journaled(true);
    RestoreHistory((*reopened)->state(), &restored);
    EXPECT_TRUE(restored.TakeUpdates().empty());
  }
}

// ---- The journal's read-from-seq (what a follower replica would tail) ----

TEST(ControllerJournalReadTest, ReadFromHandsBackTheDurableUpdatesFromASeq) {
  testing::TempDir dir;
  JournalOptions o;
  o.dir = dir.Sub("c");
  auto noop_snapshot = [](const ControllerSnapshot&) { return absl::OkStatus(); };
  auto noop_update = [](const ControllerUpdate&) { return absl::OkStatus(); };
  auto j = ControllerJournal::Open(o, noop_snapshot, noop_update);
  ASSERT_TRUE(j.ok()) << j.status();
  ControllerDurableState state;
  std::vector<ControllerUpdate> group;
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    ControllerUpdate u = U(seq);
    u.mutable_next_audit_id()->set_next_id(100 + seq);
    ASSERT_TRUE(state.ApplyChecked(u).ok());
    group.push_back(u);
    if (seq % 3 == 0 || seq == 10) {  // groups of 3: reads start inside a record too
      (*j)->AppendAll(group);
      group.clear();
    }
  }
  ASSERT_TRUE((*j)->Flush().ok());
  std::vector<uint64_t> seen;
  auto collect = [&](const ControllerUpdate& u) {
    seen.push_back(u.seq());
    EXPECT_EQ(u.next_audit_id().next_id(), 100 + u.seq());
    return absl::OkStatus();
  };
  ASSERT_TRUE((*j)->ReadFrom(5, collect).ok());
  EXPECT_EQ(seen, (std::vector<uint64_t>{5, 6, 7, 8, 9, 10}));
  // After a snapshot at 11 (of every update appended so far), only what follows it is read.
  ControllerUpdate u = U(11);
  u.mutable_next_audit_id()->set_next_id(111);
  ASSERT_TRUE(state.ApplyChecked(u).ok());
  (*j)->Append(u);
  (*j)->WriteSnapshot(state.ToSnapshot());
  for (uint64_t seq = 12; seq <= 13; ++seq) {
    u = U(seq);
    u.mutable_next_audit_id()->set_next_id(100 + seq);
    (*j)->Append(u);
  }
  ASSERT_TRUE((*j)->Flush().ok());
  seen.clear();
  EXPECT_EQ((*j)->ReadFrom(5, collect).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*j)->ReadFrom(11, collect).code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status read12 = (*j)->ReadFrom(12, collect);
  ASSERT_TRUE(read12.ok()) << read12;
  EXPECT_EQ(seen, (std::vector<uint64_t>{12, 13}));
}

// ---- Damage ----

std::string NewestRecordKey(rocksdb::DB* db) {
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  it->SeekForPrev(std::string("j\xff\xff\xff\xff\xff\xff\xff\xff", 9));
  if (!it->Valid() || it->key().size() != 9 || it->key()[0] != 'j') return "";
  return it->key().ToString();
}

// Saves a few decisions, then lets `damage` change the folder with plain RocksDB.
void SaveThenDamage(const std::string& dir, const std::function<void(rocksdb::DB*)>& damage) {
  {
    auto store = ControllerStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    History h;
    std::map<uint64_t, std::string> dispatch;
    std::mt19937 rng(7);
    ASSERT_NO_FATAL_FAILURE(RandomDecisions(rng, 20, &h, &dispatch, store->get()));
  }
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  damage(db.get());
}

TEST(ControllerJournalDamageTest, ACorruptRecordIsDataLossNamingTheFolder) {
  testing::TempDir t;
  const std::string dir = t.Sub("c");
  ASSERT_NO_FATAL_FAILURE(SaveThenDamage(dir, [](rocksdb::DB* db) {
    const std::string key = NewestRecordKey(db);
    ASSERT_FALSE(key.empty());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, "\xff\xff not a record").ok());
  }));
  auto store = ControllerStore::Open(dir, /*must_exist=*/true);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find(dir), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("corrupt"), std::string::npos) << store.status();
}

TEST(ControllerJournalDamageTest, ALostTailIsDataLossCountingTheMissingUpdates) {
  testing::TempDir t;
  const std::string dir = t.Sub("c");
  ASSERT_NO_FATAL_FAILURE(SaveThenDamage(dir, [](rocksdb::DB* db) {
    const std::string key = NewestRecordKey(db);
    ASSERT_FALSE(key.empty());
    ASSERT_TRUE(db->Delete(rocksdb::WriteOptions(), key).ok());
  }));
  auto store = ControllerStore::Open(dir, /*must_exist=*/true);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find("acknowledged updates are missing"), std::string::npos)
      << store.status();
  // The operator accepts the loss explicitly: it opens with what is there.
  auto accepted = ControllerStore::Open(dir, true, /*accept_data_loss=*/true);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_FALSE((*accepted)->recovery().accepted_loss.empty());
}

// A WAL cut back after a kill, for the controller's journal (the same RocksLog, with its own mark,
// controller.hwm): killed, then the live WAL's last 100 bytes cut. Before, the mark lagged the
// acknowledged seq and the journal opened without a word at a lower seq (journal_integrity_test
// has the same case for the sharding journal).
TEST(ControllerJournalDamageTest, AWalCutBackAfterAKillIsRefusedCountingTheMissingUpdates) {
  testing::TempDir t;
  auto fs = std::make_shared<testing::FaultInjectionFs>();
  JournalOptions o;
  o.dir = t.Sub("controller");
  o.fs = fs;
  o.hwm_interval_ms = 3'600'000;  // the old mark's lag over the whole test: not timing-dependent
  uint64_t last = 0;
  auto on_snapshot = [&](const ControllerSnapshot& s) {
    last = s.seq();
    return absl::OkStatus();
  };
  auto on_update = [&](const ControllerUpdate& u) {
    last = u.seq();
    return absl::OkStatus();
  };
  constexpr uint64_t kAcknowledged = 20;
  {
    auto j = ControllerJournal::Open(o, on_snapshot, on_update);
    ASSERT_TRUE(j.ok()) << j.status();
    for (uint64_t seq = 1; seq <= kAcknowledged; ++seq) {
      ControllerUpdate u = U(seq);
      u.mutable_next_audit_id()->set_next_id(100 + seq);
      (*j)->Append(u);
      ASSERT_TRUE((*j)->Flush().ok());  // acknowledged: pacerd would carry the decision out now
    }
    fs->SetFault(testing::FaultInjectionFs::Fault::kIoError);  // kill -9: nothing more written
  }
  fs->SetFault(testing::FaultInjectionFs::Fault::kNone);
  const std::string wal = testing::LiveWal(o.dir);
  ASSERT_FALSE(wal.empty());
  std::filesystem::resize_file(wal, std::filesystem::file_size(wal) - 100);

  last = 0;
  auto refused = ControllerJournal::Open(o, on_snapshot, on_update);
  ASSERT_FALSE(refused.ok()) << "opened at update " << last << " although " << kAcknowledged
                             << " were acknowledged";
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  ASSERT_LT(last, kAcknowledged) << "the cut took nothing: no acknowledged update was cut";
  const std::string message(refused.status().message());
  EXPECT_NE(message.find(o.dir + ".hwm"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(kAcknowledged - last) + " acknowledged updates are missing"),
            std::string::npos)
      << message;
}

TEST(ControllerJournalDamageTest, AnUpdateOfANewerPacerdIsRefused) {
  testing::TempDir t;
  const std::string dir = t.Sub("c");
  ASSERT_NO_FATAL_FAILURE(SaveThenDamage(dir, [](rocksdb::DB* db) {
    const std::string key = NewestRecordKey(db);
    ASSERT_FALSE(key.empty());
    uint64_t seq = 0;
    for (int i = 0; i < 8; ++i) seq = (seq << 8) | static_cast<unsigned char>(key[1 + i]);
    ControllerUpdate u;
    u.set_seq(seq);  // no kind this build knows
    std::string record;
    record.push_back(0x0a);
    const std::string bytes = u.SerializeAsString();
    record.push_back(static_cast<char>(bytes.size()));
    record += bytes;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, record).ok());
  }));
  auto store = ControllerStore::Open(dir, true);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find("does not apply"), std::string::npos) << store.status();
}

TEST(ControllerJournalDamageTest, AMissingFolderIsRefusedWhenTheIdentitySaysItExists) {
  testing::TempDir t;
  const std::string dir = t.Sub("c");
  ASSERT_NO_FATAL_FAILURE(SaveThenDamage(dir, [](rocksdb::DB*) {}));
  std::filesystem::remove_all(dir);
  auto store = ControllerStore::Open(dir, /*must_exist=*/true);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find(dir), std::string::npos) << store.status();
}

// ---- The store before the journal (format v0) ----

// The v0 writer, as ControllerStore::Save and SavePolicy wrote it before the journal (kept
// here, and only here, to produce old data).
class StoreV0Writer {
 public:
  explicit StoreV0Writer(const std::string& dir) {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.paranoid_checks = true;
    o.wal_recovery_mode = rocksdb::WALRecoveryMode::kAbsoluteConsistency;
    o.track_and_verify_wals_in_manifest = true;
    rocksdb::DB* raw = nullptr;
    EXPECT_TRUE(rocksdb::DB::Open(o, dir, &raw).ok());
    db_.reset(raw);
  }
  static std::string AuditKey(uint64_t id) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "audit/%020" PRIu64, id);
    return buf;
  }
  // Writes every record and the state, as a save that changed all of them.
  void Save(const History& history, const std::map<uint64_t, std::string>& dispatch) {
    rocksdb::WriteBatch batch;
    for (const AuditRecord& record : history.audit()) {
      const uint64_t id = record.id;
      const AuditRecord* r = &record;
      AuditState p = AuditToProto(*r);
      if (auto d = dispatch.find(id); d != dispatch.end()) p.set_dispatch(d->second);
      batch.Put(AuditKey(id), p.SerializeAsString());
    }
    {
      ControllerState s;
      s.set_next_audit_id(history.next_id());
      if (history.plan()) *s.mutable_plan() = PlanToProto(*history.plan());
      for (const auto& a : history.allocations()) {
        AllocationState* p = s.add_allocations();
        p->set_worker_id(a.worker_id);
        p->set_weight(a.weight);
        p->set_shard_scale(a.shard_scale);
      }
      s.set_tail_backups(history.tail_backups());
      for (const auto& w : history.excluded_workers()) s.add_excluded(w);
      for (const auto& [node, n] : history.nodes()) {
        ControllerState::Node& pn = (*s.mutable_nodes())[node];
        pn.set_incidents(n.incidents);
        pn.set_last_ms(n.last_ms);
      }
      batch.Put("state", s.SerializeAsString());
      const uint64_t oldest = history.audit().empty() ? history.next_id() : history.audit().front().id;
      batch.DeleteRange(AuditKey(0), AuditKey(oldest));
    }
    rocksdb::WriteOptions wo;
    wo.sync = true;
    EXPECT_TRUE(db_->Write(wo, &batch).ok());
  }
  void SavePolicy(const AppliedPolicy& p) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    EXPECT_TRUE(db_->Put(wo, "policy", p.SerializeAsString()).ok());
  }
  rocksdb::DB* db() { return db_.get(); }

 private:
  std::unique_ptr<rocksdb::DB> db_;
};

TEST(ControllerStoreMigrationTest, AStoreWrittenBeforeTheJournalIsMigratedOnOpen) {
  testing::TempDir t;
  const std::string dir = t.Sub("c");
  History h;
  std::map<uint64_t, std::string> dispatch;
  {
    StoreV0Writer old(dir);
    for (int i = 0; i < 6; ++i) h.Record(PlanRecord(100 * i, 2 + i), /*max_records=*/4);
    h.SetPlan(Plan(7));
    const uint64_t ex = h.Record(Exclusion(700, {"w3"}, /*step_rule=*/true), 4);
    h.SetExcluded({"w3"});
    h.AddNodeIncident("n1", 710);
    dispatch[ex] = "sent in heartbeat replies: excluded w3";
    old.Save(h, dispatch);
    AppliedPolicy p;
    p.set_yaml("version: 1\n");
    p.set_file_name("p.yaml");
    p.set_base_digest("abc");
    old.SavePolicy(p);
  }
  // The data dir's IDENTITY already lists the store (written by the old pacerd).
  {
    auto store = ControllerStore::Open(dir, /*must_exist=*/true);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_NE((*store)->recovery().imported.find("controller store v0 (4 audit records"),
              std::string::npos)
        << (*store)->recovery().imported;
    auto loaded = (*store)->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_FALSE(loaded->empty);
    History restored;
    RestoreHistory((*store)->state(), &restored);
    ASSERT_EQ(restored.audit().size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(Same(restored.audit()[i], h.audit()[i])) << "record " << h.audit()[i].id;
    }
    EXPECT_EQ(restored.next_id(), h.next_id());
    ASSERT_TRUE(restored.plan().has_value());
    EXPECT_EQ(restored.plan()->version, 7u);
    EXPECT_EQ(restored.excluded_workers(), std::vector<std::string>{"w3"});
    EXPECT_EQ(restored.NodeIncidents("n1"), 1);
    EXPECT_EQ(loaded->dispatch.at(h.audit().back().id), "sent in heartbeat replies: excluded w3");
    ASSERT_TRUE(loaded->policy.has_value());
    EXPECT_EQ(loaded->policy->file_name(), "p.yaml");
    // The old store knew who, not which decision; the reconciler names it from the newest
    // executed EXCLUDE_WORKERS record and journals it (Reconciler::AttachStore).
    EXPECT_EQ((*store)->state().exclusion().version(), 0u);
    const ExclusionState named = NameExclusionInForce(restored);
    restored.set_journaled(true);
    restored.SetExcluded(restored.excluded_workers(), named.version(), named.reason(), named.step_rule());
    restored.SetTailBackups(true);  // and journals on as any store
    ASSERT_TRUE((*store)->Commit(restored.TakeUpdates()).ok());
    EXPECT_EQ((*store)->state().exclusion().version(), h.audit().back().id);
    EXPECT_TRUE((*store)->state().exclusion().step_rule());
  }
  // Migrated once: the old keys are gone, the journal opens as any other.
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string v;
    EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "state", &v).IsNotFound());
    EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "policy", &v).IsNotFound());
    EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), StoreV0Writer::AuditKey(h.audit().front().id), &v).IsNotFound());
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "m:format", &v).ok());
    EXPECT_EQ(v, kControllerJournalFormat);
  }
  auto again = ControllerStore::Open(dir, true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->recovery().imported.empty());
  EXPECT_TRUE((*again)->state().tail_backups());
  EXPECT_EQ((*again)->state().records().size(), 4u);
}

TEST(ControllerStoreMigrationTest, AnEmptyStoreOfTheOldCodeOpensEmpty) {
  testing::TempDir t;
  const std::string dir = t.Sub("c");
  { StoreV0Writer old(dir); }
  auto store = ControllerStore::Open(dir, /*must_exist=*/true);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(loaded->empty);
}

TEST(ControllerStoreMigrationTest, ACorruptOldRecordIsRefusedAndNothingIsMigrated) {
  testing::TempDir t;
  const std::string dir = t.Sub("c");
  {
    StoreV0Writer old(dir);
    ASSERT_TRUE(old.db()->Put(rocksdb::WriteOptions(), StoreV0Writer::AuditKey(1), "\xff\xff not a proto").ok());
  }
  auto store = ControllerStore::Open(dir, true);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find("audit/00000000000000000001"), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find(dir), std::string::npos) << store.status();
  // Refused again, the old data untouched.
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string v;
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), StoreV0Writer::AuditKey(1), &v).ok());
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "m:format", &v).IsNotFound());
}

}  // namespace
}  // namespace pacer
