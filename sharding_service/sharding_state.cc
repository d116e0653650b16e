#include "sharding_service/sharding_state.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "sharding_service/permutation.h"

namespace pacer {
namespace {

constexpr uint64_t kStreamLimit = std::numeric_limits<uint64_t>::max();

bool ValidName(const std::string& s, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == ':' || c == '/')) {
      return false;
    }
  }
  return true;
}

bool IsFailure(LeaseEndReason r) {
  return r == LEASE_FAILED || r == LEASE_EXPIRED || r == LEASE_WORKER_LOST;
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > kStreamLimit - b ? kStreamLimit : a + b;
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
  return !is_stream() && open.empty() && spec.num_epochs() != 0 &&
         next_epoch >= spec.num_epochs();
}

// ---------------------------------------------------------------------------------------------
// Validation.

absl::StatusOr<DatasetSpec> ShardingState::NormalizeSpec(const DatasetSpec& in) {
  DatasetSpec s = in;
  if (!ValidName(s.name(), kMaxNameLength)) {
    return absl::InvalidArgumentError(
        "dataset.name: must be 1..128 characters of [A-Za-z0-9._:/-]");
  }
  const std::string where = "dataset '" + s.name() + "': ";
  switch (s.source_case()) {
    case DatasetSpec::kNumRecords:
      if (s.num_records() == 0 || s.num_records() > kMaxRecordsPerDataset) {
        return absl::InvalidArgumentError(where + "num_records must be in 1..2^50");
      }
      break;
    case DatasetSpec::kFiles: {
      const auto& files = s.files().files();
      if (files.empty() || files.size() > kMaxFiles) {
        return absl::InvalidArgumentError(where + "files: must list 1..1000000 files");
      }
      uint64_t total = 0;
      for (int i = 0; i < files.size(); ++i) {
        if (files[i].path().empty() || files[i].path().size() > 4096) {
          return absl::InvalidArgumentError(where + "files[" + std::to_string(i) +
                                            "].path: must be 1..4096 characters");
        }
        if (files[i].num_records() > kMaxRecordsPerDataset) {
          return absl::InvalidArgumentError(where + "files[" + std::to_string(i) +
                                            "].num_records: too large");
        }
        total += files[i].num_records();
        if (total > kMaxRecordsPerDataset) {
          return absl::InvalidArgumentError(where + "files: more than 2^50 records in all");
        }
      }
      if (total == 0) return absl::InvalidArgumentError(where + "files: no records");
      break;
    }
    case DatasetSpec::kStream: {
      const auto& parts = s.stream().partitions();
      if (parts.empty() || parts.size() > kMaxPartitions) {
        return absl::InvalidArgumentError(where + "stream.partitions: must list 1..65536");
      }
      std::set<uint32_t> ids;
      for (const auto& p : parts) {
        if (!ids.insert(p.id()).second) {
          return absl::InvalidArgumentError(where + "stream.partitions: duplicate id " +
                                            std::to_string(p.id()));
        }
      }
      if (s.num_epochs() != 0) {
        return absl::InvalidArgumentError(where + "num_epochs: a stream has no epochs");
      }
      if (s.shuffle() != SHUFFLE_NONE) {
        return absl::InvalidArgumentError(where + "shuffle: a stream cannot be shuffled");
      }
      if (s.epoch_barrier()) {
        return absl::InvalidArgumentError(where + "epoch_barrier: a stream has no epochs");
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(where + "one of num_records, files or stream is required");
  }
  if (!ShuffleMode_IsValid(s.shuffle())) {
    return absl::InvalidArgumentError(where + "shuffle: unknown mode");
  }
  if (!PoisonAction_IsValid(s.on_poison())) {
    return absl::InvalidArgumentError(where + "on_poison: unknown action");
  }
  if (s.batch_size() > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(where + "batch_size: at most 16777216");
  }
  if (s.shard_size() == 0) {
    s.set_shard_size(s.batch_size() > 0 ? 10 * s.batch_size() : kDefaultShardSize);
  }
  if (s.batch_size() == 0) s.set_batch_size(1);
  if (s.shard_size() > kMaxShardSize) {
    return absl::InvalidArgumentError(where + "shard_size: at most 2^32");
  }
  if (s.shuffle() == SHUFFLE_RECORDS && s.shard_size() > kMaxRecordsShuffleShardSize) {
    return absl::InvalidArgumentError(
        where + "shard_size: at most 65536 with shuffle=records (a lease lists its record ids)");
  }
  if (s.max_attempts() == 0) s.set_max_attempts(kDefaultMaxAttempts);
  if (s.max_attempts() > 1'000'000) {
    return absl::InvalidArgumentError(where + "max_attempts: at most 1000000");
  }
  return s;
}

absl::Status ShardingState::CheckWorker(const std::string& worker, uint64_t incarnation) const {
  const WorkerRec* w = FindWorker(worker);
  if (w == nullptr) {
    return absl::NotFoundError("unknown worker '" + worker + "': call RegisterWorker first");
  }
  if (w->incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", worker, "': stale incarnation ", incarnation, " (current ",
                     w->incarnation, "): this process was replaced; register again"));
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
    return absl::FailedPreconditionError(absl::StrCat(
        "stale fencing token ", token, " for lease ", lease_id, " (current ", lease->token, ")"));
  }
  return absl::OkStatus();
}

