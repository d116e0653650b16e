// The journal's integrity guarantees, at the ShardingJournal interface (RocksLog): format versions,
// the high-water mark (it holds every acknowledged update; its own format versions and torn
// writes), refusal of a journal shorter than acknowledged — after a crash too — a full disk
// that recovers, and power loss (unsynced data dropped) that loses nothing acknowledged.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/file_system.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "absl/strings/str_cat.h"
#include "journal/high_water_mark.h"
#include "journal/rocks_log.h"
#include "sharding_service/sharding_service.h"
#include "tests/testing/fault_injection_fs.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::FaultInjectionFs;
using testing::TempDir;
using testing::WaitFor;

Update Lost(uint64_t seq) {
  Update u;
  u.set_seq(seq);
  u.mutable_worker_lost()->set_worker_id("w" + std::to_string(seq));
  return u;
}

// Opens `o` and counts what it replays.
struct Replayed {
  uint64_t snapshot_seq = 0;
  uint64_t updates = 0;
  uint64_t last = 0;
};
absl::StatusOr<std::unique_ptr<ShardingJournal>> OpenCounting(const JournalOptions& o, Replayed* r) {
  *r = {};
  return ShardingJournal::Open(
      o,
      [r](const ShardingSnapshot& s) {
        r->snapshot_seq = r->last = s.seq();
        return absl::OkStatus();
      },
      [r](const Update& u) {
        r->updates++;
        r->last = u.seq();
        return absl::OkStatus();
      });
}

void AppendAndFlush(ShardingJournal& j, uint64_t from, uint64_t to) {
  for (uint64_t s = from; s <= to; ++s) j.Append(Lost(s));
  ASSERT_TRUE(j.Flush().ok());
}

std::string Format(const std::string& dir) {
  rocksdb::DB* db = nullptr;
  EXPECT_TRUE(rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir, &db).ok());
  std::string v;
  if (db) (void)db->Get(rocksdb::ReadOptions(), "m:format", &v);
  delete db;
  return v;
}

void SetFormat(const std::string& dir, const std::string& format) {
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &db).ok());
  rocksdb::WriteOptions wo;
  wo.sync = true;
  ASSERT_TRUE(db->Put(wo, "m:format", format).ok());
  delete db;
}

TEST(JournalFormatTest, NewDirsAreV4V2AndV3AreReadAndUpgradedAfterTheFirstCommitUnknownIsRefused) {
  TempDir dir;
  JournalOptions o{dir.Sub("journal"), true};
  Replayed r;
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_TRUE((*j)->recovery().created);
    AppendAndFlush(**j, 1, 3);
  }
  EXPECT_EQ(Format(o.dir), kJournalFormatV5);

  // A dir written as v2 (today's main): replayed; the key stays v2 until a group is written.
  SetFormat(o.dir, kJournalFormatV2);
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(r.updates, 3u);
    EXPECT_EQ((*j)->recovery().format, kJournalFormatV2);
  }
  EXPECT_EQ(Format(o.dir), kJournalFormatV2) << "upgraded although nothing was written at v5";
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    AppendAndFlush(**j, 4, 4);
  }
  EXPECT_EQ(Format(o.dir), kJournalFormatV5);
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(r.updates, 4u);
  }
  // And one written as v3 (the format before pinned entries) likewise.
  SetFormat(o.dir, kJournalFormatV3);
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ((*j)->recovery().format, kJournalFormatV3);
    AppendAndFlush(**j, 5, 5);
  }
  EXPECT_EQ(Format(o.dir), kJournalFormatV5);
  // And one written as v4 (before delete / reset of a dataset).
  SetFormat(o.dir, kJournalFormatV4);
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ((*j)->recovery().format, kJournalFormatV4);
    EXPECT_EQ(r.updates, 5u);
    AppendAndFlush(**j, 6, 6);
  }
  EXPECT_EQ(Format(o.dir), kJournalFormatV5);

  // A newer binary's format: refused, naming both.
  SetFormat(o.dir, "pacer-journal-v9");
  auto j = OpenCounting(o, &r);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(j.status().message().find("pacer-journal-v9"), std::string::npos) << j.status();
  EXPECT_NE(j.status().message().find(kJournalFormatV5), std::string::npos) << j.status();
}

