// EtcdLog: the DurableLog (journal/durable_log.h) in an etcd 3.4 cluster — pacerd's journal
// replicated by etcd's raft, so that losing pacerd's machine or disk loses nothing: a standby
// pacerd reads the same journal and takes over (docs/ha.md).
//
// Keys, under the journal's prefix P ("<job prefix>/sharding/" or ".../controller/"):
//   P "layout"          -> "pacer-etcd-log-v1" (how the keys below are laid out)
//   P "format"          -> the owner's format (JournalOptions::format, as RocksLog's "m:format")
//   P "u/" HEX16(seq)   -> a chunk of consecutive updates from seq (EtcdJournalRecord)
//   P "s/" HEX16(seq)   -> the snapshot holding every update <= seq, with its pinned keys
//   P "p/" HEX(key)     -> a pinned entry (the owner's key, hex-encoded)
// A record over one piece is split across "<key>.0001".. (proto/pacer/etcd_journal.proto).
//
// Writing (the DurableLog group commit): the writer thread takes everything queued and turns it
// into etcd operations in seq order — update chunks (a chunk never straddles a snapshot), then
// for a snapshot at S: the pinned entries not yet in etcd, the snapshot's pieces, its record,
// and deletes of the updates <= S, of older snapshots and of pinned entries S no longer lists.
// The operations are packed, in order, into transactions under etcd's limits (max_txn_ops, and
// max_txn_bytes under its 1.5 MiB request limit); one group is one transaction unless it is
// larger. Every transaction compares the leader's election key's create revision with the
// fencing token (EtcdFence): a deposed leader's write fails the compare, the log turns unhealthy
// with FAILED_PRECONDITION and `on_fenced` runs. A group spanning several transactions may be
// cut by a crash after a prefix of them: that prefix is whole updates or pieces of a record
// whose key is not written yet, and nothing of the group was acknowledged — recovery reads a
// prefix of the log, never a hole. A transaction whose outcome is unknown (UNAVAILABLE, a
// timeout) is sent again until `write_retry_ms`: its puts write the same values and its
// compares still fence it, so applying it twice is harmless.
//
// Opening reads the layout and format keys (a new journal writes both, fenced), then the newest
// snapshot, the pinned entries it lists, and every later update chunk, paged, at one etcd
// revision, checking that seqs are contiguous from the snapshot on. A chunk that does not
// parse, a gap, a missing pinned entry or piece is DATA_LOSS naming the key. etcd keeps what it
// acknowledged (a quorum wrote it), so there is no high-water mark: losing pacerd's data dir
// loses nothing.
//
// A hot standby (EtcdLogOptions::wait_promoted) opens the same way without writing, then keeps
// catching up — woken by a watch on the journal's keys (a wake-up only: etcd 3.4 can repeat
// watch events, or skip them after a compaction), and every follow_poll_ms regardless: each
// round lists the snapshots and reads the chunks after what it applied, at one
// etcd revision; a snapshot newer than what it applied (the leader snapshotted and deleted the
// updates in between) is read and applied instead, with its pinned entries. Once promoted, a last
// round reads what the old leader wrote (its election key was gone before ours won, so nothing it
// writes later passes its fence) and the log becomes the writer: a takeover replays a short tail.
//
// etcd's quota: a write refused because the backend is full (the NOSPACE alarm: "database space
// exceeded") makes the log unhealthy with UNAVAILABLE naming etcd's quota and what the
// operator does (compact, defragment, disarm the alarm); Recover() reads the journal back (reads
// work under the alarm) and the next write tries again.
//
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "journal/durable_log.h"
#include "journal/etcd_client.h"
#include "journal/etcd_election.h"

