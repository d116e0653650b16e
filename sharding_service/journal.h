// Journal: the durable log of sharding updates plus periodic snapshots — the interface.
//
// The service depends only on this class; RocksJournal (rocks_journal.h) is today's
// implementation, and a replicated one (pacerd's state on etcd) can take its place later. An
// implementation owns durability, ordering and recovery; it knows nothing of what an update
// means.
//
// Group commit (the protocol every implementation keeps, once):
//  1. The service, holding its state lock, applies an update and calls Append(): this only
//     queues the serialized update (no I/O under the lock). Update seqs are 1, 2, 3, ... without
//     gaps.
//  2. A writer takes *everything* queued and makes it durable as one group (RocksDB: one
//     WriteBatch with sync=true — one memtable insert and one fsync for the whole group), then
//     advances durable_seq.
//  3. Callers wait with WhenDurable(seq, done); `done` runs once durable_seq >= seq. Because the
//     log is written in seq order, an acknowledged update implies every earlier one is durable,
//     so no reply ever reveals state that a crash could take back.
//  4. WriteSnapshot(snapshot at seq S, pinned) is queued like an update (serialized by the
//     writer, not under the caller's lock); it becomes durable together with the updates before
//     it, and the entries it covers are dropped atomically with it, so recovery cost is bounded
//     by the snapshot interval. `pinned` are the big immutable entries the snapshot refers to
//     (the service's dataset specs: "specs apart"): each is written once, in the batch of the
//     first snapshot that lists it, kept (never range-deleted with the updates a snapshot
//     covers) while later snapshots list it, and deleted in the batch of the first snapshot
//     that does not. So a snapshot stays small however large the specs, and no file list is
//     rewritten per snapshot. On etcd: one key per pinned entry, put/deleted in the snapshot's
//     transaction.
//  5. A failed write makes the journal unhealthy (health() non-OK): every waiter fails, nothing
//     more is written (the log would have a hole), and what was applied in memory but not
//     written was never acknowledged. Recover() reopens the durable state and replays it into
//     fresh callbacks, so the owner can rebuild its memory from what is really durable.
// Opening replays: every pinned entry to `on_pinned` (key order), then the newest snapshot to
// `on_snapshot`, then every later update in order to `on_update`. An implementation never starts with less than it acknowledged: damage, a gap, or
// a log shorter than its durable high-water mark is DATA_LOSS naming what is missing (unless the
// operator accepted the loss, JournalOptions::accept_data_loss), never a crash or a silent reset.
//
// Thread-safe. Waiter callbacks run on the writer thread (or inline if already durable or failed).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/pacer/sharding.pb.h"

namespace rocksdb {
class FileSystem;
}

