// RocksJournal: the Journal (journal.h) in one RocksDB instance, plus a high-water mark file.
//
// Layout of the RocksDB folder (JournalOptions::dir):
//   "m:format"        -> "pacer-journal-v5" (v2, v3 and v4 dirs are read, and upgraded to v5 in
//                        the same WriteBatch as the first group written by this binary)
//   "j" + BE64(seq)   -> JournalRecord: the updates seq, seq+1, ... of one group commit
//   "s" + BE64(seq)   -> serialized ShardingSnapshot holding every update <= seq
//   "p" + key         -> a pinned entry (v4): an immutable value a snapshot refers to
// A group is one WriteBatch with sync=true; a snapshot is written in the batch of the updates
// before it, together with a range delete of the entries <= its seq and of the previous
// snapshot, the pinned entries it lists that are not on disk yet, and deletes of those on disk
// it no longer lists, atomically. (v4 differs from v3 only by pinned entries: a v3 binary must
// not read a v4 dir, whose snapshots name specs it cannot find; v5 differs from v4 only by the
// DeleteDatasetUpdate and ResetDatasetUpdate kinds, unknown to a v4 binary.)
//
// Never less than acknowledged (the checks on Open, in order):
//  1. RocksDB refuses WAL damage instead of rolling back to a point in time, except a torn
//     tail (WALRecoveryMode::kTolerateCorruptedTailRecords, paranoid checks, closed WALs tracked
//     in the MANIFEST): the last record cut short is a write in progress at a power loss or a
//     full disk — with sync=true never acknowledged — and is dropped, so a real power loss
//     needs no operator; a bit-flipped record, a missing WAL, a missing MANIFEST or CURRENT is
//     DATA_LOSS naming the folder and the files. A WAL cut back by more than its torn record is
//     caught by 4.
//  2. The format key must be a known format; unknown (a newer pacerd) is FAILED_PRECONDITION
//     naming both.
//  3. Replay: a gap, an unparsable entry or snapshot is DATA_LOSS naming the key.
//  4. The high-water mark (`<dir>.hwm`, outside the folder, written through the same file
//     system: temp file + fsync + rename + directory fsync) holds a seq known durable. The
//     recovered seq must be >= it; if not, DATA_LOSS says how many acknowledged updates are
//     missing. A missing folder with a mark > 0, or with must_exist, is DATA_LOSS too.
// The mark is written only after RocksDB's synced write returned OK, so it never exceeds what
// RocksDB has durably: by a background thread every hwm_interval_ms while running (off the
// group-commit path: no fsync is added to a commit's latency), exactly at a clean close, and
// at each open (the recovered seq). After a clean stop it is exact, so any acknowledged update
// missing (a WAL truncated by any amount) is refused by 4. Under kill -9 or power loss it lags
// by <= ~hwm_interval_ms of acknowledged updates: a loss confined to that window, at the very
// end of the WAL, cannot be told from a torn tail.
//
// Thread-safe (see journal.h). Waiters run on the writer thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sharding_service/journal.h"

namespace rocksdb {
class DB;
class Env;
}  // namespace rocksdb

namespace pacer {

inline constexpr char kJournalFormatV2[] = "pacer-journal-v2";
inline constexpr char kJournalFormatV3[] = "pacer-journal-v3";
inline constexpr char kJournalFormatV4[] = "pacer-journal-v4";
// v5: as v4, with DeleteDatasetUpdate / ResetDatasetUpdate (a v4 build would not know them).
inline constexpr char kJournalFormatV5[] = "pacer-journal-v5";  // written

class RocksJournal final : public Journal {
 public:
  static absl::StatusOr<std::unique_ptr<RocksJournal>> Open(const JournalOptions& options,
                                                            const SnapshotFn& on_snapshot,
                                                            const UpdateFn& on_update,
                                                            const PinnedFn& on_pinned = nullptr);
  ~RocksJournal() override;

  using Journal::Recover;
  using Journal::WriteSnapshot;
  void Append(const Update& update) override;
  void AppendAll(const std::vector<Update>& updates) override;
  void WriteSnapshot(ShardingSnapshot snapshot, std::vector<PinnedEntry> pinned) override;
  void WhenDurable(uint64_t seq, Done done) override;
  absl::Status Flush() override;
  absl::Status health() const override;
  absl::Status Recover(const SnapshotFn& on_snapshot, const UpdateFn& on_update,
                       const PinnedFn& on_pinned) override;
  uint64_t last_seq() const override;
  JournalStats stats() const override;
  JournalRecovery recovery() const override;

  // The high-water mark file of `options` (default: dir + ".hwm").
  static std::string HwmPath(const JournalOptions& options);

 private:
  struct Opened;
  RocksJournal(JournalOptions options, std::unique_ptr<rocksdb::Env> env);
  // Opens RocksDB and replays it; checks what it recovered against the high-water mark (and,
  // when recovering after a failed write, against `min_seq`, the seq this process knows
  // durable). Writes the mark.
  absl::StatusOr<Opened> OpenAndReplay(const SnapshotFn& on_snapshot, const UpdateFn& on_update,
                                       const PinnedFn& on_pinned, uint64_t min_seq);
  void Install(Opened opened);  // under mu_ (or before the threads start)
  absl::Status WriteHwm(uint64_t seq);  // under hwm_mu_
  void WriterLoop();
  void HwmLoop();

  struct Entry {
    uint64_t seq;
    std::string bytes;                            // an update, serialized
    std::shared_ptr<ShardingSnapshot> snapshot;   // or a snapshot (serialized by the writer)
    std::vector<PinnedEntry> pinned;              // the snapshot's pinned entries
  };

  const JournalOptions options_;
  const std::string hwm_path_;
  std::shared_ptr<rocksdb::FileSystem> fs_;
  std::unique_ptr<rocksdb::Env> env_;  // owns a composite env when options_.fs is set
  std::unique_ptr<rocksdb::DB> db_;    // null after a failed Recover()
  mutable std::mutex mu_;
  std::condition_variable cv_;          // wakes the writer
  std::condition_variable durable_cv_;  // wakes Flush()
  std::condition_variable hwm_cv_;      // wakes the high-water mark thread (stop)
  std::vector<Entry> queue_;
  std::multimap<uint64_t, Done> waiters_;
  uint64_t last_seq_ = 0;           // last appended
  uint64_t durable_seq_ = 0;        // last written (synced)
  uint64_t last_snapshot_seq_ = 0;  // newest snapshot on disk
  std::set<std::string> pinned_;    // keys of the pinned entries on disk
  bool upgrade_format_ = false;     // a v2/v3 dir: write v4 with the next group
  absl::Status health_;
  absl::Status failure_;  // the write failure a failed Recover() still reports
  bool stopping_ = false;
  JournalStats stats_;
  JournalRecovery recovery_;
  // Lock order: mu_ before hwm_mu_; WriteHwm() takes no other lock.
  std::mutex hwm_mu_;  // serialises writes of the mark
  uint64_t hwm_written_ = 0;
  std::atomic<uint64_t> hwm_seq_{0};  // == hwm_written_, readable without hwm_mu_
  std::thread writer_;
  std::thread hwm_thread_;
};

}  // namespace pacer
