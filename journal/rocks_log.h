// RocksLog: the DurableLog (journal/durable_log.h) in one RocksDB instance, plus a high-water
// mark file. Both state machines' journals are one of these: the sharding core's in
// <data-dir>/journal, the controller's in <data-dir>/controller.
//
// Layout of the RocksDB folder (JournalOptions::dir):
//   "m:format"        -> the owner's format (JournalOptions::format: the sharding journal's
//                        "pacer-journal-v5"; readable older ones are upgraded in the same
//                        WriteBatch as the first group written by this binary)
//   "j" + BE64(seq)   -> a record: the serialized updates seq, seq+1, ... of one group commit,
//                        each as field 1 (length-delimited) of one message (JournalRecord)
//   "s" + BE64(seq)   -> the serialized snapshot holding every update <= seq
//   "p" + key         -> a pinned entry (v4): an immutable value a snapshot refers to
// A group is one WriteBatch with sync=true; a snapshot is written in the batch of the updates
// before it, together with a range delete of the entries <= its seq and of the previous
// snapshot, the pinned entries it lists that are not on disk yet, and deletes of those on disk
// it no longer lists, atomically. (v4 differs from v3 only by pinned entries: a v3 binary must
// not read a v4 dir, whose snapshots name specs it cannot find; v5 differs from v4 only by the
// DeleteDatasetUpdate and ResetDatasetUpdate kinds, unknown to a v4 binary.)
// A folder of an older store (no format key; JournalOptions::import_legacy recognises it) is
// imported once: its content becomes the snapshot at seq 1, written with the format key and the
// deletes of the old keys in one synced batch (the high-water mark, 1, written just before).
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
//  3. Replay: a gap, an unparsable entry or snapshot (the owner's callback says INVALID_ARGUMENT),
//     or one that does not apply is DATA_LOSS naming the key.
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

#include "journal/durable_log.h"

namespace rocksdb {
class DB;
class Env;
}  // namespace rocksdb

namespace pacer {

class RocksLog final : public DurableLog {
 public:
  static absl::StatusOr<std::unique_ptr<RocksLog>> Open(const JournalOptions& options,
                                                        const Replay& replay);
  ~RocksLog() override;

  void Append(uint64_t seq, std::string bytes) override;
  void AppendAll(std::vector<std::pair<uint64_t, std::string>> updates) override;
  void WriteSnapshot(uint64_t seq, std::shared_ptr<const google::protobuf::MessageLite> snapshot,
                     std::vector<PinnedEntry> pinned) override;
  absl::Status ReadFrom(uint64_t seq, const EntryFn& on_update) const override;
  void WhenDurable(uint64_t seq, Done done) override;
  absl::Status Flush() override;
  absl::Status health() const override;
  absl::Status Recover(const Replay& replay) override;
  uint64_t last_seq() const override;
  JournalStats stats() const override;
  JournalRecovery recovery() const override;

  // The high-water mark file of `options` (default: dir + ".hwm").
  static std::string HwmPath(const JournalOptions& options);

 private:
  struct Opened;
  RocksLog(JournalOptions options, std::unique_ptr<rocksdb::Env> env);
  // Opens RocksDB and replays it; checks what it recovered against the high-water mark (and,
  // when recovering after a failed write, against `min_seq`, the seq this process knows
  // durable). Writes the mark.
  absl::StatusOr<Opened> OpenAndReplay(const Replay& replay, uint64_t min_seq);
  // The records from the one holding update `from` (exact: starting at `from`) to the end,
  // each update >= from into `fn`; a gap or a corrupt record is DATA_LOSS.
  absl::Status ReadRecords(rocksdb::DB& db, uint64_t from, bool exact, const EntryFn& fn) const;
  void Install(Opened opened);  // under mu_ (or before the threads start)
  absl::Status WriteHwm(uint64_t seq);  // under hwm_mu_
  void WriterLoop();
  void HwmLoop();

  struct Entry {
    uint64_t seq;
    std::string bytes;                            // an update, serialized
    std::shared_ptr<const google::protobuf::MessageLite> snapshot;  // or a snapshot (serialized by the writer)
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
  bool upgrade_format_ = false;     // an older readable format: rewrite it with the next group
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
