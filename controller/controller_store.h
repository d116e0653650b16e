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
// Save() turns what the History says changed into ControllerUpdates (each the outcome: a
// record as written, the plan put in force, ...), applies them to the durable state and makes
// them durable (one group commit) before it returns; a snapshot every kSnapshotEvery updates
// bounds the replay. Damage is refused as the sharding journal refuses it (DATA_LOSS naming the
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

// The exclusion `history` has in force, as the journal keeps it: the deciding audit id and
// reason from its newest executed EXCLUDE_WORKERS record (`before`'s when that record is gone).
ExclusionState ExclusionInForce(const History& history, const ExclusionState& before);

// Conversions (exposed for tests).
PlanState PlanToProto(const BatchPlan& plan);
BatchPlan PlanFromProto(const PlanState& proto);
AuditState AuditToProto(const AuditRecord& record);
// INVALID_ARGUMENT for an unknown kind or outcome (a store written by a newer pacerd).
absl::StatusOr<AuditRecord> AuditFromProto(const AuditState& proto);

class ControllerStore {
 public:
  static constexpr uint64_t kSnapshotEvery = 256;

  // Opens (creates) the store in `dir` and replays it. DATA_LOSS when the journal is damaged
  // (a corrupt record or snapshot, a gap, fewer updates than its high-water mark says were
  // written, RocksDB damage), when an older store's record does not parse, or, with
  // `must_exist` (the data dir's IDENTITY lists the store), when it is missing.
  // `accept_data_loss`: pacerd --accept-data-loss (JournalOptions::accept_data_loss).
  static absl::StatusOr<std::unique_ptr<ControllerStore>> Open(const std::string& dir,
                                                               bool must_exist = false,
                                                               bool accept_data_loss = false);
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

  // Journals what changed (`changes`: the records it names, with their dispatch notes from
  // `dispatch`; plan, allocations, exclusion, node incidents, trimmed records when the state
  // changed) and returns once it is durable. After a failed write the journal is reopened
  // first (its durable state replayed) and the difference journaled again.
  absl::Status Save(const History& history, const History::Changes& changes,
                    const std::map<uint64_t, std::string>& dispatch);
  absl::Status SavePolicy(const AppliedPolicy& policy);

  const ControllerDurableState& state() const { return state_; }
  JournalRecovery recovery() const { return journal_->recovery(); }
  JournalStats stats() const { return journal_->stats(); }

 private:
  ControllerStore() = default;
  // Applies each update (seq assigned) to state_ and journals them as one group, then waits.
  absl::Status Commit(std::vector<ControllerUpdate> updates);
  absl::Status RecoverIfFailed();

  std::unique_ptr<ControllerJournal> journal_;
  ControllerDurableState state_;
  uint64_t snapshot_seq_ = 0;
};

// Restores `loaded` into `history` (audit, plan, allocations, nodes).
void RestoreHistory(const ControllerStore::Loaded& loaded, History* history);

}  // namespace pacer
