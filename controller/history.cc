#include "controller/history.h"

#include <algorithm>

namespace pacer {

const char* AuditOutcomeName(AuditRecord::Outcome outcome) {
  switch (outcome) {
    case AuditRecord::Outcome::kExecuted: return "executed";
    case AuditRecord::Outcome::kDryRun: return "dry-run";
    case AuditRecord::Outcome::kVetoed: return "vetoed";
    case AuditRecord::Outcome::kPolicy: return "policy";
  }
  return "?";
}

bool HasPayload(const AuditRecord& r) {
  return (r.action.plan && (!r.action.plan->workers.empty() || !r.action.plan->basis_share.empty())) ||
         r.previous_plan.has_value() || !r.action.allocations.empty() ||
         !r.previous_allocations.empty();
}

void StripPayload(AuditRecord* r) {
  if (r->action.plan) {
    r->action.plan->workers = {};  // = {} frees the buffers (clear() would keep them)
    r->action.plan->basis_share = {};
  }
  r->previous_plan.reset();
  r->action.allocations = {};
  r->previous_allocations = {};
}

const AuditRecord* History::FindRecord(uint64_t id) const {
  for (const auto& r : audit_)
    if (r.id == id) return &r;
  return nullptr;
}

AuditRecord* History::MutableRecord(uint64_t id) {
  for (auto& r : audit_)
    if (r.id == id) return &r;
  return nullptr;
}

const AuditRecord* History::LastExecuted(ActionKind kind, const std::string& target) const {
  for (auto it = audit_.rbegin(); it != audit_.rend(); ++it) {
    if (it->outcome == AuditRecord::Outcome::kExecuted && it->action.kind == kind &&
        it->action.target == target)
      return &*it;
  }
  return nullptr;
}

int64_t History::ExecutedSince(int64_t since_ms, bool disruptive_only) const {
  int64_t n = 0;
  for (auto it = audit_.rbegin(); it != audit_.rend() && it->time_ms > since_ms; ++it) {
    if (it->outcome != AuditRecord::Outcome::kExecuted) continue;
    if (disruptive_only && !IsDisruptive(it->action.kind)) continue;
    ++n;
  }
  return n;
}

bool History::IsBadNode(const std::string& node, int64_t now_ms, const RestartConfig& cfg) const {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return false;
  return it->second.incidents >= cfg.bad_node_threshold &&
         static_cast<double>(now_ms - it->second.last_ms) <= cfg.bad_node_ttl_s * 1000;
}

std::vector<std::string> History::BadNodes(int64_t now_ms, const RestartConfig& cfg) const {
  std::vector<std::string> bad;
  for (const auto& [node, rec] : nodes_)
    if (IsBadNode(node, now_ms, cfg)) bad.push_back(node);
  return bad;
}

int64_t History::NodeIncidents(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? 0 : it->second.incidents;
}

uint64_t History::Record(AuditRecord record, int64_t max_records) {
  if (record.outcome == AuditRecord::Outcome::kVetoed ||
      record.outcome == AuditRecord::Outcome::kDryRun) {
    for (auto it = audit_.rbegin(); it != audit_.rend(); ++it) {
      if (it->action.kind != record.action.kind || it->action.target != record.action.target)
        continue;
      if (it->outcome == record.outcome && it->veto_reason == record.veto_reason) {
        it->last_seen_ms = record.time_ms;
        ++it->repeats;
        changed_records_.insert(it->id);
        return it->id;
      }
      break;  // only the newest record of this kind and target may absorb it
    }
  }
  record.id = next_id_++;
  record.action.id = record.id;
  record.last_seen_ms = record.time_ms;
  changed_records_.insert(record.id);
  audit_.push_back(std::move(record));
  while (static_cast<int64_t>(audit_.size()) > max_records) audit_.pop_front();
  // Beyond the newest kFullPayloadRecords, a record that can no longer be rolled back (not
  // executed, or measured: MeasureAndRollBack copies what it restores before any Record call
  // that follows) gives its per-worker payloads back.
  for (size_t i = 0; i + kFullPayloadRecords < audit_.size(); ++i) {
    AuditRecord& old = audit_[i];
    if ((old.outcome != AuditRecord::Outcome::kExecuted || old.measured_gain) && HasPayload(old)) {
      StripPayload(&old);
      changed_records_.insert(old.id);
    }
  }
  state_changed_ = true;  // next_id
  return audit_.back().id;
}

void History::SetMeasuredGain(uint64_t id, double gain, int64_t now_ms) {
  if (AuditRecord* r = MutableRecord(id)) {
    r->measured_gain = gain;
    r->measured_at_ms = now_ms;
    changed_records_.insert(id);
  }
}

void History::MarkRolledBack(uint64_t id) {
  if (AuditRecord* r = MutableRecord(id)) {
    r->rolled_back = true;
    changed_records_.insert(id);
  }
}

void History::AddNodeIncident(const std::string& node, int64_t now_ms) {
  NodeRecord& rec = nodes_[node];
  ++rec.incidents;
  rec.last_ms = now_ms;
  state_changed_ = true;
}

History::Changes History::TakeChanges() {
  Changes c;
  c.records.assign(changed_records_.begin(), changed_records_.end());
  c.state = state_changed_;
  changed_records_.clear();
  state_changed_ = false;
  return c;
}

void History::Restore(std::deque<AuditRecord> audit, uint64_t next_id, std::optional<BatchPlan> plan,
                      std::vector<WorkerAllocation> allocations, bool tail_backups,
                      std::vector<std::string> excluded, std::map<std::string, NodeRecord> nodes) {
  audit_ = std::move(audit);
  next_id_ = std::max<uint64_t>(next_id, audit_.empty() ? 1 : audit_.back().id + 1);
  plan_ = std::move(plan);
  allocations_ = std::move(allocations);
  tail_backups_ = tail_backups;
  excluded_ = std::move(excluded);
  nodes_ = std::move(nodes);
  changed_records_.clear();
  state_changed_ = false;
}

}  // namespace pacer