namespace pacer {

struct JournalOptions {
  std::string dir;   // the RocksDB folder
  bool sync = true;  // fsync every group; false only for benchmarks of the in-memory path
  // The durable high-water mark (the highest seq known durable), kept OUTSIDE `dir` so that
  // losing the folder is noticed; default: `dir` + ".hwm" (a sibling file).
  std::string hwm_file;
  // How often the high-water mark follows durable_seq while running (a background thread, off
  // the group-commit path). At a clean close it is written exactly. After kill -9 or a power
  // loss it may lag the acknowledged seq by up to about this much time.
  int64_t hwm_interval_ms = 100;
  // The data dir's identity says this journal was created: a missing or empty folder, or a
  // missing high-water mark, is DATA_LOSS instead of a fresh start.
  bool must_exist = false;
  // The operator knowingly accepts a loss (pacerd --accept-data-loss): damage that RocksDB can
  // recover past (point-in-time), a missing folder (started empty; the old one is kept aside) or
  // a log shorter than the high-water mark is accepted, the mark is reset to what was
  // recovered, and recovery() says what was lost. Damage that cannot be opened still refuses.
  bool accept_data_loss = false;
  // RocksDB's file system (tests inject a fault-injecting one); nullptr: the default (POSIX).
  // The high-water mark is written through it too.
  std::shared_ptr<rocksdb::FileSystem> fs;
};

struct JournalStats {
  uint64_t appends = 0;
  uint64_t batches = 0;  // == fsyncs when sync is on
  uint64_t bytes = 0;
  uint64_t snapshots = 0;
  uint64_t pinned_written = 0;  // pinned entries written (each once, see WriteSnapshot)
  uint64_t durable_seq = 0;
  uint64_t hwm_seq = 0;       // the high-water mark last written durably
  uint64_t failed_writes = 0;  // groups that failed (each made the journal unhealthy)
  uint64_t recoveries = 0;     // successful Recover() calls after a failure
  // Latency of each written batch (its fsync included): counts per bucket of
  // LatencySecondsBuckets() (common/metrics.h), the last one past every bound, and their sum.
  // Empty when the implementation does not measure it.
  std::vector<uint64_t> write_latency_counts;
  double write_latency_sum_s = 0;
};

// What the last Open()/Recover() found.
struct JournalRecovery {
  uint64_t recovered_seq = 0;  // last update replayed
  uint64_t hwm_seq = 0;        // the high-water mark found (0: none)
  bool created = false;        // a new, empty journal
  bool adopted = false;        // no high-water mark yet (a data dir from before it): created
  std::string format;          // the format the journal was found in ("" when created)
  // accept_data_loss only: what was accepted (empty when nothing was lost).
  std::string accepted_loss;
};

// An immutable entry a snapshot refers to (see 4. above). `value` is shared with its owner
// (no copy is made) and serialized by the writer only when the entry is not yet durable.
struct PinnedEntry {
  std::string key;  // unique for the entry's life; its value never changes
  std::shared_ptr<const google::protobuf::MessageLite> value;
};

class Journal {
 public:
  using Done = std::function<void(absl::Status)>;
  using SnapshotFn = std::function<absl::Status(const ShardingSnapshot&)>;
  using UpdateFn = std::function<absl::Status(const Update&)>;
  using PinnedFn = std::function<absl::Status(const std::string& key, const std::string& bytes)>;

  // Opens or creates the RocksDB journal (RocksJournal) and replays it: `on_pinned` with each
  // pinned entry (if given), `on_snapshot` with the newest snapshot (if any), then `on_update`
  // for each later update in order.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const JournalOptions& options,
                                                       const SnapshotFn& on_snapshot,
                                                       const UpdateFn& on_update,
                                                       const PinnedFn& on_pinned = nullptr);
  virtual ~Journal() = default;  // an implementation writes what is queued, then stops

  // Queues `update` (whose seq must be the previous append's + 1).
  virtual void Append(const Update& update) = 0;
  // Queues consecutive updates at once, so that they are durable in one group: the updates of
  // one request (a completion and the next lease) cost one fsync, not two.
  virtual void AppendAll(const std::vector<Update>& updates) {
    for (const Update& u : updates) Append(u);
  }
  // Queues a snapshot; it is written after every update appended before it, with the pinned
  // entries it refers to (every one: those not listed are deleted with it).
  virtual void WriteSnapshot(ShardingSnapshot snapshot, std::vector<PinnedEntry> pinned) = 0;
  // A snapshot that refers to no pinned entry (specs inline).
  void WriteSnapshot(ShardingSnapshot snapshot) { WriteSnapshot(std::move(snapshot), {}); }
  // Runs `done` once every update up to `seq` is durable (OK), or when writing failed.
  virtual void WhenDurable(uint64_t seq, Done done) = 0;
  // Blocks until everything appended so far is durable (or writing failed).
  virtual absl::Status Flush() = 0;

  // Non-OK once a write failed (UNAVAILABLE, naming the cause, e.g. a full disk): the log and
  // memory disagree until Recover().
  virtual absl::Status health() const = 0;
  // After a failure: drops everything queued, reopens the durable state and replays it (as
  // Open does) into the callbacks; the journal then continues from the recovered seq. OK and no
  // replay when healthy. Never recovers less than was acknowledged (DATA_LOSS instead). The
  // caller must not Append concurrently (the service holds its lock).
  virtual absl::Status Recover(const SnapshotFn& on_snapshot, const UpdateFn& on_update,
                               const PinnedFn& on_pinned) = 0;
  absl::Status Recover(const SnapshotFn& on_snapshot, const UpdateFn& on_update) {
    return Recover(on_snapshot, on_update, nullptr);
  }
  virtual uint64_t last_seq() const = 0;
  virtual JournalStats stats() const = 0;
  virtual JournalRecovery recovery() const = 0;
};

}  // namespace pacer
