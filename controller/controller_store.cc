#include "controller/controller_store.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/write_batch.h>

#include <cinttypes>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/status.h"
#include "controller/controller.h"

namespace pacer {
namespace {

constexpr char kAuditPrefix[] = "audit/";

constexpr char kStateKey[] = "state";
constexpr char kPolicyKey[] = "policy";

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsCorruption()) return absl::DataLossError("controller store: " + what + ": " + s.ToString());
  return absl::UnavailableError("controller store: " + what + ": " + s.ToString());
}

}  // namespace


namespace {

// ---- The store before the journal (format v0), imported on open ----
// v0 layout: "audit/<20-digit id>" -> AuditState (with its dispatch note), "state" ->
// ControllerState, "policy" -> AppliedPolicy, each Save one synced WriteBatch. Kept only to read
// such a folder once (ImportStoreV0); nothing writes it any more.
absl::StatusOr<std::optional<LegacyImport>> ImportStoreV0(rocksdb::DB& db) {
  ControllerSnapshot snap;
  snap.set_seq(1);
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(ro));
  size_t keys = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++keys;
  if (absl::Status s = FromRocks(it->status(), "reading the v0 store"); !s.ok()) return s;
  for (it->Seek(kAuditPrefix); it->Valid() && it->key().starts_with(kAuditPrefix); it->Next()) {
    AuditState* p = snap.add_records();
    if (!p->ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("controller store: record '" + it->key().ToString() + "' does not parse");
    }
    if (auto r = AuditFromProto(*p); !r.ok()) {
      return absl::DataLossError("controller store: record '" + it->key().ToString() +
                                 "': " + std::string(r.status().message()));
    }
  }
  if (absl::Status s = FromRocks(it->status(), "reading the audit"); !s.ok()) return s;
  size_t known = static_cast<size_t>(snap.records_size());
  std::string value;
  rocksdb::Status st = db.Get(ro, kStateKey, &value);
  if (st.ok()) {
    if (!snap.mutable_state()->ParseFromString(value)) {
      return absl::DataLossError("controller store: state does not parse");
    }
    for (const auto& w : snap.state().excluded()) snap.mutable_exclusion()->add_excluded(w);
    ++known;
  } else if (!st.IsNotFound()) {
    return FromRocks(st, "reading the state");
  }
  st = db.Get(ro, kPolicyKey, &value);
  if (st.ok()) {
    if (!snap.mutable_policy()->ParseFromString(value)) {
      return absl::DataLossError("controller store: policy does not parse");
    }
    ++known;
  } else if (!st.IsNotFound()) {
    return FromRocks(st, "reading the policy");
  }
  if (known != keys) return std::optional<LegacyImport>();  // something else: not a v0 store
  if (auto check = ControllerDurableState::FromSnapshot(snap); !check.ok()) {
    return absl::DataLossError("controller store: " + std::string(check.status().message()));
  }
  LegacyImport out;
  out.snapshot = snap.SerializeAsString();
  out.delete_keys = {kStateKey, kPolicyKey};
  out.delete_ranges = {{kAuditPrefix, "audit0"}};  // '0' follows '/'
  out.what = absl::StrCat("controller store v0 (", snap.records_size(), " audit records",
                          snap.state().has_plan() ? ", a plan" : "", snap.has_policy() ? ", a policy" : "",
                          ")");
  return std::optional<LegacyImport>(std::move(out));
}

// Rebuilds the durable state from the journal, at open and after a failed write: the
// snapshot's state, then each later update applied in order (`replayed` counts them).
struct Rebuild {
  ControllerDurableState& state;
  uint64_t replayed = 0;
  auto FromSnapshot() {
    return [this](const ControllerSnapshot& snap) -> absl::Status {
      ASSIGN_OR_RETURN(state, ControllerDurableState::FromSnapshot(snap));
      return absl::OkStatus();
    };
  }
  auto Replay() {
    return [this](const ControllerUpdate& u) {
      ++replayed;
      return state.ApplyChecked(u);
    };
  }
};

}  // namespace

ExclusionState NameExclusionInForce(const History& history) {
  ExclusionState e;
  for (const auto& w : history.excluded_workers()) e.add_excluded(w);
  const auto& audit = history.audit();
  for (auto it = audit.rbegin(); it != audit.rend(); ++it) {
    if (it->outcome != AuditRecord::Outcome::kExecuted || it->action.kind != ActionKind::kExcludeWorkers)
      continue;
    e.set_version(it->id);
    e.set_reason(it->action.reason);
    e.set_step_rule(DecidedByStepRule(*it));
    break;
  }
  return e;
}

