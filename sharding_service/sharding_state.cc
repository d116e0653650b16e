#include "sharding_service/sharding_state.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "sharding_service/permutation.h"

namespace pacer {
namespace {

constexpr uint64_t kStreamLimit = std::numeric_limits<uint64_t>::max();

bool IsFailure(LeaseEndReason r) {
  return r == LEASE_FAILED || r == LEASE_EXPIRED || r == LEASE_WORKER_LOST;
}

}  // namespace

const char* LeaseEndReasonName(LeaseEndReason reason) {
  switch (reason) {
    case LEASE_COMPLETED: return "completed";
    case LEASE_RELEASED: return "released";
    case LEASE_FAILED: return "failed";
    case LEASE_EXPIRED: return "expired";
    case LEASE_WORKER_LOST: return "worker lost";
    case LEASE_CANCELLED: return "cancelled";
    default: return "unspecified";
  }
}

bool ShardingState::Dataset::Finished() const {
  return !is_stream() && open.empty() && spec->num_epochs() != 0 &&
         next_epoch >= spec->num_epochs();
}

absl::Status ShardingState::CheckWorker(const std::string& worker, uint64_t incarnation) const {
  const WorkerRec* w = FindWorker(worker);
  if (w == nullptr) {
    return absl::NotFoundError("unknown worker '" + worker + "': call RegisterWorker first");
  }
  if (w->incarnation != incarnation) {
    // The current incarnation is not named: it would let one worker speak as another.
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", worker, "': stale incarnation ", incarnation,
        ": this process was replaced; register again"));
  }
  if (w->lost) {
    return absl::FailedPreconditionError("worker '" + worker +
                                         "' was declared lost (missed heartbeats); register again");
  }
  return absl::OkStatus();
}

absl::Status ShardingState::CheckLease(const std::string& worker, uint64_t incarnation,
                                       uint64_t lease_id, uint64_t token) const {
  if (auto s = CheckWorker(worker, incarnation); !s.ok()) return s;
  const LeaseRec* lease = FindLease(lease_id);
  if (lease == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("lease ", lease_id, " has ended"));
  }
  if (lease->worker != worker) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease ", lease_id, " is not held by worker '", worker, "'"));
  }
  if (lease->token != token) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale fencing token ", token, " for lease ", lease_id));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Apply.

absl::StatusOr<ApplyEffects> ShardingState::Commit(Update* update, int64_t now_ms) {
  update->set_seq(last_seq_ + 1);
  update->set_time_ms(now_ms);
  RETURN_IF_ERROR(Validate(*update));
  return Apply(*update);
}

absl::Status ShardingState::ApplyChecked(const Update& update) {
  RETURN_IF_ERROR(Validate(update));
  Apply(update);
  return absl::OkStatus();
}

absl::StatusOr<FetchDecision> ShardingState::DecideFetch(const std::string& worker,
                                                         const std::string& dataset,
                                                         uint64_t request_id,
                                                         const FetchRates* rates) const {
  ASSIGN_OR_RETURN(FetchPlan plan, PlanFetch(worker, dataset, /*v2_planner=*/false, rates));
  FetchDecision d;
  d.kind = plan.kind;
  d.reason = plan.reason;
  if (plan.kind == FetchPlan::kLease || plan.kind == FetchPlan::kBackup) {
    d.update.emplace();
    *d.update->mutable_create_lease() = DecideLease(plan, worker, dataset, request_id);
  }
  return d;
}

