// History: what the controller remembers between reconciles — the audit log, the plan and
// allocation in force, and the nodes that keep producing stragglers.
//
// Policies read it (const); only the Controller changes it, through the methods below. Each
// change is a ControllerUpdate (proto/pacer/controller_journal.proto) carrying its outcome -- a
// record as written, the plan put in force, the exclusion with the audit id that decided it --
// applied through the one Apply() that a replay uses too, so the History is a state machine of
// the updates it emits. With journaled(true) (pacerd: controller/reconciler.h) the updates
// also queue for TakeUpdates(), and the reconciler journals them (controller/controller_store.h)
// and waits until they are durable before anything is carried out. Deterministic: time comes
// from the caller.
//
// Invariants: audit ids are unique and increasing; at most `max_records` records are kept
// (the oldest are dropped, never the ones awaiting measurement while room remains).
//
// Memory: a batch plan or an allocation list names every worker (a plan at 4 096 workers, its
// per-worker entries and speed shares, is ~0.5 MB; an executed ADJUST_BS record holds two), so
// only the newest kFullPayloadRecords records, and executed ones not yet measured (the only
// ones MeasureAndRollBack restores from), keep their per-worker payloads. Older ones keep
// everything else — kind, target, reason, gains, outcome, plan version, effective step and
// global batch, exclusion lists — and drop the plan's workers and shares, the previous plan
// and the allocation lists (StripPayload). So the audit holds at most
//   max_records x (one record without payload, ~1 KiB)
//   + (kFullPayloadRecords + executed-unmeasured records) x 2 x W x (~150 B)
// for W workers, whatever the job's length.
// Thread-compatible: the Controller's owner serialises access.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "controller/action.h"
#include "controller/batch_plan.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/policy_config.h"
#include "proto/pacer/controller_journal.pb.h"

namespace pacer {

struct AuditRecord {
  enum class Outcome {
    kExecuted,  // admitted and handed out for dispatch
    kDryRun,    // admitted, but dry_run: logged only
    kVetoed,    // refused by the safety layer (veto_reason says why)
    kPolicy,    // a policy change (hot reload), not an action
  };
  uint64_t id = 0;
  int64_t time_ms = 0;
  int64_t last_seen_ms = 0;  // repeated identical vetoes / dry-runs fold into one record
  int64_t repeats = 0;
  std::string policy;  // policy name (file's `name`) that decided
  Outcome outcome = Outcome::kExecuted;
  std::string veto_reason;
  std::string inputs;  // summary of the view the decision was made on
  Action action;       // kind, target, reason, predicted gain, payload
  double baseline_throughput = 0;  // job samples/s when the action was taken
  // Filled in later, `evaluate_after_s` after execution.
  std::optional<double> measured_gain;
  int64_t measured_at_ms = 0;
  bool rolled_back = false;  // a rollback of this action was issued
  std::optional<BatchPlan> previous_plan;                // ADJUST_BS: what a rollback restores
  std::vector<WorkerAllocation> previous_allocations;    // REALLOCATE
  std::optional<bool> previous_tail_backups;
  std::vector<std::string> previous_excluded;            // EXCLUDE
};

const char* AuditOutcomeName(AuditRecord::Outcome outcome);

// Whether the record still holds per-worker payloads (see History's memory note).
bool HasPayload(const AuditRecord& record);
// Drops the per-worker payloads (plan workers and speed shares, previous plan, allocation
// lists); keeps the plan's version, effective step, global batch and predicted step.
void StripPayload(AuditRecord* record);

class History {
 public:
  // Records (newest first) that keep their per-worker payloads whatever their state.
  static constexpr size_t kFullPayloadRecords = 32;

  struct NodeRecord {
    int64_t incidents = 0;
    int64_t last_ms = 0;
  };
  // ---- Queries (policies and the safety layer) ----
  const std::deque<AuditRecord>& audit() const { return audit_; }
  const AuditRecord* FindRecord(uint64_t id) const;
  // The newest executed record of this kind and target ("" = job-wide), or nullptr.
  const AuditRecord* LastExecuted(ActionKind kind, const std::string& target) const;
  // Executed records with time in (since_ms, ∞); disruptive_only counts RESTART/MIGRATE/server.
  int64_t ExecutedSince(int64_t since_ms, bool disruptive_only) const;

  const std::optional<BatchPlan>& plan() const { return plan_; }
  const std::vector<WorkerAllocation>& allocations() const { return allocations_; }
  bool tail_backups() const { return tail_backups_; }
  const std::vector<std::string>& excluded_workers() const { return excluded_; }
  // The exclusion in force as journaled: who, the audit id that decided it (0: none known),
  // why, and whether the per-step burst rule decided it.
  const ExclusionState& exclusion() const { return exclusion_; }

