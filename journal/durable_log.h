// DurableLog: the one journal of pacerd's state machines — an ordered log of serialized
// updates plus periodic snapshots, behind an interface (append / read from a seq / snapshot).
//
// Two state machines journal through it, each with its own log: the sharding core
// (sharding_service/journal.h: Update, ShardingSnapshot) and the controller
// (controller/controller_store.h: ControllerUpdate, ControllerSnapshot). Each sees it through
// TypedJournal (journal/typed_journal.h), which parses and checks what this class stores as
// bytes. RocksLog (journal/rocks_log.h) is today's implementation; a replicated one (pacerd's
// state on etcd) can take its place later. An implementation owns durability, ordering and
// recovery; it knows nothing of what an update means.
//
// Group commit (the protocol every implementation keeps, once):
//  1. The owner, holding its state lock, applies an update and calls Append(): this only
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
//     (the sharding service's dataset specs: "specs apart"): each is written once, in the batch
//     of the first snapshot that lists it, kept (never range-deleted with the updates a snapshot
//     covers) while later snapshots list it, and deleted in the batch of the first snapshot
//     that does not. So a snapshot stays small however large the specs, and no file list is
//     rewritten per snapshot. On etcd: one key per pinned entry, put/deleted in the snapshot's
//     transaction.
//  5. A failed write makes the log unhealthy (health() non-OK): every waiter fails, nothing
//     more is written (the log would have a hole), and what was applied in memory but not
//     written was never acknowledged. Recover() reopens the durable state and replays it into
//     fresh callbacks, so the owner can rebuild its memory from what is really durable.
// Opening replays: every pinned entry to `on_pinned` (key order), then the newest snapshot to
// `on_snapshot`, then every later update in order to `on_update`. An implementation never starts
// with less than it acknowledged: damage, a gap, or a log shorter than its durable high-water
// mark is DATA_LOSS naming what is missing (unless the operator accepted the loss,
// JournalOptions::accept_data_loss), never a crash or a silent reset.
//
// Replay callbacks get the bytes with the seq the log holds them at. A callback returns
// DATA_LOSS when the bytes themselves are bad (they do not parse, or carry another seq): the log
// reports that entry as corrupt; any other error means the entry parsed but does not apply
// (e.g. INVALID_ARGUMENT from the state machine's validation: a kind a newer pacerd wrote),
// reported as such. Both refuse the open with DATA_LOSS naming the folder and the entry.
//
// Thread-safe. Waiter callbacks run on one of the log's own threads (RocksLog: the one that
// acknowledges a group), or inline if already durable or failed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace google::protobuf {
class MessageLite;
}
namespace rocksdb {
class DB;
class FileSystem;
}  // namespace rocksdb