uint64_t ShardingState::ShardSizeFor(const WorkerRec& w, const Dataset& ds) const {
  uint64_t size = w.shard_size;
  if (size == 0) {
    const double scaled = std::round(static_cast<double>(ds.spec.shard_size()) * w.weight);
    size = scaled < 1.0 ? 1 : static_cast<uint64_t>(std::min(scaled, double(kMaxShardSize)));
  }
  if (ds.spec.shuffle() == SHUFFLE_RECORDS) size = std::min(size, kMaxRecordsShuffleShardSize);
  return std::max<uint64_t>(size, 1);
}

absl::StatusOr<FetchPlan> ShardingState::PlanFetch(const std::string& worker,
                                                   const std::string& dataset) const {
  const Dataset* ds = FindDataset(dataset);
  if (ds == nullptr) return absl::NotFoundError("unknown dataset '" + dataset + "'");
  const WorkerRec* w = FindWorker(worker);
  if (w == nullptr) {
    return absl::NotFoundError("unknown worker '" + worker + "': call RegisterWorker first");
  }
  if (ds->failed) {
    return absl::FailedPreconditionError("dataset '" + dataset + "' failed: " + ds->failure);
  }
  FetchPlan plan;
  const uint32_t max_leases = w->max_leases ? w->max_leases : kDefaultMaxLeasesPerWorker;
  uint32_t held = 0;
  for (uint64_t id : w->leases) held += leases_.at(id).dataset == dataset ? 1 : 0;
  if (held >= max_leases) {
    plan.kind = FetchPlan::kWait;
    plan.reason = absl::StrCat("worker holds ", held, " leases of this dataset (quota ",
                               max_leases, ")");
    return plan;
  }
  const uint64_t size = ShardSizeFor(*w, *ds);
  for (size_t i = 0; i < ds->open.size(); ++i) {
    const Epoch& ep = ds->open[i];
    for (uint32_t d = 0; d < ep.domains.size(); ++d) {
      const Domain& dom = ep.domains[d];
      if (dom.requeue.empty()) continue;
      const Pending& front = dom.requeue.front();
      plan.kind = FetchPlan::kLease;
      plan.epoch_index = i;
      plan.domain = d;
      plan.from_requeue = true;
      plan.begin = front.begin;
      plan.end = std::min(front.end, front.begin + size);
      plan.attempts = front.attempts;
      return plan;
    }
    // Fresh positions: the domain that has handed out the fewest (balances stream partitions).
    int best = -1;
    for (uint32_t d = 0; d < ep.domains.size(); ++d) {
      const Domain& dom = ep.domains[d];
      if (dom.frontier >= dom.limit) continue;
      if (best < 0 || dom.frontier - dom.start < ep.domains[best].frontier - ep.domains[best].start) {
        best = static_cast<int>(d);
      }
    }
    if (best >= 0) {
      const Domain& dom = ep.domains[best];
      plan.kind = FetchPlan::kLease;
      plan.epoch_index = i;
      plan.domain = static_cast<uint32_t>(best);
      plan.begin = dom.frontier;
      plan.end = std::min(dom.limit, SaturatingAdd(dom.frontier, size));
      return plan;
    }
  }
  const bool epochs_left = !ds->is_stream() &&
                           (ds->spec.num_epochs() == 0 || ds->next_epoch < ds->spec.num_epochs());
  if (epochs_left) {
    const bool may_open = ds->spec.epoch_barrier() ? ds->open.empty()
                                                   : ds->open.size() < kMaxOpenEpochs;
    if (may_open) {
      plan.kind = FetchPlan::kLease;
      plan.epoch_index = ds->open.size();
      plan.domain = 0;
      plan.begin = 0;
      plan.end = std::min(ds->records_per_epoch, size);
      return plan;
    }
  }
  if (ds->tail_backup) {
    // Lease again the largest unconsumed suffix held by another worker (the likeliest
    // straggler); ties go to the lease that progressed least recently.
    const LeaseRec* best = nullptr;
    uint64_t best_left = 0;
    for (const auto& [id, l] : leases_) {
      if (l.dataset != dataset || l.worker == worker || l.partner != 0 || l.backup) continue;
      const uint64_t left = l.end - l.done_pos();
      if (left < 2) continue;
      if (best == nullptr || left > best_left ||
          (left == best_left && l.progress_ms < best->progress_ms)) {
        best = &l;
        best_left = left;
      }
    }
    if (best != nullptr) {
      plan.kind = FetchPlan::kBackup;
      plan.backup_of = best->id;
      plan.begin = best->done_pos();
      plan.end = best->end;
      return plan;
    }
  }
  if (ds->Finished()) {
    plan.kind = FetchPlan::kEndOfData;
    return plan;
  }
  plan.kind = FetchPlan::kWait;
  if (ds->spec.epoch_barrier() && epochs_left) {
    plan.reason = "epoch barrier: waiting for the current epoch to finish";
  } else if (epochs_left) {
    plan.reason = "two epochs are open: waiting for the older one to finish";
  } else {
    plan.reason = "every pending record is leased; waiting for leases to finish or fail";
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Apply.

absl::Status ShardingState::Apply(const Update& update) {
  absl::Status s;
  const int64_t t = update.time_ms();
  switch (update.kind_case()) {
    case Update::kRegisterDataset: s = ApplyRegisterDataset(update.register_dataset()); break;
    case Update::kRegisterWorker: s = ApplyRegisterWorker(update.register_worker(), t); break;
    case Update::kCreateLease: s = ApplyCreateLease(update.create_lease(), t); break;
    case Update::kProgress: s = ApplyProgress(update.progress(), t); break;
    case Update::kEndLease: s = ApplyEndLease(update.end_lease(), t); break;
    case Update::kWorkerLost: s = ApplyWorkerLost(update.worker_lost(), t); break;
    case Update::kSaveCheckpoint: s = ApplySaveCheckpoint(update.save_checkpoint(), t); break;
    case Update::kRestoreCheckpoint:
      s = ApplyRestoreCheckpoint(update.restore_checkpoint(), t);
      break;
    case Update::kDeleteCheckpoint:
      if (checkpoints_.erase(update.delete_checkpoint().tag()) == 0) {
        s = absl::NotFoundError("unknown checkpoint '" + update.delete_checkpoint().tag() + "'");
      }
      break;
    case Update::kSetAllocation: s = ApplySetAllocation(update.set_allocation()); break;
    case Update::kSetTailBackup: {
      auto it = datasets_.find(update.set_tail_backup().dataset());
      if (it == datasets_.end()) {
        s = absl::NotFoundError("unknown dataset '" + update.set_tail_backup().dataset() + "'");
      } else {
        it->second.tail_backup = update.set_tail_backup().enabled();
      }
      break;
    }
    default:
      s = absl::InvalidArgumentError("update has no kind");
  }
  if (s.ok()) last_seq_ = update.seq();
  return s;
}

ShardingState::Epoch ShardingState::MakeEpoch(const Dataset& ds, uint32_t epoch) const {
  Epoch ep;
  ep.epoch = epoch;
  if (ds.is_stream()) {
    for (const auto& p : ds.spec.stream().partitions()) {
      Domain d;
      d.start = d.frontier = p.start_offset();
      d.limit = kStreamLimit;
      ep.domains.push_back(std::move(d));
    }
  } else {
    Domain d;
    d.limit = ds.records_per_epoch;
    ep.domains.push_back(std::move(d));
  }
  return ep;
}

absl::Status ShardingState::ApplyRegisterDataset(const RegisterDatasetUpdate& u) {
  auto spec = NormalizeSpec(u.spec());
  if (!spec.ok()) return spec.status();
  if (auto it = datasets_.find(spec->name()); it != datasets_.end()) {
    if (google::protobuf::util::MessageDifferencer::Equals(it->second.spec, *spec)) {
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError("dataset '" + spec->name() +
                                    "' already exists with a different spec");
  }
  Dataset ds;
  ds.spec = *spec;
  ds.records_per_epoch = RecordsPerEpoch(ds.spec);
  ds.tail_backup = ds.spec.tail_backup();
  if (ds.is_stream()) {
    ds.open.push_back(MakeEpoch(ds, 0));
    ds.next_epoch = 1;
  }
  datasets_.emplace(ds.spec.name(), std::move(ds));
  return absl::OkStatus();
}

absl::Status ShardingState::ApplyRegisterWorker(const RegisterWorkerUpdate& u, int64_t t) {
  if (!ValidName(u.worker_id(), kMaxWorkerIdLength)) {
    return absl::InvalidArgumentError("worker_id: must be 1..256 characters of [A-Za-z0-9._:/-]");
  }
  if (u.node().size() > kMaxWorkerIdLength) {
    return absl::InvalidArgumentError("node: at most 256 characters");
  }
  auto [it, inserted] = workers_.try_emplace(u.worker_id());
  WorkerRec& w = it->second;
  if (inserted) {
    w.id = u.worker_id();
  } else {
    // A new process took this worker's place: the previous incarnation is gone.
    const std::vector<uint64_t> held(w.leases.begin(), w.leases.end());
    for (uint64_t id : held) {
      EndLease(id, LEASE_WORKER_LOST, "worker re-registered", t, /*requeue=*/true);
    }
  }
  w.node = u.node();
  w.incarnation = next_incarnation_++;
  w.lost = false;
  return absl::OkStatus();
}

absl::Status ShardingState::ApplyCreateLease(const CreateLeaseUpdate& u, int64_t t) {
  auto plan = PlanFetch(u.worker_id(), u.dataset());
  if (!plan.ok()) return plan.status();
  if (plan->kind != FetchPlan::kLease && plan->kind != FetchPlan::kBackup) {
    return absl::FailedPreconditionError("nothing to lease: " + plan->reason);
  }
  Dataset& ds = datasets_.at(u.dataset());
  WorkerRec& w = workers_.at(u.worker_id());
  LeaseRec lease;
  lease.id = next_lease_id_++;
  lease.token = next_token_++;
  lease.worker = w.id;
  lease.dataset = ds.spec.name();
  lease.begin = plan->begin;
  lease.end = plan->end;
  lease.created_ms = lease.progress_ms = t;
  Epoch* ep = nullptr;
  if (plan->kind == FetchPlan::kLease) {
    if (plan->epoch_index == ds.open.size()) ds.open.push_back(MakeEpoch(ds, ds.next_epoch++));
    ep = &ds.open[plan->epoch_index];
    Domain& dom = ep->domains[plan->domain];
    if (plan->from_requeue) {
      Pending& front = dom.requeue.front();
      front.begin = plan->end;
      front.attempts = 0;  // failures were counted at the old front position
      if (front.begin >= front.end) dom.requeue.pop_front();
    } else {
      dom.frontier = plan->end;
    }
    lease.epoch = ep->epoch;
    lease.partition = plan->domain;
    lease.attempts = plan->attempts;
  } else {
    LeaseRec& primary = leases_.at(plan->backup_of);
    ep = FindEpoch(ds, primary.epoch);
    lease.epoch = primary.epoch;
    lease.partition = primary.partition;
    lease.backup = true;
    lease.partner = primary.id;
    primary.partner = lease.id;
  }
  ep->active_leases++;
  w.leases.insert(lease.id);
  leases_.emplace(lease.id, std::move(lease));
  return absl::OkStatus();
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
  lease.done = new_done;
  lease.progress_ms = t;
  if (lease.done_pos() > counted) {
    const uint64_t delta = lease.done_pos() - counted;
    Dataset& ds = datasets_.at(lease.dataset);
    Epoch* ep = FindEpoch(ds, lease.epoch);
    PACER_CHECK(ep != nullptr) << "lease " << lease.id << " in a closed epoch";
    ep->domains[lease.partition].done += delta;
    ds.records_done_total += delta;
  }
}

absl::Status ShardingState::ApplyProgress(const ProgressUpdate& u, int64_t t) {
  auto it = leases_.find(u.lease_id());
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("no lease ", u.lease_id()));
  LeaseRec& lease = it->second;
  if (u.records_done() > lease.end - lease.begin) {
    return absl::InvalidArgumentError(absl::StrCat("records_done ", u.records_done(),
                                                   " exceeds the lease's ",
                                                   lease.end - lease.begin, " records"));
  }
  AdvanceDone(lease, u.records_done(), t);
  return absl::OkStatus();
}

absl::Status ShardingState::ApplyEndLease(const EndLeaseUpdate& u, int64_t t) {
  auto it = leases_.find(u.lease_id());
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("no lease ", u.lease_id()));
  LeaseRec& lease = it->second;
  const uint64_t len = lease.end - lease.begin;
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
  AdvanceDone(lease, u.reason() == LEASE_COMPLETED ? len : u.records_done(), t);
  EndLease(u.lease_id(), u.reason(), u.detail(), t, /*requeue=*/true);
  return absl::OkStatus();
}

void ShardingState::EndLease(uint64_t lease_id, LeaseEndReason reason, const std::string& detail,
                             int64_t t, bool requeue) {
  LeaseRec lease = leases_.at(lease_id);
  leases_.erase(lease_id);
  Dataset& ds = datasets_.at(lease.dataset);
  Epoch* ep = FindEpoch(ds, lease.epoch);
  PACER_CHECK(ep != nullptr) << "lease " << lease_id << " in a closed epoch";
  Domain& dom = ep->domains[lease.partition];

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
      if (lease.done_pos() > partner.done_pos()) partner.done = lease.done_pos() - partner.begin;
      partner_lives = true;
    }
  }

  const uint64_t pos = lease.done_pos();
  if (requeue && !partner_lives && pos < lease.end) {
    uint32_t attempts = lease.done == 0 ? lease.attempts : 0;
    if (IsFailure(reason)) attempts++;
    uint64_t rest = pos;
    if (IsFailure(reason) && attempts >= ds.spec.max_attempts()) {
      // Poison: quarantine one batch at the failing position, report it, requeue the rest.
      const uint64_t q_end = std::min(lease.end, pos + std::max<uint64_t>(ds.spec.batch_size(), 1));
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
      if (ds.spec.on_poison() == POISON_FAIL && !ds.failed) {
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
  w.recent_ended.push_back(std::move(e));
  while (w.recent_ended.size() > kRecentEndedPerWorker) w.recent_ended.pop_front();
}

void ShardingState::CloseFinishedEpochs(Dataset& ds) {
  if (ds.is_stream()) return;
  for (auto it = ds.open.begin(); it != ds.open.end();) {
    bool finished = it->active_leases == 0;
    uint64_t accounted = 0;
    for (const auto& d : it->domains) {
      finished = finished && !d.HasPending();
      accounted += d.done + d.quarantined;
    }
    if (!finished) {
      ++it;
      continue;
    }
    PACER_CHECK(accounted == ds.records_per_epoch)
        << "dataset " << ds.spec.name() << " epoch " << it->epoch << ": " << accounted
        << " records done or quarantined, expected " << ds.records_per_epoch;
    ds.completed_epochs++;
    it = ds.open.erase(it);
  }
}

absl::Status ShardingState::ApplyWorkerLost(const WorkerLostUpdate& u, int64_t t) {
  auto it = workers_.find(u.worker_id());
  if (it == workers_.end()) return absl::NotFoundError("unknown worker '" + u.worker_id() + "'");
  const std::vector<uint64_t> held(it->second.leases.begin(), it->second.leases.end());
  for (uint64_t id : held) EndLease(id, LEASE_WORKER_LOST, "worker lost", t, /*requeue=*/true);
  it->second.lost = true;
  return absl::OkStatus();
}

Checkpoint ShardingState::CapturePosition(const std::string& tag, int64_t t) const {
  Checkpoint cp;
  cp.set_tag(tag);
  cp.set_time_ms(t);
  for (const auto& [name, ds] : datasets_) {
    DatasetPosition* pos = cp.add_datasets();
    pos->set_dataset(name);
    pos->set_next_epoch(ds.next_epoch);
    pos->set_completed_epochs(ds.completed_epochs);
    for (const Epoch& ep : ds.open) {
      // Pending = requeued ranges + frontier + the undone suffix of every lease (once per pair).
      std::vector<std::vector<PendingRange>> pending(ep.domains.size());
      for (size_t d = 0; d < ep.domains.size(); ++d) {
        for (const Pending& p : ep.domains[d].requeue) {
          PendingRange r;
          r.set_begin(p.begin);
          r.set_end(p.end);
          pending[d].push_back(r);
        }
      }
      for (const auto& [id, l] : leases_) {
        if (l.dataset != name || l.epoch != ep.epoch) continue;
        if (l.backup && l.partner != 0) continue;  // its primary accounts for the pair
        uint64_t from = l.done_pos();
        if (l.partner != 0) from = std::max(from, leases_.at(l.partner).done_pos());
        if (from >= l.end) continue;
        PendingRange r;
        r.set_begin(from);
        r.set_end(l.end);
        pending[l.partition].push_back(r);
      }
      EpochPosition* e = pos->add_epochs();
      e->set_epoch(ep.epoch);
      for (size_t d = 0; d < ep.domains.size(); ++d) {
        const Domain& dom = ep.domains[d];
        DomainState* out = e->add_domains();
        out->set_start(dom.start);
        out->set_frontier(dom.frontier);
        out->set_limit(dom.limit);
        out->set_done(dom.done);
        out->set_quarantined(dom.quarantined);
        std::sort(pending[d].begin(), pending[d].end(),
                  [](const PendingRange& a, const PendingRange& b) { return a.begin() < b.begin(); });
        for (auto& r : pending[d]) *out->add_requeue() = std::move(r);
      }
    }
  }
  return cp;
}

absl::Status ShardingState::ValidateCheckpointTag(const std::string& tag) {
  if (!ValidName(tag, kMaxNameLength)) {
    return absl::InvalidArgumentError("tag: must be 1..128 characters of [A-Za-z0-9._:/-]");
  }
  return absl::OkStatus();
}

absl::Status ShardingState::ApplySaveCheckpoint(const SaveCheckpointUpdate& u, int64_t t) {
  if (auto s = ValidateCheckpointTag(u.tag()); !s.ok()) return s;
  checkpoints_[u.tag()] = CapturePosition(u.tag(), t);
  while (checkpoints_.size() > kMaxCheckpoints) {
    auto oldest = checkpoints_.begin();
    for (auto it = checkpoints_.begin(); it != checkpoints_.end(); ++it) {
      if (it->second.time_ms() < oldest->second.time_ms()) oldest = it;
    }
    checkpoints_.erase(oldest);
  }
  return absl::OkStatus();
}

absl::Status ShardingState::ApplyRestoreCheckpoint(const RestoreCheckpointUpdate& u, int64_t t) {
  auto cit = checkpoints_.find(u.tag());
  if (cit == checkpoints_.end()) return absl::NotFoundError("unknown checkpoint '" + u.tag() + "'");
  const Checkpoint cp = cit->second;
  // Fence every lease: the data position goes back to the checkpoint's.
  for (auto& [id, lease] : leases_) {
    RememberEnded(lease, LEASE_CANCELLED);
    cancelled_.emplace_back(lease.worker, id);
  }
  leases_.clear();
  for (auto& [name, ds] : datasets_) {
    const DatasetPosition* pos = nullptr;
    for (const auto& p : cp.datasets()) {
      if (p.dataset() == name) pos = &p;
    }
    ds.open.clear();
    if (pos == nullptr) {  // registered after the checkpoint: everything is delivered again
      ds.next_epoch = 0;
      ds.completed_epochs = 0;
      if (ds.is_stream()) {
        ds.open.push_back(MakeEpoch(ds, 0));
        ds.next_epoch = 1;
      }
      continue;
    }
    ds.next_epoch = pos->next_epoch();
    ds.completed_epochs = pos->completed_epochs();
    for (const auto& e : pos->epochs()) {
      Epoch ep;
      ep.epoch = e.epoch();
      for (const auto& d : e.domains()) {
        ep.domains.push_back(DomainFromProto(d, /*keep_attempts=*/false));
      }
      ds.open.push_back(std::move(ep));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardingState::ValidateAllocation(const SetAllocationUpdate& u) {
  if (!(u.weight() >= 0.0 && u.weight() <= 1000.0)) {  // also rejects NaN
    return absl::InvalidArgumentError("allocation.weight: must be in [0, 1000]");
  }
  if (u.shard_size() > kMaxShardSize) {
    return absl::InvalidArgumentError("allocation.shard_size: at most 2^32");
  }
  if (u.max_leases() > 1024) {
    return absl::InvalidArgumentError("allocation.max_leases: at most 1024");
  }
  return absl::OkStatus();
}

absl::Status ShardingState::ApplySetAllocation(const SetAllocationUpdate& u) {
  auto it = workers_.find(u.worker_id());
  if (it == workers_.end()) return absl::NotFoundError("unknown worker '" + u.worker_id() + "'");
  if (absl::Status s = ValidateAllocation(u); !s.ok()) return s;
  WorkerRec& w = it->second;
  w.weight = u.weight() > 0 ? u.weight() : 1.0;
  w.shard_size = u.shard_size();
  w.max_leases = u.max_leases();
  return absl::OkStatus();
}

std::vector<std::pair<std::string, uint64_t>> ShardingState::TakeCancelledLeases() {
  std::vector<std::pair<std::string, uint64_t>> out;
  out.swap(cancelled_);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Reads.

const ShardingState::Dataset* ShardingState::FindDataset(const std::string& name) const {
  auto it = datasets_.find(name);
  return it == datasets_.end() ? nullptr : &it->second;
}

const ShardingState::LeaseRec* ShardingState::FindLease(uint64_t id) const {
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

const ShardingState::WorkerRec* ShardingState::FindWorker(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const EndedLease* ShardingState::FindEnded(const std::string& worker, uint64_t lease_id) const {
  const WorkerRec* w = FindWorker(worker);
  if (w == nullptr) return nullptr;
  for (const auto& e : w->recent_ended) {
    if (e.lease_id() == lease_id) return &e;
  }
  return nullptr;
}

Lease ShardingState::DescribeLease(const LeaseRec& l) const {
  const Dataset& ds = datasets_.at(l.dataset);
  Lease out;
  out.set_lease_id(l.id);
  out.set_fencing_token(l.token);
  out.set_dataset(l.dataset);
  out.set_epoch(l.epoch);
  out.set_partition(l.partition);
  out.set_begin(l.begin);
  out.set_end(l.end);
  out.set_records_done(l.done);
  out.set_backup(l.backup);
  out.set_worker_id(l.worker);
  out.set_shard_id(absl::StrCat(l.dataset, "/e", l.epoch, "/p", l.partition, "/", l.begin, "-",
                                l.end));
  auto records = MapPositionsToRecords(ds.spec, l.epoch, l.begin, l.end);
  if (ds.spec.source_case() == DatasetSpec::kFiles) {
    for (auto& seg : RecordsToFileSegments(ds.spec, records)) *out.add_segments() = std::move(seg);
  }
  for (auto& r : records) *out.add_records() = std::move(r);
  return out;
}

DatasetInfo ShardingState::DescribeDataset(const Dataset& ds) const {
  DatasetInfo info;
  *info.mutable_spec() = ds.spec;
  info.set_current_epoch(ds.open.empty() ? ds.next_epoch : ds.open.front().epoch);
  info.set_completed_epochs(ds.completed_epochs);
  info.set_records_per_epoch(ds.records_per_epoch);
  uint64_t active = 0, pending = 0;
  if (!ds.open.empty()) {
    uint64_t done = 0;
    for (const auto& d : ds.open.front().domains) done += d.done;
    info.set_records_done_current_epoch(done);
  }
  for (const auto& ep : ds.open) {
    active += ep.active_leases;
    for (const auto& d : ep.domains) pending += d.requeue.size() + (d.frontier < d.limit ? 1 : 0);
  }
  info.set_active_leases(active);
  info.set_pending_ranges(pending);
  info.set_records_done_total(ds.records_done_total);
  info.set_requeues_total(ds.requeues_total);
  for (const auto& q : ds.quarantined) *info.add_quarantined() = q;
  info.set_failed(ds.failed);
  info.set_failure(ds.failure);
  info.set_finished(ds.Finished());
  info.set_tail_backup(ds.tail_backup);
  return info;
}

}  // namespace pacer