absl::StatusOr<std::optional<HighWaterMark::Found>> ReadMark(const JournalOptions& o) {
  return HighWaterMark::Read(rocksdb::FileSystem::Default().get(), RocksLog::HwmPath(o));
}

TEST(JournalHwmTest, TheMarkHoldsEveryAcknowledgedUpdateWhenItIsAcknowledged) {
  TempDir dir;
  JournalOptions o{dir.Sub("journal"), true};
  Replayed r;
  auto j = OpenCounting(o, &r);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)->stats().hwm_seq, 0u);
  EXPECT_TRUE(std::filesystem::exists(RocksLog::HwmPath(o)));
  for (uint64_t s = 1; s <= 20; ++s) {
    (*j)->Append(Lost(s));
    // What the mark held when the update was acknowledged (the callback runs on the journal's
    // thread; the promise outlives this scope whatever happens).
    auto acknowledged = std::make_shared<std::promise<std::pair<absl::Status, uint64_t>>>();
    ShardingJournal* journal = j->get();
    journal->WhenDurable(s, [acknowledged, journal](absl::Status st) {
      acknowledged->set_value({st, journal->stats().hwm_seq});
    });
    const auto [status, marked_when_acknowledged] = acknowledged->get_future().get();
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_GE(marked_when_acknowledged, s) << "update " << s << " acknowledged before the mark held it";
    auto mark = ReadMark(o);  // on disk, not only in memory
    ASSERT_TRUE(mark.ok() && mark->has_value()) << mark.status();
    EXPECT_GE((*mark)->seq, s);
  }
  // Groups written while a mark is being written share the next mark: at most one a group.
  for (uint64_t s = 21; s <= 60; ++s) (*j)->Append(Lost(s));
  ASSERT_TRUE((*j)->Flush().ok());
  EXPECT_LE((*j)->stats().hwm_writes, (*j)->stats().batches);
  EXPECT_EQ((*j)->stats().hwm_seq, 60u);
  j->reset();
  auto mark = ReadMark(o);
  ASSERT_TRUE(mark.ok() && mark->has_value()) << mark.status();
  EXPECT_EQ((*mark)->seq, 60u);
  EXPECT_EQ((*mark)->format, kHwmFormatV2);
  EXPECT_FALSE((*mark)->torn);
}

// pacerd kill -9'ed, then the last 100 bytes of the live WAL cut. The cut
// takes acknowledged groups off the WAL's end, which RocksDB cannot tell from a torn last
// record (a write in progress, never acknowledged: dropped, see below); the mark can, because
// it holds every acknowledged update. Before, the mark lagged the acknowledged seq by up to
// hwm_interval_ms (100 ms) and the journal opened without a word at a lower seq: acknowledged
// updates lost, their records delivered again.
TEST(JournalHwmTest, AWalCutBackAfterAKillIsRefusedNamingTheMarkAndTheMissingUpdates) {
  TempDir dir;
  auto fs = std::make_shared<FaultInjectionFs>();
  JournalOptions o{dir.Sub("journal"), true};
  o.fs = fs;
  // The old mark's 100 ms lag stretched over the whole test, so that what the code before this
  // test did (open at a lower seq) does not depend on timing. The journal must not need it.
  o.hwm_interval_ms = 3'600'000;
  Replayed r;
  constexpr uint64_t kAcknowledged = 30;
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    for (uint64_t s = 1; s <= kAcknowledged; ++s) AppendAndFlush(**j, s, s);  // a group each
    // kill -9: the process goes without writing anything more (no clean-shutdown mark); what
    // it wrote stays (no power loss).
    fs->SetFault(FaultInjectionFs::Fault::kIoError);
  }
  fs->SetFault(FaultInjectionFs::Fault::kNone);
  const std::string wal = testing::LiveWal(o.dir);
  ASSERT_FALSE(wal.empty());
  std::filesystem::resize_file(wal, std::filesystem::file_size(wal) - 100);

  auto refused = OpenCounting(o, &r);
  ASSERT_FALSE(refused.ok()) << "opened at update " << r.last << " although " << kAcknowledged
                             << " were acknowledged";
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  const std::string message(refused.status().message());
  ASSERT_LT(r.last, kAcknowledged) << "the cut took nothing: no acknowledged update was cut";
  EXPECT_GE(r.last, kAcknowledged - 5) << "100 bytes are a few groups of one update";
  EXPECT_NE(message.find(RocksLog::HwmPath(o)), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat("recovered updates up to ", r.last)), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat(kAcknowledged - r.last, " acknowledged updates are missing")),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(o.dir), std::string::npos) << message;
}