absl::Status ShardingState::Validate(const Update& update) const {
  if (update.seq() != last_seq_ + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("update ", update.seq(), " is not the next one (", last_seq_ + 1, ")"));
  }
  switch (update.kind_case()) {
    case Update::kRegisterDataset: return ValidateRegisterDataset(update.register_dataset());
    case Update::kRegisterWorker: return ValidateRegisterWorker(update.register_worker());
    case Update::kCreateLease: return ValidateCreateLease(update.create_lease());
    case Update::kProgress: return ValidateProgress(update.progress());
    case Update::kEndLease: return ValidateEndLease(update.end_lease());
    case Update::kWorkerLost:
    case Update::kSetAllocation: {
      const std::string& id = update.has_worker_lost() ? update.worker_lost().worker_id()
                                                       : update.set_allocation().worker_id();
      if (workers_.count(id) == 0) return absl::NotFoundError("unknown worker '" + id + "'");
      if (update.has_set_allocation()) return ValidateAllocation(update.set_allocation());
      return absl::OkStatus();
    }
    case Update::kSaveCheckpoint: return ValidateCheckpointTag(update.save_checkpoint().tag());
    case Update::kRestoreCheckpoint:
    case Update::kDeleteCheckpoint: {
      const std::string& tag = update.has_restore_checkpoint() ? update.restore_checkpoint().tag()
                                                               : update.delete_checkpoint().tag();
      if (checkpoints_.count(tag) == 0) {
        return absl::NotFoundError("unknown checkpoint '" + tag + "'");
      }
      return absl::OkStatus();
    }
    case Update::kSetTailBackup:
    case Update::kDeleteDataset:
    case Update::kResetDataset: {
      const std::string& name = update.has_set_tail_backup() ? update.set_tail_backup().dataset()
                                : update.has_delete_dataset() ? update.delete_dataset().dataset()
                                                              : update.reset_dataset().dataset();
      if (datasets_.count(name) == 0) return absl::NotFoundError("unknown dataset '" + name + "'");
      return absl::OkStatus();
    }
    case Update::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("update has no kind (written by a newer pacerd?)");
}

ApplyEffects ShardingState::Apply(const Update& update) {
  cancelled_.clear();
  const int64_t t = update.time_ms();
  switch (update.kind_case()) {
    case Update::kRegisterDataset: ApplyRegisterDataset(update.register_dataset()); break;
    case Update::kRegisterWorker: ApplyRegisterWorker(update.register_worker(), t); break;
    case Update::kCreateLease: ApplyCreateLease(update.create_lease(), t); break;
    case Update::kProgress: ApplyProgress(update.progress(), t); break;
    case Update::kEndLease: ApplyEndLease(update.end_lease(), t); break;
    case Update::kWorkerLost: ApplyWorkerLost(update.worker_lost(), t); break;
    case Update::kSaveCheckpoint: ApplySaveCheckpoint(update.save_checkpoint(), t); break;
    case Update::kRestoreCheckpoint: ApplyRestoreCheckpoint(update.restore_checkpoint(), t); break;
    case Update::kDeleteCheckpoint: checkpoints_.erase(update.delete_checkpoint().tag()); break;
    case Update::kSetAllocation: ApplySetAllocation(update.set_allocation()); break;
    case Update::kSetTailBackup:
      datasets_.at(update.set_tail_backup().dataset()).tail_backup =
          update.set_tail_backup().enabled();
      break;
    case Update::kDeleteDataset: ApplyDeleteDataset(update.delete_dataset()); break;
    case Update::kResetDataset: ApplyResetDataset(update.reset_dataset()); break;
    case Update::KIND_NOT_SET:
      PACER_CHECK(false) << "Apply of an update without a kind (Validate refuses it)";
  }
  last_seq_ = update.seq();
  ApplyEffects effects;
  effects.cancelled_leases.swap(cancelled_);
  return effects;
}

ShardingState::Epoch ShardingState::MakeEpoch(const Dataset& ds, uint32_t epoch) const {
  Epoch ep;
  ep.epoch = epoch;
  if (ds.is_stream()) {
    for (const auto& p : ds.spec->stream().partitions()) {
      Partition d;
      d.start = d.frontier = p.start_offset();
      d.limit = kStreamLimit;
      ep.partitions.push_back(std::move(d));
    }
  } else {
    Partition d;
    d.limit = ds.records_per_epoch;
    ep.partitions.push_back(std::move(d));
  }
  return ep;
}

uint64_t ShardingState::HeldBytes(const DatasetSpec& spec) {
  const uint64_t partitions =
      spec.source_case() == DatasetSpec::kStream ? spec.stream().partitions_size() : 1;
  return spec.SpaceUsedLong() + partitions * kPartitionHeldBytes;
}

absl::Status ShardingState::ValidateRegisterDataset(const RegisterDatasetUpdate& u) const {
  ASSIGN_OR_RETURN(DatasetSpec spec, NormalizeSpec(u.spec()));
  if (auto it = datasets_.find(spec.name()); it != datasets_.end() &&
      !google::protobuf::util::MessageDifferencer::Equals(*it->second.spec, spec)) {
    return SpecMismatchError(*it->second.spec, spec);
  }
  return absl::OkStatus();
}

