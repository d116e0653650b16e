#include "controller/controller_durable_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "controller/controller_store.h"
#include "controller/history.h"

namespace pacer {

absl::Status ControllerDurableState::Validate(const ControllerUpdate& u) const {
  if (u.seq() != last_seq_ + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("controller update ", u.seq(), " is not the next one (", last_seq_ + 1, ")"));
  }
  switch (u.kind_case()) {
    case ControllerUpdate::kDispatch:
      if (u.dispatch().id() == 0) return absl::InvalidArgumentError("dispatch note without an id");
      return absl::OkStatus();
    case ControllerUpdate::KIND_NOT_SET:
      break;
    default:
      return History::Validate(u);  // records and node incidents are the History's
  }
  return absl::InvalidArgumentError(
      absl::StrCat("controller update ", u.seq(), " has no kind (written by a newer pacerd?)"));
}

void ControllerDurableState::Apply(const ControllerUpdate& u) {
  last_seq_ = u.seq();
  switch (u.kind_case()) {
    case ControllerUpdate::kRecord: {
      AuditState r = u.record();
      r.clear_dispatch();  // notes are their own updates
      const uint64_t id = r.id();
      next_audit_id_ = std::max(next_audit_id_, id + 1);
      records_[id] = std::move(r);
      break;
    }
    case ControllerUpdate::kAuditTrim: {
      const uint64_t oldest = u.audit_trim().oldest_id();
      records_.erase(records_.begin(), records_.lower_bound(oldest));
      dispatch_.erase(dispatch_.begin(), dispatch_.lower_bound(oldest));
      break;
    }
    case ControllerUpdate::kPlan:
      if (u.plan().has_plan()) plan_ = u.plan().plan();
      else plan_.reset();
      break;
    case ControllerUpdate::kAllocations:
      allocations_.assign(u.allocations().allocations().begin(), u.allocations().allocations().end());
      tail_backups_ = u.allocations().tail_backups();
      break;
    case ControllerUpdate::kExclusion:
      exclusion_ = u.exclusion();
      break;
    case ControllerUpdate::kNode:
      nodes_[u.node().node()] = {u.node().incidents(), u.node().last_ms()};
      break;
    case ControllerUpdate::kDispatch:
      // A note for a record no longer held (dropped meanwhile) has nothing to annotate.
      if (records_.count(u.dispatch().id())) dispatch_[u.dispatch().id()] = u.dispatch().note();
      break;
    case ControllerUpdate::kPolicy:
      policy_ = u.policy();
      break;
    case ControllerUpdate::kNextAuditId:
      next_audit_id_ = std::max(next_audit_id_, u.next_audit_id().next_id());
      break;
    case ControllerUpdate::KIND_NOT_SET:
      break;  // refused by Validate
  }
}

absl::Status ControllerDurableState::ApplyChecked(const ControllerUpdate& u) {
  if (absl::Status s = Validate(u); !s.ok()) return s;
  Apply(u);
  return absl::OkStatus();
}

ControllerSnapshot ControllerDurableState::ToSnapshot() const {
  ControllerSnapshot s;
  s.set_seq(last_seq_);
  for (const auto& [id, r] : records_) {
    AuditState* p = s.add_records();
    *p = r;
    if (auto d = dispatch_.find(id); d != dispatch_.end()) p->set_dispatch(d->second);
  }
  ControllerState* st = s.mutable_state();
  st->set_next_audit_id(next_audit_id_);
  if (plan_) *st->mutable_plan() = *plan_;
  for (const auto& a : allocations_) *st->add_allocations() = a;
  st->set_tail_backups(tail_backups_);
  for (const auto& w : exclusion_.excluded()) st->add_excluded(w);
  for (const auto& [node, n] : nodes_) {
    ControllerState::Node& pn = (*st->mutable_nodes())[node];
    pn.set_incidents(n.incidents);
    pn.set_last_ms(n.last_ms);
  }
  *s.mutable_exclusion() = exclusion_;
  if (policy_) *s.mutable_policy() = *policy_;
  return s;
}

absl::StatusOr<ControllerDurableState> ControllerDurableState::FromSnapshot(const ControllerSnapshot& s) {
  ControllerDurableState d;
  d.last_seq_ = s.seq();
  uint64_t prev = 0;
  for (const AuditState& r : s.records()) {
    if (r.id() == 0 || r.id() <= prev) {
      return absl::InvalidArgumentError(absl::StrCat("snapshot record ids out of order at ", r.id()));
    }
    prev = r.id();
    if (auto ok = AuditFromProto(r); !ok.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("audit record ", r.id(), ": ", ok.status().message()));
    }
    AuditState copy = r;
    if (!copy.dispatch().empty()) d.dispatch_[r.id()] = copy.dispatch();
    copy.clear_dispatch();
    d.records_.emplace(r.id(), std::move(copy));
  }
  const ControllerState& st = s.state();
  d.next_audit_id_ = std::max<uint64_t>({uint64_t{1}, st.next_audit_id(), prev + 1});
  if (st.has_plan()) d.plan_ = st.plan();
  d.allocations_.assign(st.allocations().begin(), st.allocations().end());
  d.tail_backups_ = st.tail_backups();
  for (const auto& [node, n] : st.nodes()) d.nodes_[node] = {n.incidents(), n.last_ms()};
  d.exclusion_ = s.exclusion();
  if (d.exclusion_.excluded().empty() && !st.excluded().empty()) {
    d.exclusion_.mutable_excluded()->CopyFrom(st.excluded());  // an imported store (v0)
  }
  if (s.has_policy()) d.policy_ = s.policy();
  return d;
}

}  // namespace pacer
