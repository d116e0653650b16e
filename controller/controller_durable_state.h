// ControllerDurableState: what pacerd's controller keeps across a restart, as a state machine
// changed only by Apply(const ControllerUpdate&) (proto/pacer/controller_journal.proto).
//
// The same pattern as the sharding core (ShardingState::Apply): the updates are journaled
// through the one generic journal (journal/durable_log.h; controller/controller_store.h opens
// it), and recovery is the newest snapshot plus the updates after it. Apply does no I/O, reads no
// clock and decides nothing: each update carries the outcome (a record as the controller wrote
// it, the plan put in force, the exclusion with the audit id that decided it).
//
// It holds: the audit records (by id) with their dispatch notes, the next audit id, the plan,
// allocations and tail backups in force, the exclusion in force (who, the deciding audit id,
// why, and whether the per-step burst rule decided it), the nodes' straggler incidents, and the
// policy last applied with `pacerctl policy apply`.
//
// Validate first: an update that passed Validate() cannot fail to Apply(). Invariants: last_seq
// grows by one per update; record ids are below next_audit_id.
// Thread-compatible (ControllerStore serialises access).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/pacer/controller_journal.pb.h"

namespace pacer {

class ControllerDurableState {
 public:
  struct Node {
    int64_t incidents = 0;
    int64_t last_ms = 0;
  };

  // INVALID_ARGUMENT when `update` cannot be applied: not the next seq, no kind, a record
  // without an id or that does not decode (an unknown kind or outcome: a newer pacerd).
  absl::Status Validate(const ControllerUpdate& update) const;
  // Applies an update that passed Validate(). Deterministic; never fails.
  void Apply(const ControllerUpdate& update);
  // Validate + Apply (replay).
  absl::Status ApplyChecked(const ControllerUpdate& update);

  // The whole state at last_seq(), and back.
  ControllerSnapshot ToSnapshot() const;
  static absl::StatusOr<ControllerDurableState> FromSnapshot(const ControllerSnapshot& snapshot);

  uint64_t last_seq() const { return last_seq_; }
  const std::map<uint64_t, AuditState>& records() const { return records_; }
  // Dispatch notes by audit id (only for records held).
  const std::map<uint64_t, std::string>& dispatch() const { return dispatch_; }
  uint64_t next_audit_id() const { return next_audit_id_; }
  const std::optional<PlanState>& plan() const { return plan_; }
  const std::vector<AllocationState>& allocations() const { return allocations_; }
  bool tail_backups() const { return tail_backups_; }
  const ExclusionState& exclusion() const { return exclusion_; }
  const std::map<std::string, Node>& nodes() const { return nodes_; }
  const std::optional<AppliedPolicy>& policy() const { return policy_; }
  // Holds nothing (a fresh store, or an empty one imported from before the journal).
  bool empty() const {
    return records_.empty() && !policy_ && !plan_ && allocations_.empty() && nodes_.empty() &&
           exclusion_.excluded().empty() && exclusion_.version() == 0 && next_audit_id_ == 1;
  }

 private:
  uint64_t last_seq_ = 0;
  std::map<uint64_t, AuditState> records_;  // without their dispatch notes
  std::map<uint64_t, std::string> dispatch_;
  uint64_t next_audit_id_ = 1;
  std::optional<PlanState> plan_;
  std::vector<AllocationState> allocations_;
  bool tail_backups_ = false;
  ExclusionState exclusion_;
  std::map<std::string, Node> nodes_;
  std::optional<AppliedPolicy> policy_;
};

}  // namespace pacer