void ShardingState::ApplyRegisterDataset(const RegisterDatasetUpdate& u) {
  absl::StatusOr<DatasetSpec> spec = NormalizeSpec(u.spec());
  PACER_CHECK(spec.ok()) << spec.status();
  if (datasets_.count(spec->name()) > 0) return;  // the same spec again (Validate): nothing to do
  Dataset ds;
  ds.spec = std::make_shared<const DatasetSpec>(*std::move(spec));
  ds.records_per_epoch = RecordsPerEpoch(*ds.spec);
  ds.tail_backup = ds.spec->tail_backup();
  ds.held_bytes = HeldBytes(*ds.spec);
  if (ds.is_stream()) {
    ds.open.push_back(MakeEpoch(ds, 0));
    ds.next_epoch = 1;
  }
  datasets_.emplace(ds.spec->name(), std::move(ds));
}

absl::Status ShardingState::ValidateRegisterWorker(const RegisterWorkerUpdate& u) const {
  if (!IsValidName(u.worker_id(), kMaxWorkerIdLength)) {
    return absl::InvalidArgumentError("worker_id: must be 1..256 characters of [A-Za-z0-9._:/-]");
  }
  if (u.node().size() > kMaxWorkerIdLength) {
    return absl::InvalidArgumentError("node: at most 256 characters");
  }
  return absl::OkStatus();
}

void ShardingState::ApplyRegisterWorker(const RegisterWorkerUpdate& u, int64_t t) {
  auto [it, inserted] = workers_.try_emplace(u.worker_id());
  WorkerRec& w = it->second;
  if (inserted) {
    w.id = u.worker_id();
  } else {
    // A new process took this worker's place: the previous incarnation is gone. Its leases
    // end; every ended lease stays remembered, whichever incarnation held it (the registration
    // reply lists them): a process can register and die before it resolves anything, and the
    // next one must still learn what its predecessors' last reports counted. What is kept stays
    // within the bound of "Memory" (sharding_state.h): RememberEnded trims, epochs forget.
    const std::vector<uint64_t> held(w.leases.begin(), w.leases.end());
    for (uint64_t id : held) {
      EndLease(id, LEASE_WORKER_LOST, "worker re-registered", t, /*requeue=*/true);
    }
  }
  w.node = u.node();
  w.incarnation = next_incarnation_++;
  if (w.lost) ForgetConsumerSums();  // live again: a consumer of what it last read
  w.lost = false;
}

absl::StatusOr<CreateLeaseUpdate> ShardingState::DecideV2Lease(const CreateLeaseUpdate& in) const {
  ASSIGN_OR_RETURN(FetchPlan plan, PlanFetch(in.worker_id(), in.dataset(), /*v2_planner=*/true));
  if (plan.kind != FetchPlan::kLease && plan.kind != FetchPlan::kBackup) {
    return absl::FailedPreconditionError("nothing to lease: " + plan.reason);
  }
  return DecideLease(plan, in.worker_id(), in.dataset(), /*request_id=*/0);
}

absl::Status ShardingState::ValidateCreateLease(const CreateLeaseUpdate& u) const {
  if (u.decided()) return CheckDecidedLease(u);
  ASSIGN_OR_RETURN(CreateLeaseUpdate decided, DecideV2Lease(u));
  return CheckDecidedLease(decided);
}

