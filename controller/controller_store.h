// ControllerStore: the controller's durable state in pacerd, so that a restart keeps what the
// controller knew — a ControllerDurableState (controller_durable_state.h) journaled through the
// one generic journal of pacerd's state machines (journal/durable_log.h), in RocksDB under
// <data-dir>/controller with its high-water mark in <data-dir>/controller.hwm.
//
// What it keeps and why:
//  * the audit trail (`pacerctl actions` after a restart shows the decisions made before it);
//  * the plan in force with its version (versions only grow: a worker holding plan v3 never
//    gets a new "v1"), the allocations and tail backups;
//  * the exclusion in force — who, the audit id that decided it (the version the workers
//    hold), why, and whether the per-step burst rule decided it — so a restart neither forgets
//    who is excluded nor hands the decision to another rule;
//  * executed actions' times (cooldowns, rate limits and min-live checks hold across a
//    restart: a crash loop of pacerd cannot become a restart storm of workers), pending gain
//    measurements, rollback evaluations and what a rollback would restore;
//  * the nodes that kept producing stragglers;
//  * the policy last applied with `pacerctl policy apply`, with the digest of the --policy
//    file it replaced: a pacerd started again with the same --policy file keeps the applied
//    policy; started with another (or an edited) file, it uses that file.
//
// The updates come from the History that emitted them (controller/history.h; each the outcome:
// a record as written, the plan put in force, ...) and from the reconciler (dispatch notes,
// applied policies). Append() applies them to the durable state and queues them as one group
// commit without waiting; the reconciler waits with WaitDurable() outside its lock, before it
// carries anything out. A snapshot every kSnapshotEvery updates bounds the replay. Damage is refused as the sharding journal refuses it (DATA_LOSS naming the
// folder, the key or the missing updates); a store written before the journal (format v0: keys
// "audit/<id>", "state", "policy") is imported on open, in one atomic batch.
// Thread-compatible: the Reconciler serialises access.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "controller/controller_durable_state.h"
#include "controller/history.h"
#include "journal/typed_journal.h"
#include "proto/pacer/controller.pb.h"
#include "proto/pacer/controller_journal.pb.h"

namespace pacer {

inline constexpr char kControllerJournalFormat[] = "pacer-controller-journal-v1";

template <>
struct JournalFormatOf<ControllerUpdate> {
  static JournalFormat Get() { return {kControllerJournalFormat, {}}; }
};
using ControllerJournal = TypedJournal<ControllerUpdate, ControllerSnapshot>;

// The exclusion `history` has in force named by its newest executed EXCLUDE_WORKERS record
// (deciding audit id, reason, step rule): for a store imported from before the journal, which
// knows who is excluded but not which decision did it. Version 0 when no such record is held.
ExclusionState NameExclusionInForce(const History& history);


class ControllerStore {
 public:
  static constexpr uint64_t kSnapshotEvery = 256;

  // Opens (creates) the store in `dir` and replays it. DATA_LOSS when the journal is damaged
  // (a corrupt record or snapshot, a gap, fewer updates than its high-water mark says were
  // written, RocksDB damage), when an older store's record does not parse, or, with
  // `must_exist` (the data dir's IDENTITY lists the store), when it is missing.
  // `accept_data_loss`: pacerd --accept-data-loss (JournalOptions::accept_data_loss). `fs`:
  // RocksDB's file system (JournalOptions::fs; null: the default).
  // `open_log`: the journal's own log instead of RocksDB in `dir` (JournalOptions::open_log:
  // pacerd --journal etcd://...).
  static absl::StatusOr<std::unique_ptr<ControllerStore>> Open(
      const std::string& dir, bool must_exist = false, bool accept_data_loss = false,
      std::shared_ptr<rocksdb::FileSystem> fs = nullptr, decltype(JournalOptions::open_log) open_log = nullptr);
  ~ControllerStore();

  struct Loaded {
    bool empty = true;  // nothing stored yet (a fresh data dir)
    std::deque<AuditRecord> audit;
    std::map<uint64_t, std::string> dispatch;  // audit id -> what pacerd did with it
    ControllerState state;
    ExclusionState exclusion;
    std::optional<AppliedPolicy> policy;
  };
  absl::StatusOr<Loaded> Load() const;

  // Stamps `updates` with the next seqs, applies them to the durable state and queues them in
  // the journal as one group; returns the last seq (0: nothing to write) without waiting, so
  // the owner can wait with WaitDurable outside its lock. A snapshot every kSnapshotEvery
  // updates. UNAVAILABLE while a failed write is not recovered (RecoverIfFailed); INTERNAL
  // when an update would not apply.
  absl::StatusOr<uint64_t> Append(std::vector<ControllerUpdate> updates);
  // Blocks until every update up to `seq` is durable; the write's error otherwise. Thread-safe
  // (may run beside Append).
  absl::Status WaitDurable(uint64_t seq);
  // Append, then WaitDurable (after recovering from a failed write).
  absl::Status Commit(std::vector<ControllerUpdate> updates);
  // After a failed write (health() non-OK): reopens the journal and replays what is durable
  // into state(); true when it did -- the owner rebuilds its memory from state() (what was
  // applied but never written was never acknowledged). false when healthy.
  absl::StatusOr<bool> RecoverIfFailed();
  absl::Status health() const { return journal_->health(); }

  const ControllerDurableState& state() const { return state_; }
  JournalRecovery recovery() const { return journal_->recovery(); }
  JournalStats stats() const { return journal_->stats(); }

 private:
  ControllerStore() = default;

  std::unique_ptr<ControllerJournal> journal_;
  ControllerDurableState state_;
  uint64_t snapshot_seq_ = 0;
};

// Rebuilds `history` from the durable state, as the updates that make it (audit, next id, plan,
// allocations, exclusion, node incidents).
void RestoreHistory(const ControllerDurableState& state, History* history);

}  // namespace pacer