namespace pacer {

// Which layout versions a log is written in and read from ("m:format" in RocksDB). The owner
// names them: the sharding journal is "pacer-journal-v5" (v2..v4 read and upgraded), the
// controller's "pacer-controller-journal-v1".
struct JournalFormat {
  std::string written;
  std::vector<std::string> readable;  // older formats read, and upgraded with the first write
};

// A folder in a layout from before the log (no format key, but keys of an older store): what an
// importer found there, to become the log's first snapshot (at seq 1), written with the format
// key and the deletes of the old keys in one synced batch, so a crash leaves the old layout or
// the new one, never a mix (the high-water mark follows at the end of that open).
struct LegacyImport {
  std::string snapshot;  // serialized; the owner's snapshot at seq 1
  std::vector<std::string> delete_keys;
  std::vector<std::pair<std::string, std::string>> delete_ranges;  // [begin, end)
  std::string what;  // for the log line ("controller store v0: 12 audit records")
};

class DurableLog;
using DurableLogEntryFn = std::function<absl::Status(uint64_t seq, const std::string& bytes)>;
using DurableLogPinnedFn = std::function<absl::Status(const std::string& key, const std::string& bytes)>;
// What a log's open and Recover() replay into (DurableLog::Replay).
struct DurableLogReplay {
  DurableLogEntryFn on_snapshot;  // the newest snapshot (its seq), if any
  DurableLogEntryFn on_update;    // each later update, in order
  DurableLogPinnedFn on_pinned;   // each pinned entry (may be null)
};

struct JournalOptions {
  std::string dir;   // the RocksDB folder
  bool sync = true;  // fsync every group; false only for benchmarks of the in-memory path
  // The durable high-water mark (the highest seq known durable), kept OUTSIDE `dir` so that
  // losing the folder is noticed; default: `dir` + ".hwm" (a sibling file;
  // journal/high_water_mark.h).
  std::string hwm_file;
  // With sync: a group is acknowledged only once the mark holds it (the mark is written after
  // the group's synced write, pipelined with the next group's: rocks_log.h), so the mark is
  // never below an acknowledged update and a WAL cut back by any amount is refused on open.
  // false: the mark follows the durable seq every hwm_interval_ms, off the commit path, and
  // after kill -9 or a power loss lags the acknowledged seq by up to that — a cut confined to
  // the lag goes unnoticed. That is how the journal worked before; it is kept only so that
  // sharding_bench can measure what the mark costs a commit. Never turn it off in pacerd.
  bool mark_before_ack = true;
  // mark_before_ack = false (with sync) only: how often the mark follows.
  int64_t hwm_interval_ms = 100;
  // The data dir's identity says this log was created: a missing or empty folder, or a
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
  // The formats; empty `written`: the sharding journal's (sharding_service/rocks_journal.h).
  JournalFormat format;
  // Consulted for a folder with neither a format key nor a high-water mark (a log writes both
  // when it is created: such a folder is from before it): nullopt when it holds no older store
  // either (DATA_LOSS: the database lost its contents), else what to import; an error (e.g.
  // DATA_LOSS: an old record does not parse) refuses the open. Reads the database only. Unset:
  // the owner never had another layout.
  std::function<absl::StatusOr<std::optional<LegacyImport>>(rocksdb::DB&)> import_legacy;
  // Opens the log instead of RocksDB (pacerd --journal etcd://...: journal/etcd_log.h), given
  // these options (format, must_exist) and what to replay into. Unset: OpenRocksLog.
  std::function<absl::StatusOr<std::unique_ptr<DurableLog>>(const JournalOptions&, const DurableLogReplay&)>
      open_log;
};

struct JournalStats {
  uint64_t appends = 0;
  uint64_t batches = 0;  // == fsyncs when sync is on
  uint64_t bytes = 0;
  uint64_t snapshots = 0;
  uint64_t pinned_written = 0;  // pinned entries written (each once, see WriteSnapshot)
  uint64_t durable_seq = 0;
  uint64_t hwm_seq = 0;       // the high-water mark last written durably
  uint64_t hwm_writes = 0;    // marks written in place (one per batch or fewer: see rocks_log.h)
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
  std::string hwm_format;      // its format ("" when none; a v1 mark is rewritten as v2)
  bool hwm_torn = false;       // one slot of the mark did not verify (a torn write of it)
  bool created = false;        // a new, empty journal
  bool adopted = false;        // no high-water mark yet (a data dir from before it): created
  std::string format;          // the format the journal was found in ("" when created)
  std::string imported;        // an older store imported (LegacyImport::what; "" when none)
  // accept_data_loss only: what was accepted (empty when nothing was lost).
  std::string accepted_loss;
};

// An immutable entry a snapshot refers to (see 4. above). `value` is shared with its owner
// (no copy is made) and serialized by the writer only when the entry is not yet durable.
struct PinnedEntry {
  std::string key;  // unique for the entry's life; its value never changes
  std::shared_ptr<const google::protobuf::MessageLite> value;
};

class DurableLog {
 public:
  using Done = std::function<void(absl::Status)>;
  using EntryFn = DurableLogEntryFn;
  using PinnedFn = DurableLogPinnedFn;
  using Replay = DurableLogReplay;

  virtual ~DurableLog() = default;  // an implementation writes what is queued, then stops

  // Queues `bytes`, the update at `seq` (the previous append's + 1).
  virtual void Append(uint64_t seq, std::string bytes) = 0;
  // Queues consecutive updates at once, so that they are durable in one group.
  virtual void AppendAll(std::vector<std::pair<uint64_t, std::string>> updates) = 0;
  // Queues a snapshot of every update appended so far (seq == last_seq(): a record never
  // straddles it); written after them, with the pinned entries it lists (others are deleted).
  virtual void WriteSnapshot(uint64_t seq, std::shared_ptr<const google::protobuf::MessageLite> snapshot,
                             std::vector<PinnedEntry> pinned) = 0;
  // Reads the durable updates from `seq` on (past the newest snapshot only: the ones before it
  // are gone), in order, into `on_update` — what a follower replica would tail. FAILED_PRECONDITION
  // when `seq` is at or before the newest snapshot (start from the snapshot instead).
  virtual absl::Status ReadFrom(uint64_t seq, const EntryFn& on_update) const = 0;
  // Runs `done` once every update up to `seq` is durable (OK), or when writing failed.
  virtual void WhenDurable(uint64_t seq, Done done) = 0;
  // Blocks until everything appended so far is durable (or writing failed).
  virtual absl::Status Flush() = 0;

  // Non-OK once a write failed (UNAVAILABLE, naming the cause, e.g. a full disk): the log and
  // memory disagree until Recover().
  virtual absl::Status health() const = 0;
  // After a failure: drops everything queued, reopens the durable state and replays it (as
  // Open does); the log then continues from the recovered seq. OK and no replay when healthy.
  // Never recovers less than was acknowledged (DATA_LOSS instead). The caller must not Append
  // concurrently (the owner holds its lock).
  virtual absl::Status Recover(const Replay& replay) = 0;
  virtual uint64_t last_seq() const = 0;
  virtual JournalStats stats() const = 0;
  virtual JournalRecovery recovery() const = 0;
};

// Opens (creates) the RocksDB log (RocksLog) and replays it into `replay`.
absl::StatusOr<std::unique_ptr<DurableLog>> OpenRocksLog(const JournalOptions& options,
                                                         const DurableLog::Replay& replay);

}  // namespace pacer