void ShardingState::ApplyCreateLease(const CreateLeaseUpdate& in, int64_t t) {
  CreateLeaseUpdate decided;
  const CreateLeaseUpdate* u = &in;
  if (!in.decided()) {
    // A v2 update: decided now, as Validate decided it (see the header).
    absl::StatusOr<CreateLeaseUpdate> v2 = DecideV2Lease(in);
    PACER_CHECK(v2.ok()) << v2.status();
    decided = *std::move(v2);
    u = &decided;
  }
  Dataset& ds = datasets_.at(u->dataset());
  WorkerRec& w = workers_.at(u->worker_id());
  LeaseRec lease;
  lease.id = next_lease_id_++;
  lease.token = next_token_++;
  lease.worker = w.id;
  lease.dataset = ds.spec->name();
  lease.epoch = u->epoch();
  lease.partition = u->partition();
  lease.begin = u->begin();
  lease.end = u->end();
  lease.created_ms = lease.progress_ms = t;
  lease.incarnation = w.incarnation;
  lease.request_id = u->request_id();
  Epoch* ep = nullptr;
  if (u->backup_of() == 0) {
    if (u->opens_epoch()) ds.open.push_back(MakeEpoch(ds, ds.next_epoch++));
    ep = FindEpoch(ds, u->epoch());
    Partition& dom = ep->partitions[u->partition()];
    if (u->from_requeue()) {
      Pending& front = dom.requeue.front();
      front.begin = u->end();
      front.attempts = 0;  // failures were counted at the old front position
      if (front.begin >= front.end) dom.requeue.pop_front();
    } else {
      dom.frontier = u->end();
    }
    lease.attempts = u->attempts();
  } else {
    LeaseRec& primary = leases_.at(u->backup_of());
    ep = FindEpoch(ds, primary.epoch);
    lease.backup = true;
    lease.partner = primary.id;
    primary.partner = lease.id;
  }
  ep->active_leases++;
  if (!lease.backup) ep->unconsumed_held += lease.unconsumed();
  if (!Consumes(w, lease.dataset)) ForgetConsumerSums();  // it is one of them now (unless lost)
  w.leases.insert(lease.id);
  leases_.emplace(lease.id, std::move(lease));
}

ShardingState::Epoch* ShardingState::FindEpoch(Dataset& ds, uint32_t epoch) {
  for (auto& ep : ds.open) {
    if (ep.epoch == epoch) return &ep;
  }
  return nullptr;
}

void ShardingState::AdvanceDone(LeaseRec& lease, uint64_t new_done, int64_t t) {
  if (new_done <= lease.done) return;
  uint64_t counted = lease.done_pos();
  if (lease.partner != 0) counted = std::max(counted, leases_.at(lease.partner).done_pos());
  const uint64_t unconsumed = lease.unconsumed();
  lease.done = new_done;
  lease.progress_ms = t;
  const bool counts = lease.done_pos() > counted;
  if (!counts && lease.backup) return;
  Dataset& ds = datasets_.at(lease.dataset);
  Epoch* ep = FindEpoch(ds, lease.epoch);
  PACER_CHECK(ep != nullptr) << "lease " << lease.id << " in a closed epoch";
  if (!lease.backup) ep->unconsumed_held -= unconsumed - lease.unconsumed();
  if (counts) {
    const uint64_t delta = lease.done_pos() - counted;
    ep->partitions[lease.partition].done += delta;
    ds.records_done_total += delta;
  }
}

absl::Status ShardingState::ValidateProgress(const ProgressUpdate& u) const {
  const LeaseRec* lease = FindLease(u.lease_id());
  if (lease == nullptr) return absl::NotFoundError(absl::StrCat("no lease ", u.lease_id()));
  if (u.records_done() > lease->end - lease->begin) {
    return absl::InvalidArgumentError(absl::StrCat("records_done ", u.records_done(),
                                                   " exceeds the lease's ",
                                                   lease->end - lease->begin, " records"));
  }
  return absl::OkStatus();
}

void ShardingState::ApplyProgress(const ProgressUpdate& u, int64_t t) {
  AdvanceDone(leases_.at(u.lease_id()), u.records_done(), t);
}

absl::Status ShardingState::ValidateEndLease(const EndLeaseUpdate& u) const {
  const LeaseRec* lease = FindLease(u.lease_id());
  if (lease == nullptr) return absl::NotFoundError(absl::StrCat("no lease ", u.lease_id()));
  const uint64_t len = lease->end - lease->begin;
  switch (u.reason()) {
    case LEASE_COMPLETED:
    case LEASE_RELEASED:
    case LEASE_FAILED:
    case LEASE_EXPIRED:
      break;
    default:
      return absl::InvalidArgumentError("end_lease.reason: must be completed, released, failed "
                                        "or expired");
  }
  if (u.records_done() > len) {
    return absl::InvalidArgumentError(absl::StrCat("records_done ", u.records_done(),
                                                   " exceeds the lease's ", len, " records"));
  }
  return absl::OkStatus();
}

