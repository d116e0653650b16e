// History's memory bound (controller/history.h): beyond the newest kFullPayloadRecords, a
// record that can no longer be rolled back keeps no per-worker payload, so the audit's bytes do
// not grow with the job's length times its width. Deterministic: counts what the records hold.
#include "controller/history.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace pacer {
namespace {

BatchPlan WidePlan(uint64_t version, int workers) {
  BatchPlan p;
  p.version = version;
  p.effective_step = static_cast<int64_t>(100 * version);
  p.global_batch = workers * 64;
  for (int i = 0; i < workers; ++i) {
    p.workers.push_back({absl::StrCat("w", i), 64, 64, 1, 0.1});
    p.basis_share[absl::StrCat("w", i)] = 1.0 / workers;
  }
  return p;
}

size_t PayloadEntries(const AuditRecord& r) {
  size_t n = r.action.allocations.size() + r.previous_allocations.size();
  if (r.action.plan) n += r.action.plan->workers.size() + r.action.plan->basis_share.size();
  if (r.previous_plan) n += r.previous_plan->workers.size() + 1;
  return n;
}

TEST(HistoryMemoryTest, OnlyRecentOrUnmeasuredRecordsKeepPerWorkerPayloads) {
  constexpr int kWorkers = 4096;
  History h;
  const int64_t max_records = 1000;
  uint64_t unmeasured = 0;
  for (int i = 0; i < 400; ++i) {
    AuditRecord r;
    r.time_ms = 1000 * i;
    r.outcome = i % 3 == 2 ? AuditRecord::Outcome::kVetoed : AuditRecord::Outcome::kExecuted;
    r.veto_reason = absl::StrCat("reason ", i);  // never folds
    r.action.kind = i % 2 ? ActionKind::kReallocate : ActionKind::kAdjustBatch;
    if (r.action.kind == ActionKind::kAdjustBatch) {
      r.action.plan = WidePlan(i + 1, kWorkers);
      r.previous_plan = WidePlan(i, kWorkers);
    } else {
      for (int w = 0; w < kWorkers; ++w) r.action.allocations.push_back({absl::StrCat("w", w), 1, 1});
      r.previous_allocations = r.action.allocations;
    }
    const uint64_t id = h.Record(std::move(r), max_records);
    // Every executed record is measured a reconcile later, except record 7, which stays
    // unmeasured (its rollback may still need what it replaced).
    if (i > 0 && i - 1 != 7) {
      const AuditRecord* prev = h.FindRecord(id - 1);
      if (prev->outcome == AuditRecord::Outcome::kExecuted) h.SetMeasuredGain(id - 1, 0.1, r.time_ms);
    }
    if (i == 7) unmeasured = id;
  }
  size_t with_payload = 0, entries = 0;
  for (size_t i = 0; i < h.audit().size(); ++i) {
    const AuditRecord& r = h.audit()[i];
    const bool recent = i + History::kFullPayloadRecords >= h.audit().size();
    if (HasPayload(r)) ++with_payload;
    entries += PayloadEntries(r);
    if (!recent && r.id != unmeasured) {
      EXPECT_FALSE(HasPayload(r)) << "record " << r.id;
      // What stays: the plan's identity (versions only grow across a pacerd restart).
      if (r.action.kind == ActionKind::kAdjustBatch) {
        ASSERT_TRUE(r.action.plan.has_value());
        EXPECT_EQ(r.action.plan->version, r.id);
        EXPECT_EQ(r.action.plan->global_batch, kWorkers * 64);
      }
    }
  }
  EXPECT_EQ(h.audit().size(), 400u);
  EXPECT_TRUE(HasPayload(*h.FindRecord(unmeasured)));  // awaiting measurement: kept whole
  EXPECT_LE(with_payload, History::kFullPayloadRecords + 1);
  // Per-worker entries held: the bound of history.h, (32 + 1) records x 2 x W at most.
  EXPECT_LE(entries, (History::kFullPayloadRecords + 1) * 2 * (2 * kWorkers + 1));
}

// The bound holds across a restore and a trim: a History rebuilt from the journal (Apply) drops
// payloads exactly where the one that wrote it does, and a replay of everything the writer
// journaled (records as written, payloads dropped, measured gains, trims) ends where the writer
// is. Each record is measured a reconcile later but one (id 5), which keeps its payload.
TEST(HistoryMemoryTest, ARestoredHistoryDropsPayloadsWhereTheWriterDoes) {
  constexpr int kWorkers = 8;
  const int64_t max_records = 60;
  History writer, restored;
  writer.set_journaled(true);
  std::vector<ControllerUpdate> journal;
  auto step = [&](History& h, int i) {
    AuditRecord r;
    r.time_ms = 1000 * i;
    r.outcome = AuditRecord::Outcome::kExecuted;
    r.action.kind = ActionKind::kAdjustBatch;
    r.action.plan = WidePlan(i + 1, kWorkers);
    r.previous_plan = WidePlan(i, kWorkers);
    const uint64_t id = h.Record(std::move(r), max_records);
    if (id > 1 && id - 1 != 5) h.SetMeasuredGain(id - 1, 0.1, 1000 * i);
    if (id == 40) h.MarkRolledBack(id - 1);
  };
  for (int i = 0; i < 50; ++i) step(writer, i);
  for (auto& u : writer.TakeUpdates()) {
    ASSERT_TRUE(History::Validate(u).ok());
    restored.Apply(u);
    journal.push_back(std::move(u));
  }
  for (int i = 50; i < 120; ++i) {
    step(writer, i);
    step(restored, i);
  }
  for (auto& u : writer.TakeUpdates()) journal.push_back(std::move(u));
  History replayed;
  for (const auto& u : journal) replayed.Apply(u);

  ASSERT_EQ(writer.audit().size(), static_cast<size_t>(max_records));
  for (const History* h : {&restored, &replayed}) {
    ASSERT_EQ(h->audit().size(), writer.audit().size());
    for (size_t i = 0; i < writer.audit().size(); ++i) {
      const AuditRecord& w = writer.audit()[i];
      const AuditRecord& r = h->audit()[i];
      EXPECT_EQ(r.id, w.id);
      EXPECT_EQ(HasPayload(r), HasPayload(w)) << "record " << w.id;
      EXPECT_EQ(PayloadEntries(r), PayloadEntries(w)) << "record " << w.id;
      EXPECT_EQ(r.measured_gain.has_value(), w.measured_gain.has_value()) << "record " << w.id;
      EXPECT_EQ(r.rolled_back, w.rolled_back) << "record " << w.id;
      const bool recent = i + History::kFullPayloadRecords >= writer.audit().size();
      EXPECT_EQ(HasPayload(w), recent) << "record " << w.id;  // the unmeasured one is trimmed
    }
  }
}

}  // namespace
}  // namespace pacer
