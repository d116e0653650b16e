// Journal: the durable log of sharding updates plus periodic snapshots, in RocksDB.
//
// Layout (one RocksDB instance in the data dir):
//   "m:format"        -> "pacer-journal-v1"
//   "j" + BE64(seq)   -> JournalRecord: the updates seq, seq+1, ... of one group commit
//                        (update seqs are 1, 2, 3, ... without gaps across records)
//   "s" + BE64(seq)   -> serialized ShardingSnapshot holding every update <= seq
//
// Group commit (the protocol, once):
//  1. The service, holding its state lock, applies an update and calls Append(): this only
//     queues the serialized update (no I/O under the lock).
//  2. The writer thread takes *everything* queued, writes it as one record in one WriteBatch
//     with sync=true (one memtable insert and one fsync for the whole group), then advances
//     durable_seq.
//  3. Callers wait with WhenDurable(seq, done); `done` runs once durable_seq >= seq. Because the
//     log is written in seq order, an acknowledged update implies every earlier one is durable,
//     so no reply ever reveals state that a crash could take back.
//  4. WriteSnapshot(snapshot at seq S) is queued like an update; it is written in the same batch
//     as the updates before it, together with a range delete of journal entries <= S and of the
//     previous snapshot, atomically. Recovery cost is therefore bounded by the snapshot interval.
// Recovery reads the newest snapshot and replays every later entry; a gap, an unparsable entry
// or a RocksDB corruption is DATA_LOSS naming the key, never a crash or a silent reset.
//
// Thread-safe. Waiter callbacks run on the writer thread (or inline if already durable).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/pacer/sharding.pb.h"

namespace rocksdb {
class DB;
}

namespace pacer {

struct JournalOptions {
  std::string dir;
  bool sync = true;  // fsync every group; false only for benchmarks of the in-memory path
};

struct JournalStats {
  uint64_t appends = 0;
  uint64_t batches = 0;  // == fsyncs when sync is on
  uint64_t bytes = 0;
  uint64_t snapshots = 0;
  uint64_t durable_seq = 0;
};

class Journal {
 public:
  using Done = std::function<void(absl::Status)>;
  using SnapshotFn = std::function<absl::Status(const ShardingSnapshot&)>;
  using UpdateFn = std::function<absl::Status(const Update&)>;

  // Opens or creates the journal and replays it: `on_snapshot` with the newest snapshot (if
  // any), then `on_update` for each later update in order.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const JournalOptions& options,
                                                       const SnapshotFn& on_snapshot,
                                                       const UpdateFn& on_update);
  ~Journal();  // writes what is queued, then stops

  // Queues `update` (whose seq must be the previous append's + 1).
  void Append(const Update& update);
  // Queues a snapshot; it is written after every update appended before it.
  void WriteSnapshot(ShardingSnapshot snapshot);
  // Runs `done` once every update up to `seq` is durable (OK), or when writing failed.
  void WhenDurable(uint64_t seq, Done done);
  // Blocks until everything appended so far is durable.
  absl::Status Flush();

  // Non-OK once a write failed: the log and memory disagree; the process must restart.
  absl::Status health() const;
  uint64_t last_seq() const;
  JournalStats stats() const;

 private:
  Journal(std::unique_ptr<rocksdb::DB> db, uint64_t last_seq, uint64_t last_snapshot_seq,
          JournalOptions options);
  void WriterLoop();

  struct Entry {
    uint64_t seq;
    std::string bytes;
    bool snapshot;
  };

  const JournalOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // wakes the writer
  std::condition_variable durable_cv_;  // wakes Flush()
  std::vector<Entry> queue_;
  std::multimap<uint64_t, Done> waiters_;
  uint64_t last_seq_;           // last appended
  uint64_t durable_seq_;        // last written
  uint64_t last_snapshot_seq_;  // newest snapshot on disk
  absl::Status health_;
  bool stopping_ = false;
  JournalStats stats_;
  std::thread writer_;
};

}  // namespace pacer