void ShardingState::ApplyEndLease(const EndLeaseUpdate& u, int64_t t) {
  LeaseRec& lease = leases_.at(u.lease_id());
  const uint64_t len = lease.end - lease.begin;
  AdvanceDone(lease, u.reason() == LEASE_COMPLETED ? len : u.records_done(), t);
  EndLease(u.lease_id(), u.reason(), u.detail(), t, /*requeue=*/true);
}

void ShardingState::EndLease(uint64_t lease_id, LeaseEndReason reason, const std::string& detail,
                             int64_t t, bool requeue) {
  LeaseRec lease = leases_.at(lease_id);
  leases_.erase(lease_id);
  Dataset& ds = datasets_.at(lease.dataset);
  Epoch* ep = FindEpoch(ds, lease.epoch);
  PACER_CHECK(ep != nullptr) << "lease " << lease_id << " in a closed epoch";
  Partition& dom = ep->partitions[lease.partition];
  if (!lease.backup) ep->unconsumed_held -= lease.unconsumed();

  bool partner_lives = false;
  uint64_t fence_partner = 0;
  if (lease.partner != 0) {
    LeaseRec& partner = leases_.at(lease.partner);
    partner.partner = 0;
    if (reason == LEASE_COMPLETED) {
      // First completion wins: the other copy is fenced off (below); its records are counted.
      fence_partner = partner.id;
    } else {
      // The survivor goes on; it must not count again what this one counted.
      if (lease.done_pos() > partner.done_pos()) {
        const uint64_t unconsumed = partner.unconsumed();
        partner.done = lease.done_pos() - partner.begin;
        if (!partner.backup) ep->unconsumed_held -= unconsumed - partner.unconsumed();
      }
      partner_lives = true;
    }
  }

  const uint64_t pos = lease.done_pos();
  if (requeue && !partner_lives && pos < lease.end) {
    uint32_t attempts = lease.done == 0 ? lease.attempts : 0;
    if (IsFailure(reason)) attempts++;
    uint64_t rest = pos;
    if (IsFailure(reason) && attempts >= ds.spec->max_attempts()) {
      // Poison: quarantine one batch at the failing position, report it, requeue the rest.
      const uint64_t q_end = std::min(lease.end, pos + std::max<uint64_t>(ds.spec->batch_size(), 1));
      QuarantinedRange q;
      q.set_epoch(lease.epoch);
      q.set_partition(lease.partition);
      q.set_begin(pos);
      q.set_end(q_end);
      q.set_attempts(attempts);
      q.set_detail(detail.empty() ? LeaseEndReasonName(reason) : detail);
      q.set_time_ms(t);
      ds.quarantined.push_back(q);
      dom.quarantined += q_end - pos;
      ds.records_quarantined_total += q_end - pos;
      if (ds.spec->on_poison() == POISON_FAIL && !ds.failed) {
        ds.failed = true;
        ds.failure = absl::StrCat("records [", pos, ", ", q_end, ") of epoch ", lease.epoch,
                                  " failed ", attempts, " times (", q.detail(),
                                  "); on_poison=fail");
      }
      rest = q_end;
      attempts = 0;
    }
    if (rest < lease.end) {
      dom.requeue.push_front(Pending{rest, lease.end, attempts});
      ds.requeues_total++;
    }
  }

  ep->active_leases--;
  RememberEnded(lease, reason);
  if (reason == LEASE_CANCELLED || reason == LEASE_EXPIRED || reason == LEASE_WORKER_LOST) {
    cancelled_.emplace_back(lease.worker, lease_id);
  }
  if (fence_partner != 0) {
    EndLease(fence_partner, LEASE_CANCELLED, "backup partner completed first", t, false);
    return;  // the nested call closed finished epochs
  }
  CloseFinishedEpochs(ds);
}

void ShardingState::RememberEnded(const LeaseRec& lease, LeaseEndReason reason) {
  auto wit = workers_.find(lease.worker);
  if (wit == workers_.end()) return;
  WorkerRec& w = wit->second;
  // Holding `lease`, a live `w` consumed its dataset; below, whether it still does.
  const bool consumed = !w.lost;
  w.leases.erase(lease.id);
  EndedLease e;
  e.set_lease_id(lease.id);
  e.set_records_done(lease.done);
  e.set_reason(reason);
  e.set_dataset(lease.dataset);
  e.set_epoch(lease.epoch);
  e.set_partition(lease.partition);
  e.set_begin(lease.begin);
  e.set_end(lease.end);
  e.set_incarnation(lease.incarnation);
  AddEnded(w, std::move(e));
  // Bounded (a stream's epoch never closes, and one epoch of a huge dataset holds millions of
  // leases): see "Memory" in the header.
  TrimEnded(w);
  if (consumed != Consumes(w, lease.dataset)) ForgetConsumerSums();
}

