#include "controller/history.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

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
  // Ids grow along the audit: a binary search, checked (a linear search otherwise).
  auto it = std::lower_bound(audit_.begin(), audit_.end(), id,
                             [](const AuditRecord& r, uint64_t v) { return r.id < v; });
  if (it != audit_.end() && it->id == id) return &*it;
  for (const auto& r : audit_)
    if (r.id == id) return &r;
  return nullptr;
}

AuditRecord* History::MutableRecord(uint64_t id) {
  return const_cast<AuditRecord*>(static_cast<const History*>(this)->FindRecord(id));
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
        // Changed in place (the update a fresh copy would make), encoded for the journal.
        it->last_seen_ms = record.time_ms;
        ++it->repeats;
        EmitChanged(*it);
        return it->id;
      }
      break;  // only the newest record of this kind and target may absorb it
    }
  }
  record.id = next_id_;
  record.action.id = record.id;
  record.last_seen_ms = record.time_ms;
  const uint64_t id = record.id;
  EmitRecord(std::move(record));
  if (max_records >= 1 && static_cast<int64_t>(audit_.size()) > max_records) {
    ControllerUpdate trim;  // the newest max_records stay
    trim.mutable_audit_trim()->set_oldest_id(audit_[audit_.size() - static_cast<size_t>(max_records)].id);
    Emit(std::move(trim));
  }
  // Beyond the newest kFullPayloadRecords, a record that can no longer be rolled back (not
  // executed, or measured: MeasureAndRollBack copies what it restores before any Record call
  // that follows) gives its per-worker payloads back.
  // Only the records that hold payloads are visited (with_payload_, in audit order), not the
  // whole audit at every record: at a few exclusions a second that was 1 000 records each time.
  if (audit_.size() > kFullPayloadRecords) {
    const uint64_t newest_kept = audit_[audit_.size() - kFullPayloadRecords].id;
    for (auto it = with_payload_.begin(); it != with_payload_.end() && *it < newest_kept;) {
      AuditRecord* old = MutableRecord(*it);
      if (old != nullptr && old->outcome == AuditRecord::Outcome::kExecuted && !old->measured_gain) {
        ++it;
        continue;
      }
      if (old != nullptr) {
        StripPayload(old);
        EmitChanged(*old);
      }
      it = with_payload_.erase(it);
    }
  }
  return id;
}

void History::SetMeasuredGain(uint64_t id, double gain, int64_t now_ms) {
  if (AuditRecord* r = MutableRecord(id)) {
    r->measured_gain = gain;
    r->measured_at_ms = now_ms;
    EmitChanged(*r);
  }
}

void History::MarkRolledBack(uint64_t id) {
  if (AuditRecord* r = MutableRecord(id)) {
    r->rolled_back = true;
    EmitChanged(*r);
  }
}

void History::SetPlan(const BatchPlan& plan) {
  // Applied as it is at hand (PlanFromProto(PlanToProto(plan)) is `plan`: every field
  // round-trips), encoded only for the journal: a 4 096-worker plan is ~8 000 allocations
  // each way.
  if (journaled_) {
    ControllerUpdate u;
    *u.mutable_plan()->mutable_plan() = PlanToProto(plan);
    pending_.push_back(std::move(u));
  }
  plan_ = plan;
}

void History::ClearPlan() {
  ControllerUpdate u;
  u.mutable_plan();  // no plan: none in force
  Emit(std::move(u));
}

void History::SetAllocations(std::vector<WorkerAllocation> allocations) {
  ControllerUpdate u;
  AllocationsToProto(allocations, u.mutable_allocations()->mutable_allocations());
  u.mutable_allocations()->set_tail_backups(tail_backups_);
  Emit(std::move(u));
}

void History::SetTailBackups(bool on) {
  ControllerUpdate u;
  AllocationsToProto(allocations_, u.mutable_allocations()->mutable_allocations());
  u.mutable_allocations()->set_tail_backups(on);
  Emit(std::move(u));
}

void History::SetExcluded(std::vector<std::string> workers, uint64_t decided_by,
                          const std::string& reason, bool step_rule) {
  ControllerUpdate u;
  ExclusionState* e = u.mutable_exclusion();
  for (auto& w : workers) e->add_excluded(std::move(w));
  e->set_version(decided_by);
  e->set_reason(reason);
  e->set_step_rule(step_rule);
  Emit(std::move(u));
}