TEST(JournalHwmTest, AJournalShorterThanTheMarkIsRefusedUnlessTheLossIsAccepted) {
  TempDir dir;
  JournalOptions o{dir.Sub("journal"), true};
  Replayed r;
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok());
    AppendAndFlush(**j, 1, 10);
  }
  // The folder is deleted: a fresh start at seq 0 would be a silent loss.
  std::filesystem::remove_all(o.dir);
  auto refused = OpenCounting(o, &r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find(o.dir), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("up to 10"), std::string::npos) << refused.status();
  EXPECT_FALSE(std::filesystem::exists(o.dir)) << "a refused open must not create the folder";

  // The folder exists but is empty, with must_exist (the identity says it was created).
  std::filesystem::create_directories(o.dir);
  JournalOptions strict = o;
  strict.must_exist = true;
  auto empty = OpenCounting(strict, &r);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(empty.status().message().find("IDENTITY"), std::string::npos) << empty.status();

  // The operator accepts: starts empty, the mark is reset, the loss is reported.
  JournalOptions accept = o;
  accept.accept_data_loss = true;
  {
    auto j = OpenCounting(accept, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(r.last, 0u);
    EXPECT_NE((*j)->recovery().accepted_loss.find("10 acknowledged updates are missing"),
              std::string::npos)
        << (*j)->recovery().accepted_loss;
  }
  auto again = OpenCounting(o, &r);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->recovery().accepted_loss.empty());
}

TEST(JournalHwmTest, ADataDirFromBeforeTheMarkIsAdopted) {
  TempDir dir;
  JournalOptions o{dir.Sub("journal"), true};
  Replayed r;
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok());
    AppendAndFlush(**j, 1, 7);
  }
  std::filesystem::remove(RocksLog::HwmPath(o));
  auto j = OpenCounting(o, &r);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE((*j)->recovery().adopted);
  EXPECT_EQ(r.last, 7u);
  EXPECT_EQ((*j)->stats().hwm_seq, 7u);
  j->reset();
  // With must_exist (an identity), a missing mark is refused instead.
  std::filesystem::remove(RocksLog::HwmPath(o));
  JournalOptions strict = o;
  strict.must_exist = true;
  auto refused = OpenCounting(strict, &r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find(".hwm"), std::string::npos) << refused.status();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A mark written by the code before (format v1, one text line) is read, and rewritten as v2 at
// the open; it still refuses a shorter journal. A mark of a newer pacerd is refused, even by an
// operator accepting a loss.
TEST(JournalHwmTest, AMarkOfTheFormerFormatIsReadAndRewrittenANewerOneIsRefused) {
  TempDir dir;
  JournalOptions o{dir.Sub("journal"), true};
  const std::string hwm = RocksLog::HwmPath(o);
  Replayed r;
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    AppendAndFlush(**j, 1, 7);
  }
  WriteFile(hwm, "pacer-journal-hwm-v1 seq=7\n");  // what a data dir of the code before holds
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(r.last, 7u);
    EXPECT_EQ((*j)->recovery().hwm_format, kHwmFormatV1);
    EXPECT_EQ((*j)->recovery().hwm_seq, 7u);
    auto mark = ReadMark(o);
    ASSERT_TRUE(mark.ok() && mark->has_value()) << mark.status();
    EXPECT_EQ((*mark)->format, kHwmFormatV2) << "not rewritten at the open";
    EXPECT_EQ((*mark)->seq, 7u);
    AppendAndFlush(**j, 8, 9);
  }
  WriteFile(hwm, "pacer-journal-hwm-v1 seq=11\n");
  auto shorter = OpenCounting(o, &r);
  ASSERT_EQ(shorter.status().code(), absl::StatusCode::kDataLoss) << shorter.status();
  EXPECT_NE(shorter.status().message().find("2 acknowledged updates are missing"), std::string::npos)
      << shorter.status();

  WriteFile(hwm, "pacer-journal-hwm-v3 seq=9 whatever comes next\n");
  for (const bool accept : {false, true}) {
    JournalOptions opts = o;
    opts.accept_data_loss = accept;
    auto newer = OpenCounting(opts, &r);
    ASSERT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition) << newer.status();
    EXPECT_NE(newer.status().message().find(hwm), std::string::npos) << newer.status();
    EXPECT_NE(newer.status().message().find("pacer-journal-hwm-v3"), std::string::npos) << newer.status();
    EXPECT_NE(newer.status().message().find(kHwmFormatV2), std::string::npos) << newer.status();
  }
  WriteFile(hwm, "not a mark\n");
  EXPECT_EQ(OpenCounting(o, &r).status().code(), absl::StatusCode::kDataLoss);
}