namespace {
size_t Beyond(size_t n, size_t floor) { return n > floor ? n - floor : 0; }
}  // namespace

size_t ShardingState::EndedFloor(const WorkerRec& w) {
  const size_t max_leases = w.max_leases != 0 ? w.max_leases : kDefaultMaxLeasesPerWorker;
  return std::max(kMinEndedPerWorker, 2 * max_leases);
}

void ShardingState::AddEnded(WorkerRec& w, EndedLease e) {
  const size_t floor = EndedFloor(w);
  const size_t before = Beyond(w.ended.size(), floor);
  const uint64_t id = e.lease_id();
  // A newest ended lease of another dataset moves `w` from one dataset's consumers to the
  // other's (or to the first one's).
  if (w.ended.empty() ||
      (id >= w.ended.rbegin()->first && w.ended.rbegin()->second.dataset() != e.dataset())) {
    ForgetConsumerSums();
  }
  if (!w.ended.insert_or_assign(id, std::move(e)).second) return;  // replaced: same count
  ++ended_total_;
  ended_beyond_floor_ += Beyond(w.ended.size(), floor) - before;
}

std::map<uint64_t, EndedLease>::iterator ShardingState::EraseEnded(
    WorkerRec& w, std::map<uint64_t, EndedLease>::iterator it) {
  const size_t floor = EndedFloor(w);
  const size_t before = Beyond(w.ended.size(), floor);
  // The newest going, the one before it (if any) is the newest: another dataset's, maybe.
  // (Today only the oldest beyond a worker's floor go; this keeps the sums right regardless.)
  if (std::next(it) == w.ended.end() &&
      (it == w.ended.begin() || std::prev(it)->second.dataset() != it->second.dataset())) {
    ForgetConsumerSums();
  }
  it = w.ended.erase(it);
  --ended_total_;
  ended_beyond_floor_ -= before - Beyond(w.ended.size(), floor);
  return it;
}

void ShardingState::TrimEnded(WorkerRec& w) {
  // The smallest ids go first — not the first ended — so a replay forgets exactly the same
  // ones. Only `w`'s own records go, so the cost is O(what is dropped), never O(workers). After
  // this either the job is within kMaxEndedBeyondFloor or `w` holds no more than its floor, so
  // ended_beyond_floor_ can only grow while it is within the budget: it never exceeds it.
  while (w.ended.size() > kMaxEndedPerWorker) EraseEnded(w, w.ended.begin());
  while (ended_beyond_floor_ > kMaxEndedBeyondFloor && w.ended.size() > EndedFloor(w)) {
    EraseEnded(w, w.ended.begin());
  }
}

void ShardingState::ForgetOldEnded(const Dataset& ds) {
  if (ds.is_stream()) return;
  // Keep the open epochs and the one before the oldest of them.
  const uint32_t oldest_open = ds.open.empty() ? ds.next_epoch : ds.open.front().epoch;
  // Each worker's newest EndedFloor(w) stay whatever their epoch: a worker killed while a
  // report was in flight learns its outcome at its next registration, which may come after
  // the rest of the job closed that lease's epoch and the next.
  const uint32_t keep_from = oldest_open == 0 ? 0 : oldest_open - 1;
  for (auto& [id, w] : workers_) {
    const size_t floor = EndedFloor(w);
    if (w.ended.size() <= floor) continue;
    // Only the oldest size - floor may go (the smallest ids, as TrimEnded).
    size_t older = w.ended.size() - floor;
    for (auto it = w.ended.begin(); older > 0; --older) {
      if (it->second.dataset() == ds.spec->name() && it->second.epoch() < keep_from) {
        it = EraseEnded(w, it);
      } else {
        ++it;
      }
    }
  }
}

