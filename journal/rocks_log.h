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
//     system; format and torn writes: journal/high_water_mark.h) holds a seq known durable,
//     never below an acknowledged one. The recovered seq must be >= it; if not, DATA_LOSS says
//     how many acknowledged updates are missing. A missing folder with a mark > 0, or with
//     must_exist, is DATA_LOSS too. A mark of another version is FAILED_PRECONDITION.
//
// Acknowledging a group (sync=true, mark_before_ack; the DurableLog protocol's step 2 and 3):
//  1. The writer thread takes everything queued and writes it as one WriteBatch with
//     sync=true; then written_seq_ = the group's last seq, and it wakes the marker.
//  2. The marker thread writes written_seq_ into the mark in place (pwrite + fdatasync of one
//     84-byte line, into the slot not holding the current mark), then durable_seq_ =
//     that seq and the waiters up to it run: only now is the group acknowledged.
//  3. Meanwhile the writer already writes the next group (the two fsyncs overlap: group k's
//     mark with group k+1's WAL), and a mark covers every group written before it, so at
//     high concurrency one mark write acknowledges several groups and throughput stays close
//     to that of the WAL's fsyncs; a single caller waits for both fsyncs in turn.
// So the mark never exceeds what RocksDB holds durably (it follows a synced write) and never
// falls below an acknowledged update (it precedes the acknowledgment). After kill -9 or a
// power loss, the only updates the WAL may hold beyond the mark were never acknowledged: a
// torn last record (a group whose write was in progress) or whole groups written but not yet
// marked — dropping them is no loss. A WAL cut back by any amount below the mark — truncated,
// a lost tail of whole records, cut to zero — is refused by 4. A failed mark write fails the
// group like a failed WAL write (the journal turns unhealthy; Recover()). A torn mark write
// damages only the slot being written, whose group was never acknowledged.
// The mark is also written whole at each open (the recovered seq; a v1 mark is upgraded then)
// and is exact after a clean close. With mark_before_ack=false (sharding_bench's comparison
// only) a background thread lets it follow every hwm_interval_ms instead, and after a crash it
// lags the acknowledged seq by up to that; with sync=false (benchmarks) it is written only at
// open and at a clean close.
//
// Thread-safe (see journal.h). Waiters run on the thread that acknowledges their group: the
// marker with marks_ack_, else the writer.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "journal/durable_log.h"
#include "journal/high_water_mark.h"

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
  // OpenAndReplay's steps, in order (each may refuse the open; what an accepted loss gave up is
  // collected in the context).
  struct OpenContext {
    std::optional<uint64_t> hwm;        // the high-water mark found
    bool exists = false;                // a database was there
    std::vector<std::string> accepted;  // what the operator accepted, in words
  };
  absl::Status ReadMarkAndFolder(OpenContext* ctx, Opened* out);
  absl::Status OpenDatabase(OpenContext* ctx, Opened* out);
  absl::Status CheckFormat(OpenContext* ctx, Opened* out);
  absl::Status ReplayInto(OpenContext* ctx, Opened* out, const Replay& replay);
  absl::Status CheckAcknowledged(OpenContext* ctx, Opened* out, uint64_t min_seq);
  // The records from the one holding update `from` (exact: starting at `from`) to the end,
  // each update >= from into `fn`; a gap or a corrupt record is DATA_LOSS.
  absl::Status ReadRecords(rocksdb::DB& db, uint64_t from, bool exact, const EntryFn& fn) const;
  void Install(Opened opened) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriterLoop();
  // Acknowledges what the writer wrote once the mark holds it (mark_before_ack).
  void MarkLoop();
  // Lets the mark follow every hwm_interval_ms (sync=false or mark_before_ack=false).
  void HwmLoop();
  // Moves the waiters for seqs <= up_to to `ready`, to be run without mu_. Under mu_.
  void TakeWaiters(uint64_t up_to, std::vector<Done>* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  mutable absl::Mutex mu_;
  absl::CondVar cv_;          // wakes the writer
  absl::CondVar durable_cv_;  // wakes Flush()
  absl::CondVar hwm_cv_;      // wakes HwmLoop (stop)
  absl::CondVar mark_cv_;     // wakes the marker (a group written, or the writer done)
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  std::multimap<uint64_t, Done> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;           // last appended
  uint64_t written_seq_ ABSL_GUARDED_BY(mu_) = 0;        // last written (synced) to RocksDB
  uint64_t durable_seq_ ABSL_GUARDED_BY(mu_) = 0;        // last acknowledged: written and, with marks_ack_, marked
  uint64_t last_snapshot_seq_ ABSL_GUARDED_BY(mu_) = 0;  // newest snapshot on disk
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;              // +1 at each Install(): a mark of an older epoch is moot
  std::set<std::string> pinned_ ABSL_GUARDED_BY(mu_);    // keys of the pinned entries on disk
  bool upgrade_format_ ABSL_GUARDED_BY(mu_) = false;     // an older readable format: rewrite it with the next group
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // the write failure a failed Recover() still reports
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;  // the writer has written everything queued and exited
  JournalStats stats_ ABSL_GUARDED_BY(mu_);
  JournalRecovery recovery_ ABSL_GUARDED_BY(mu_);
  // A group is acknowledged only once the mark holds it (sync && mark_before_ack).
  const bool marks_ack_;
  // Lock order: mu_ before hwm_mu_; the mark is written holding hwm_mu_ only.
  absl::Mutex hwm_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::unique_ptr<HighWaterMark> hwm_ ABSL_GUARDED_BY(hwm_mu_);  // replaced at each (re)open
  std::atomic<uint64_t> hwm_seq_{0};  // == hwm_->seq(), readable without hwm_mu_
  std::thread writer_;
  std::thread hwm_thread_;  // MarkLoop or HwmLoop
};

}  // namespace pacer