void History::AddNodeIncident(const std::string& node, int64_t now_ms) {
  ControllerUpdate u;
  auto* n = u.mutable_node();
  n->set_node(node);
  n->set_incidents(NodeIncidents(node) + 1);
  n->set_last_ms(now_ms);
  Emit(std::move(u));
}

void History::Emit(ControllerUpdate update) {
  Apply(update);
  if (journaled_) pending_.push_back(std::move(update));
}

void History::EmitRecord(AuditRecord record) {
  // The record is at hand decoded: applied as such, encoded only for the journal.
  if (journaled_) *pending_.emplace_back().mutable_record() = AuditToProto(record);
  ApplyRecord(std::move(record));
}

void History::EmitChanged(const AuditRecord& record) {
  // What EmitRecord(copy of `record`) would do once the record is changed where it stands:
  // ApplyRecord would replace it by itself (its id is below next_id_).
  if (journaled_) *pending_.emplace_back().mutable_record() = AuditToProto(record);
}

std::vector<ControllerUpdate> History::TakeUpdates() {
  std::vector<ControllerUpdate> out;
  out.swap(pending_);
  return out;
}

absl::Status History::Validate(const ControllerUpdate& u) {
  switch (u.kind_case()) {
    case ControllerUpdate::kRecord: {
      if (u.record().id() == 0) return absl::InvalidArgumentError("audit record without an id");
      auto r = AuditFromProto(u.record());
      if (!r.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("audit record ", u.record().id(), ": ", r.status().message()));
      }
      return absl::OkStatus();
    }
    case ControllerUpdate::kNode:
      if (u.node().node().empty()) return absl::InvalidArgumentError("node incidents without a node");
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

void History::ApplyRecord(AuditRecord record) {
  next_id_ = std::max(next_id_, record.id + 1);
  if (HasPayload(record)) with_payload_.insert(record.id);
  else with_payload_.erase(record.id);
  // Ids grow: a new record goes at the back; a changed one is found from the back.
  for (auto it = audit_.rbegin(); it != audit_.rend() && it->id >= record.id; ++it) {
    if (it->id == record.id) {
      *it = std::move(record);
      return;
    }
  }
  audit_.push_back(std::move(record));
}

void History::Apply(const ControllerUpdate& u) {
  switch (u.kind_case()) {
    case ControllerUpdate::kRecord: {
      auto r = AuditFromProto(u.record());
      if (r.ok()) ApplyRecord(std::move(*r));  // Validate() refused what does not decode
      break;
    }
    case ControllerUpdate::kAuditTrim:
      while (!audit_.empty() && audit_.front().id < u.audit_trim().oldest_id()) audit_.pop_front();
      with_payload_.erase(with_payload_.begin(),
                          with_payload_.lower_bound(u.audit_trim().oldest_id()));
      break;
    case ControllerUpdate::kPlan:
      if (u.plan().has_plan()) plan_ = PlanFromProto(u.plan().plan());
      else plan_.reset();
      break;
    case ControllerUpdate::kAllocations:
      allocations_ = AllocationsFromProto(u.allocations().allocations());
      tail_backups_ = u.allocations().tail_backups();
      break;
    case ControllerUpdate::kExclusion:
      exclusion_ = u.exclusion();
      excluded_.assign(exclusion_.excluded().begin(), exclusion_.excluded().end());
      break;
    case ControllerUpdate::kNode:
      nodes_[u.node().node()] = {u.node().incidents(), u.node().last_ms()};
      break;
    case ControllerUpdate::kNextAuditId:
      next_id_ = std::max(next_id_, u.next_audit_id().next_id());
      break;
    case ControllerUpdate::kDispatch:
    case ControllerUpdate::kPolicy:
    case ControllerUpdate::KIND_NOT_SET:
      break;
  }
}

void History::Clear() {
  audit_.clear();
  with_payload_.clear();
  next_id_ = 1;
  plan_.reset();
  allocations_.clear();
  tail_backups_ = false;
  excluded_.clear();
  exclusion_.Clear();
  nodes_.clear();
  pending_.clear();
}

}  // namespace pacer