void ShardingState::CloseFinishedEpochs(Dataset& ds) {
  if (ds.is_stream()) return;
  bool closed = false;
  for (auto it = ds.open.begin(); it != ds.open.end();) {
    bool finished = it->active_leases == 0;
    uint64_t accounted = 0;
    for (const auto& d : it->partitions) {
      finished = finished && !d.HasPending();
      accounted += d.done + d.quarantined;
    }
    if (!finished) {
      ++it;
      continue;
    }
    PACER_CHECK(accounted == ds.records_per_epoch)
        << "dataset " << ds.spec->name() << " epoch " << it->epoch << ": " << accounted
        << " records done or quarantined, expected " << ds.records_per_epoch;
    ds.completed_epochs++;
    it = ds.open.erase(it);
    closed = true;
  }
  if (closed) ForgetOldEnded(ds);
}

void ShardingState::ApplyWorkerLost(const WorkerLostUpdate& u, int64_t t) {
  WorkerRec& w = workers_.at(u.worker_id());
  const std::vector<uint64_t> held(w.leases.begin(), w.leases.end());
  for (uint64_t id : held) EndLease(id, LEASE_WORKER_LOST, "worker lost", t, /*requeue=*/true);
  if (!w.lost) ForgetConsumerSums();  // no longer a consumer of anything
  w.lost = true;
}

uint64_t ShardingState::DropDatasetProgress(const std::string& dataset) {
  std::vector<uint64_t> ids;
  for (const auto& [id, lease] : leases_) {
    if (lease.dataset == dataset) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    // Fenced, like a checkpoint restore: the holder's reports are refused from now on and its
    // next heartbeat lists the lease as cancelled. Nothing is requeued: the epochs go away.
    RememberEnded(leases_.at(id), LEASE_CANCELLED);
    cancelled_.emplace_back(leases_.at(id).worker, id);
    leases_.erase(id);
  }
  for (auto& [tag, cp] : checkpoints_) {
    auto* positions = cp.mutable_datasets();
    for (int i = positions->size() - 1; i >= 0; --i) {
      if (positions->Get(i).dataset() == dataset) positions->DeleteSubrange(i, 1);
    }
  }
  return ids.size();
}

void ShardingState::ApplyDeleteDataset(const DeleteDatasetUpdate& u) {
  DropDatasetProgress(u.dataset());
  datasets_.erase(u.dataset());
  ForgetConsumerSums();  // its sums among them
}

void ShardingState::ApplyResetDataset(const ResetDatasetUpdate& u) {
  auto it = datasets_.find(u.dataset());
  PACER_CHECK(it != datasets_.end()) << "reset of unknown dataset " << u.dataset();
  DropDatasetProgress(u.dataset());
  // As registered: the same (shared) spec, epoch 0, nothing done, quarantined or failed.
  Dataset fresh;
  fresh.spec = it->second.spec;
  fresh.records_per_epoch = it->second.records_per_epoch;
  fresh.tail_backup = it->second.tail_backup;  // the controller's setting, not progress
  if (fresh.is_stream()) {
    fresh.open.push_back(MakeEpoch(fresh, 0));
    fresh.next_epoch = 1;
  }
  it->second = std::move(fresh);
  ForgetConsumerSums();  // its consumers ended their leases: summed again at the next fetch
}

void ShardingState::ApplySetAllocation(const SetAllocationUpdate& u) {
  WorkerRec& w = workers_.at(u.worker_id());
  const double weight = u.weight() > 0 ? u.weight() : 1.0;
  if (weight != w.weight) ForgetConsumerSums();
  w.weight = weight;
  w.shard_size = u.shard_size();
  // max_leases moves the worker's ended-lease floor: recount what lies beyond it, then trim.
  const size_t before = Beyond(w.ended.size(), EndedFloor(w));
  w.max_leases = u.max_leases();
  ended_beyond_floor_ = ended_beyond_floor_ - before + Beyond(w.ended.size(), EndedFloor(w));
  TrimEnded(w);
}

std::map<std::string, double> OldestLeaseAges(const ShardingState& state, int64_t now_ms) {
  std::map<std::string, double> ages;
  for (const auto& [id, lease] : state.leases()) {
    const double age = static_cast<double>(now_ms - lease.created_ms) / 1000.0;
    auto [it, added] = ages.emplace(lease.worker, age);
    if (!added) it->second = std::max(it->second, age);
  }
  return ages;
}

}  // namespace pacer