namespace pacer {

inline constexpr char kEtcdLogLayout[] = "pacer-etcd-log-v1";

struct EtcdLogOptions {
  EtcdClient* client = nullptr;
  std::string prefix;  // the journal's key prefix, ending in '/'
  JournalFormat format;
  // The fencing token of every write (the election's; empty key: unfenced, for tests of the log
  // alone).
  std::function<EtcdFence()> fence;
  // Called (once, on the writer thread) when a write was refused by the fence.
  std::function<void(const std::string& why)> on_fenced;
  // A missing journal is DATA_LOSS instead of a new one.
  bool must_exist = false;
  // etcd's limits (defaults: --max-request-bytes 1.5 MiB, --max-txn-ops 128), with a margin.
  size_t max_txn_bytes = 1 << 20;
  size_t max_txn_ops = 120;
  size_t piece_bytes = 512 << 10;
  // How long a transaction whose outcome is unknown is sent again before the log turns unhealthy.
  int64_t write_retry_ms = 10000;
  // Keys per page when reading.
  int64_t read_page_keys = 64;
  // A hot standby (set by a pacerd that is not leading yet): Open() reads the journal and keeps
  // applying what the leader appends (range reads, woken by a watch on the journal's keys, and
  // every follow_poll_ms without one) until `wait_promoted`
  // — which waits up to its argument in ms for this pacerd to win the election — returns true;
  // then it reads what is left and returns, the writer. Nothing is written before that. An error
  // from it ends the open. Unset: Open() writes at once (the caller leads already).
  std::function<absl::StatusOr<bool>(int64_t wait_ms)> wait_promoted;
  int64_t follow_poll_ms = 1000;
  // While following: called after each catch-up with the newest update applied and how many that
  // catch-up applied (how far behind the standby was).
  std::function<void(uint64_t applied, uint64_t behind)> on_follow;
};

class EtcdLog final : public DurableLog {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdLog>> Open(EtcdLogOptions options, const Replay& replay);
  ~EtcdLog() override;

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

 private:
  explicit EtcdLog(EtcdLogOptions options);
  struct Opened {
    uint64_t last_seq = 0;
    uint64_t snapshot_seq = 0;
    std::set<std::string> pinned;
    JournalRecovery recovery;
  };
  struct Entry {
    uint64_t seq;
    std::string bytes;
    std::shared_ptr<const google::protobuf::MessageLite> snapshot;
    std::vector<PinnedEntry> pinned;
  };
  // One etcd operation of a group, in order.
  struct Op {
    std::string key;
    std::string value;      // a put
    std::string range_end;  // non-empty: a delete of [key, range_end)
    bool del = false;
  };
  // Reads the journal (creating it when missing and `may_write`; NOT_FOUND when missing and not).
  absl::StatusOr<Opened> OpenAndReplay(const Replay& replay, bool may_write);
  // Applies what etcd holds past `out` (from a newer snapshot when there is one), at one revision.
  absl::Status CatchUp(const Replay& replay, Opened* out) const;
  // A standby's open: reads, then follows until promoted, then catches up a last time.
  absl::StatusOr<Opened> Follow(const Replay& replay);
  // Writes the format this binary writes when `found` is an older readable one.
  absl::Status UpgradeFormat(const std::string& found);
  // Reads the record at `key` (and its pieces) at `revision` (0: latest); NOT_FOUND if absent.
  absl::StatusOr<std::string> ReadRecord(const std::string& key, int64_t revision) const;
  // Reads the update chunks from `from` on, at `revision`, into `fn`; returns the last seq.
  absl::StatusOr<uint64_t> ReadUpdates(uint64_t from, int64_t revision, const EntryFn& fn) const;
  // The operations that write `record` at `key` (its pieces first, split when over a piece).
  void AddRecord(const std::string& key, const std::string& record, std::vector<Op>* ops) const;
  // Turns a taken queue into operations; `last_update` / `snapshot_seq` / `pinned_after` report
  // what the group makes durable.
  std::vector<Op> BuildOps(std::vector<Entry>& group, std::set<std::string>* pinned_after,
                           uint64_t* snapshot_seq, uint64_t* pinned_written) const;
  // Writes the operations in transactions, fenced; OK or the failure.
  absl::Status WriteOps(const std::vector<Op>& ops, size_t* txns);
  absl::Status WriteTxn(const std::vector<const Op*>& ops);
  void WriterLoop();
  void TakeWaiters(uint64_t up_to, std::vector<Done>* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string UpdateKey(uint64_t seq) const;
  std::string SnapshotKey(uint64_t seq) const;
  std::string PinnedKey(const std::string& key) const;

  const EtcdLogOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  absl::CondVar durable_cv_;
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  std::multimap<uint64_t, Done> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_snapshot_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> pinned_ ABSL_GUARDED_BY(mu_);  // owner keys of the pinned entries in etcd
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  bool fenced_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  JournalStats stats_ ABSL_GUARDED_BY(mu_);
  JournalRecovery recovery_;
  std::thread writer_;
};

// Opens (creates) the journal `options` names at `prefix` in etcd and replays it.
absl::StatusOr<std::unique_ptr<DurableLog>> OpenEtcdLog(EtcdLogOptions options,
                                                        const DurableLog::Replay& replay);

}  // namespace pacer