// A mark is written in place into the slot not holding the current one. A power loss during
// that write tears at most that slot — its group was never acknowledged — and the other slot
// still holds the previous mark: the journal opens with no operator. Only a file with no valid
// slot is damage.
TEST(JournalHwmTest, ATornMarkWriteKeepsThePreviousMark) {
  TempDir dir;
  JournalOptions o{dir.Sub("journal"), true};
  const std::string hwm = RocksLog::HwmPath(o);
  Replayed r;
  {
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    AppendAndFlush(**j, 1, 12);
  }
  using HWM = HighWaterMark;
  const std::string previous = HWM::SlotForTest(5, 10);
  const std::string newest = HWM::SlotForTest(6, 12);
  // As a torn write leaves it: the start of the new line (into its seq), then the bytes it was
  // overwriting — neither line.
  const std::string torn = newest.substr(0, 60) + HWM::SlotForTest(4, 8).substr(60);
  struct Case {
    std::string file;
    uint64_t mark;
    bool torn;
  };
  for (const Case& c : {Case{previous + newest, 12, false}, Case{newest + previous, 12, false},
                        Case{previous + torn, 10, true}, Case{torn + previous, 10, true},
                        Case{previous.substr(0, 100), 10, true}}) {
    SCOPED_TRACE(c.mark);
    WriteFile(hwm, c.file);
    auto mark = ReadMark(o);
    ASSERT_TRUE(mark.ok() && mark->has_value()) << mark.status();
    EXPECT_EQ((*mark)->seq, c.mark);
    EXPECT_EQ((*mark)->torn, c.torn);
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(r.last, 12u);
    EXPECT_EQ((*j)->recovery().hwm_seq, c.mark);
    EXPECT_EQ((*j)->recovery().hwm_torn, c.torn);
  }
  WriteFile(hwm, torn + torn);
  auto damaged = OpenCounting(o, &r);
  ASSERT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_NE(damaged.status().message().find(hwm), std::string::npos) << damaged.status();
  EXPECT_NE(damaged.status().message().find("damaged"), std::string::npos) << damaged.status();
}

TEST(JournalFaultTest, AFullDiskFailsWritesCleanlyAndRecoverResumesFromWhatIsDurable) {
  TempDir dir;
  auto fs = std::make_shared<FaultInjectionFs>();
  JournalOptions o{dir.Sub("journal"), true};
  o.fs = fs;
  Replayed r;
  auto j = OpenCounting(o, &r);
  ASSERT_TRUE(j.ok()) << j.status();
  AppendAndFlush(**j, 1, 20);

  fs->SetFault(FaultInjectionFs::Fault::kNoSpace);
  (*j)->Append(Lost(21));
  absl::Status failed = (*j)->Flush();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failed.message().find("disk full"), std::string::npos) << failed;
  EXPECT_FALSE((*j)->health().ok());
  // Waiters fail at once; nothing more is written.
  absl::Status waited;
  (*j)->WhenDurable(21, [&](absl::Status s) { waited = s; });
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  // While the disk is full, recovery fails cleanly (no abort) and can be retried.
  auto noop_snap = [](const ShardingSnapshot&) { return absl::OkStatus(); };
  uint64_t last = 0;
  auto note = [&](const Update& u) {
    last = u.seq();
    return absl::OkStatus();
  };
  EXPECT_FALSE((*j)->Recover(noop_snap, note).ok());
  EXPECT_FALSE((*j)->Recover(noop_snap, note).ok());

  fs->SetFault(FaultInjectionFs::Fault::kNone);
  last = 0;
  ASSERT_TRUE((*j)->Recover(noop_snap, note).ok());
  EXPECT_TRUE((*j)->health().ok());
  EXPECT_EQ(last, 20u) << "update 21 was never acknowledged: not recovered";
  EXPECT_EQ((*j)->last_seq(), 20u);
  AppendAndFlush(**j, 21, 25);
  EXPECT_EQ((*j)->stats().recoveries, 1u);
  j->reset();
  auto reopened = OpenCounting(o, &r);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(r.last, 25u);
}

