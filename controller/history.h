// History: what the controller remembers between reconciles — the audit log, the plan and
// allocation in force, and the nodes that keep producing stragglers.
//
// Policies read it (const); only the Controller changes it, and only through the methods
// below, each deterministic in its arguments (time comes from the caller), so the sequence of
// calls can be journaled and replayed (pacerd journals what they changed as ControllerUpdates:
// controller/controller_store.h, controller/controller_durable_state.h).
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
#include "controller/policy_config.h"

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
  // What changed since the last TakeChanges() (pacerd's ControllerStore persists it).
  struct Changes {
    std::vector<uint64_t> records;  // ids written, folded into, measured or rolled back
    bool state = false;             // plan, allocations, tail backups, exclusions, node incidents
    bool empty() const { return records.empty() && !state; }
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

  // A node with ≥ bad_node_threshold incidents, the last within bad_node_ttl_s.
  bool IsBadNode(const std::string& node, int64_t now_ms, const RestartConfig& cfg) const;
  std::vector<std::string> BadNodes(int64_t now_ms, const RestartConfig& cfg) const;
  int64_t NodeIncidents(const std::string& node) const;

  uint64_t next_id() const { return next_id_; }
  const std::map<std::string, NodeRecord>& nodes() const { return nodes_; }

  // ---- Durability ----
  Changes TakeChanges();
  // Replaces the whole history with one restored from the store (no changes pending after).
  void Restore(std::deque<AuditRecord> audit, uint64_t next_id, std::optional<BatchPlan> plan,
               std::vector<WorkerAllocation> allocations, bool tail_backups,
               std::vector<std::string> excluded, std::map<std::string, NodeRecord> nodes);

  // ---- Changes (the Controller only) ----
  // Appends a record (assigning its id) or, when it repeats the newest record of the same kind
  // and target with the same outcome and veto reason (not kExecuted), folds into it. Returns
  // the id of the record written or folded into.
  uint64_t Record(AuditRecord record, int64_t max_records);
  void SetMeasuredGain(uint64_t id, double gain, int64_t now_ms);
  void MarkRolledBack(uint64_t id);
  void SetPlan(const BatchPlan& plan) {
    plan_ = plan;
    state_changed_ = true;
  }
  // A new run of the job (pacerd's reconciler): no plan is in force any more.
  void ClearPlan() {
    plan_.reset();
    state_changed_ = true;
  }
  void SetAllocations(std::vector<WorkerAllocation> a) {
    allocations_ = std::move(a);
    state_changed_ = true;
  }
  void SetTailBackups(bool on) {
    tail_backups_ = on;
    state_changed_ = true;
  }
  void SetExcluded(std::vector<std::string> workers) {
    excluded_ = std::move(workers);
    state_changed_ = true;
  }
  void AddNodeIncident(const std::string& node, int64_t now_ms);

 private:
  AuditRecord* MutableRecord(uint64_t id);

  std::deque<AuditRecord> audit_;
  uint64_t next_id_ = 1;
  std::optional<BatchPlan> plan_;
  std::vector<WorkerAllocation> allocations_;
  bool tail_backups_ = false;
  std::vector<std::string> excluded_;
  std::map<std::string, NodeRecord> nodes_;
  std::set<uint64_t> changed_records_;
  bool state_changed_ = false;
};

}  // namespace pacer