  // A node with ≥ bad_node_threshold incidents, the last within bad_node_ttl_s.
  bool IsBadNode(const std::string& node, int64_t now_ms, const RestartConfig& cfg) const;
  std::vector<std::string> BadNodes(int64_t now_ms, const RestartConfig& cfg) const;
  int64_t NodeIncidents(const std::string& node) const;

  uint64_t next_id() const { return next_id_; }
  const std::map<std::string, NodeRecord>& nodes() const { return nodes_; }

  // ---- The updates ----
  // Queue every update from now on for TakeUpdates() (off: the simulator, tests of the pure
  // controller -- nothing accumulates).
  void set_journaled(bool on) { journaled_ = on; }
  // The updates since the last call, in order, without seqs.
  std::vector<ControllerUpdate> TakeUpdates();
  // INVALID_ARGUMENT when `update` cannot apply: a record without an id or that does not decode
  // (an unknown kind or outcome: written by a newer pacerd), a node update without a node.
  static absl::Status Validate(const ControllerUpdate& update);
  // Applies an update that passed Validate(); updates that are not the History's (dispatch
  // notes, applied policies) change nothing. Queues nothing: replay and restore use it.
  void Apply(const ControllerUpdate& update);
  // Forgets everything (a restore replays updates into an empty History).
  void Clear();

  // ---- Changes (the Controller; the reconciler's ClearPlan at a new run) ----
  // Each emits its update(s) and applies them.
  // Appends a record (assigning its id) or, when it repeats the newest record of the same kind
  // and target with the same outcome and veto reason (not kExecuted), folds into it. Returns
  // the id of the record written or folded into.
  uint64_t Record(AuditRecord record, int64_t max_records);
  void SetMeasuredGain(uint64_t id, double gain, int64_t now_ms);
  void MarkRolledBack(uint64_t id);
  void SetPlan(const BatchPlan& plan);
  // A new run of the job (pacerd's reconciler): no plan is in force any more.
  void ClearPlan();
  void SetAllocations(std::vector<WorkerAllocation> allocations);
  void SetTailBackups(bool on);
  // `decided_by`: the audit id of the executed EXCLUDE_WORKERS record that decided it, with its
  // reason and whether the per-step burst rule decided it.
  void SetExcluded(std::vector<std::string> workers, uint64_t decided_by = 0,
                   const std::string& reason = "", bool step_rule = false);
  void AddNodeIncident(const std::string& node, int64_t now_ms);

 private:
  AuditRecord* MutableRecord(uint64_t id);
  // Applies `update` and queues it when journaled.
  void Emit(ControllerUpdate update);
  // A record as written (the decoded form of a record update): replaces the one with its id or
  // appends it (ids grow).
  void ApplyRecord(AuditRecord record);
  void EmitRecord(AuditRecord record);
  // The update for a record already in audit_ and changed there (a measured gain, a fold, a
  // payload dropped): journaled when journaled; applying it would change nothing more. Copying
  // a 4 096-worker plan's record to change one field was a copy of two plans.
  void EmitChanged(const AuditRecord& record);
  void EmitAllocations();

  std::deque<AuditRecord> audit_;
  // Ids of the records in audit_ that hold per-worker payloads (HasPayload), kept by ApplyRecord,
  // the trim and the stripping in Record.
  std::set<uint64_t> with_payload_;
  uint64_t next_id_ = 1;
  std::optional<BatchPlan> plan_;
  std::vector<WorkerAllocation> allocations_;
  bool tail_backups_ = false;
  std::vector<std::string> excluded_;
  ExclusionState exclusion_;
  std::map<std::string, NodeRecord> nodes_;
  bool journaled_ = false;
  std::vector<ControllerUpdate> pending_;
};

// The controller's journal form of its types (ControllerUpdate payloads), and back.
PlanState PlanToProto(const BatchPlan& plan);
BatchPlan PlanFromProto(const PlanState& proto);
AuditState AuditToProto(const AuditRecord& record);
// INVALID_ARGUMENT for an unknown kind or outcome (a store written by a newer pacerd).
absl::StatusOr<AuditRecord> AuditFromProto(const AuditState& proto);
void AllocationsToProto(const std::vector<WorkerAllocation>& in,
                        google::protobuf::RepeatedPtrField<AllocationState>* out);
std::vector<WorkerAllocation> AllocationsFromProto(
    const google::protobuf::RepeatedPtrField<AllocationState>& in);

}  // namespace pacer