TEST(JournalFaultTest, PowerLossDropsOnlyUnsyncedDataNeverAnAcknowledgedUpdate) {
  TempDir dir;
  auto fs = std::make_shared<FaultInjectionFs>();
  JournalOptions o{dir.Sub("journal"), true};
  o.fs = fs;
  uint64_t acknowledged = 0, seq = 0;
  for (int cycle = 0; cycle < 20; ++cycle) {
    Replayed r;
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << "cycle " << cycle << ": " << j.status();
    ASSERT_GE(r.last, acknowledged) << "cycle " << cycle;
    seq = r.last;
    for (int i = 0; i < 30; ++i) {
      (*j)->Append(Lost(++seq));
      if (i % 3 == 0) {
        ASSERT_TRUE((*j)->Flush().ok());
        acknowledged = seq;
      }
    }
    // The machine stops: nothing more reaches the disk, the process goes, unsynced data too.
    fs->SetFault(FaultInjectionFs::Fault::kIoError);
    j->reset();
    fs->DropUnsyncedData();
    fs->SetFault(FaultInjectionFs::Fault::kNone);
  }
}

// The power goes while a group is being written: part of its WAL record reaches the disk (the
// write landed, its fsync never returned, so the update was never acknowledged). The journal
// opens with default options — no operator, no accepted loss — and holds every acknowledged
// update; the torn record is gone. Its WAL is really torn: a journal refusing torn tails
// (kAbsoluteConsistency) refuses this dir.
TEST(JournalFaultTest, APowerLossThatTearsTheLastRecordNeedsNoOperatorAndLosesNothingAcknowledged) {
  for (const double fraction : {0.01, 0.5, 0.99}) {
    SCOPED_TRACE(fraction);
    TempDir dir;
    auto fs = std::make_shared<FaultInjectionFs>();
    JournalOptions o{dir.Sub("journal"), true};
    o.fs = fs;
    o.must_exist = false;
    Replayed r;
    {
      auto j = OpenCounting(o, &r);
      ASSERT_TRUE(j.ok()) << j.status();
      AppendAndFlush(**j, 1, 10);  // acknowledged
      fs->SetFault(FaultInjectionFs::Fault::kSyncFails);
      Update big = Lost(11);
      big.mutable_worker_lost()->set_worker_id(std::string(3000, 'x'));  // one record, 3 KB
      (*j)->Append(big);
      EXPECT_FALSE((*j)->Flush().ok()) << "the fsync failed: never acknowledged";
    }
    uint64_t wal_tail = 0;
    const uint64_t torn_before = fs->torn_files();
    fs->DropUnsyncedData([&](const std::string& path, uint64_t tail) -> uint64_t {
      if (path.size() < 4 || path.compare(path.size() - 4, 4, ".log") != 0) return 0;
      wal_tail = tail;
      return static_cast<uint64_t>(static_cast<double>(tail) * fraction);
    });
    fs->SetFault(FaultInjectionFs::Fault::kNone);
    ASSERT_GT(wal_tail, 3000u) << "the unsynced record did not reach the WAL";
    ASSERT_EQ(fs->torn_files(), torn_before + 1) << "the WAL's last record is not torn";
    {
      rocksdb::Options strict;
      strict.wal_recovery_mode = rocksdb::WALRecoveryMode::kAbsoluteConsistency;
      rocksdb::DB* db = nullptr;
      const rocksdb::Status st = rocksdb::DB::OpenForReadOnly(strict, o.dir, &db);
      delete db;
      EXPECT_FALSE(st.ok()) << "absolute consistency accepted the torn WAL: the case is not torn";
    }
    auto j = OpenCounting(o, &r);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(r.last, 10u) << "every acknowledged update, and not the torn one";
    EXPECT_TRUE((*j)->recovery().accepted_loss.empty());
    AppendAndFlush(**j, 11, 12);  // and it continues from there
    j->reset();
    auto again = OpenCounting(o, &r);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(r.last, 12u);
  }
}

}  // namespace
}  // namespace pacer