absl::StatusOr<std::unique_ptr<ControllerStore>> ControllerStore::Open(
    const std::string& dir, bool must_exist, bool accept_data_loss,
    std::shared_ptr<rocksdb::FileSystem> fs, decltype(JournalOptions::open_log) open_log) {
  JournalOptions o;
  o.open_log = std::move(open_log);
  o.fs = std::move(fs);
  o.dir = dir;
  o.must_exist = must_exist;
  o.accept_data_loss = accept_data_loss;
  o.import_legacy = ImportStoreV0;
  std::unique_ptr<ControllerStore> store(new ControllerStore());
  ControllerDurableState& state = store->state_;
  Rebuild rebuild{state};
  auto journal = ControllerJournal::Open(o, rebuild.FromSnapshot(), rebuild.Replay());
  if (!journal.ok()) return journal.status();
  store->journal_ = std::move(*journal);
  store->snapshot_seq_ = state.last_seq() - rebuild.replayed;
  if (!store->journal_->recovery().imported.empty()) {
    PACER_LOG(WARNING) << "controller store '" << dir << "' migrated to " << kControllerJournalFormat
                       << ": " << store->journal_->recovery().imported;
  }
  return store;
}

ControllerStore::~ControllerStore() = default;

absl::StatusOr<ControllerStore::Loaded> ControllerStore::Load() const {
  Loaded out;
  out.empty = state_.empty();
  for (const auto& [id, p] : state_.records()) {
    auto r = AuditFromProto(p);
    if (!r.ok()) return absl::DataLossError(absl::StrCat("controller store: record ", id, ": ", r.status().message()));
    out.audit.push_back(std::move(*r));
  }
  out.dispatch = state_.dispatch();
  ControllerState& s = out.state;
  s.set_next_audit_id(state_.next_audit_id());
  if (state_.plan()) *s.mutable_plan() = *state_.plan();
  for (const auto& a : state_.allocations()) *s.add_allocations() = a;
  s.set_tail_backups(state_.tail_backups());
  for (const auto& w : state_.exclusion().excluded()) s.add_excluded(w);
  for (const auto& [node, n] : state_.nodes()) {
    ControllerState::Node& pn = (*s.mutable_nodes())[node];
    pn.set_incidents(n.incidents);
    pn.set_last_ms(n.last_ms);
  }
  out.exclusion = state_.exclusion();
  out.policy = state_.policy();
  return out;
}

absl::StatusOr<bool> ControllerStore::RecoverIfFailed() {
  if (journal_->health().ok()) return false;
  ControllerDurableState state;
  Rebuild rebuild{state};
  absl::Status s = journal_->Recover(rebuild.FromSnapshot(), rebuild.Replay());
  if (!s.ok()) return s;
  // What was applied here but never written was never acknowledged: the owner rebuilds its
  // memory from state() and decides again.
  state_ = std::move(state);
  snapshot_seq_ = state_.last_seq() - rebuild.replayed;
  return true;
}

absl::StatusOr<uint64_t> ControllerStore::Append(std::vector<ControllerUpdate> updates) {
  if (absl::Status s = journal_->health(); !s.ok()) return s;
  if (updates.empty()) return uint64_t{0};
  for (ControllerUpdate& u : updates) {
    u.set_seq(state_.last_seq() + 1);
    if (absl::Status s = state_.Validate(u); !s.ok()) {
      return absl::InternalError(absl::StrCat("controller store: an update would not apply: ", s.message()));
    }
    state_.Apply(u);
  }
  const uint64_t last = state_.last_seq();
  journal_->AppendAll(std::move(updates));
  if (last - snapshot_seq_ >= kSnapshotEvery) {
    journal_->WriteSnapshot(state_.ToSnapshot());
    snapshot_seq_ = last;
  }
  return last;
}

absl::Status ControllerStore::WaitDurable(uint64_t seq) {
  if (seq == 0) return absl::OkStatus();
  absl::Notification done;
  absl::Status result;
  journal_->WhenDurable(seq, [&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

absl::Status ControllerStore::Commit(std::vector<ControllerUpdate> updates) {
  ASSIGN_OR_RETURN(bool recovered, RecoverIfFailed());
  (void)recovered;
  ASSIGN_OR_RETURN(uint64_t seq, Append(std::move(updates)));
  return WaitDurable(seq);
}

void RestoreHistory(const ControllerDurableState& state, History* history) {
  history->Clear();
  for (const auto& [id, record] : state.records()) {
    ControllerUpdate u;
    *u.mutable_record() = record;
    history->Apply(u);
  }
  ControllerUpdate u;
  u.mutable_next_audit_id()->set_next_id(state.next_audit_id());
  history->Apply(u);
  u.Clear();
  PlanInForce* plan = u.mutable_plan();
  if (state.plan()) *plan->mutable_plan() = *state.plan();
  history->Apply(u);
  u.Clear();
  for (const auto& a : state.allocations()) *u.mutable_allocations()->add_allocations() = a;
  u.mutable_allocations()->set_tail_backups(state.tail_backups());
  history->Apply(u);
  u.Clear();
  *u.mutable_exclusion() = state.exclusion();
  history->Apply(u);
  for (const auto& [node, n] : state.nodes()) {
    u.Clear();
    u.mutable_node()->set_node(node);
    u.mutable_node()->set_incidents(n.incidents);
    u.mutable_node()->set_last_ms(n.last_ms);
    history->Apply(u);
  }
}

}  // namespace pacer
