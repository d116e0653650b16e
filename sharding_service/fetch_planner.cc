// ShardingState: fetch planning — what a FetchShard gets (PlanFetch) and the v3 update that
// records the decision (DecideLease). Pure reads of the state; nothing here mutates it.
#include "sharding_service/sharding_state.h"
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pacer {

namespace {

constexpr uint64_t kStreamLimit = std::numeric_limits<uint64_t>::max();

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > kStreamLimit - b ? kStreamLimit : a + b;
}

}  // namespace

uint64_t ShardingState::ShardSizeFor(const WorkerRec& w, const Dataset& ds) const {
  uint64_t size = w.shard_size;
  if (size == 0) {
    const double scaled = std::round(static_cast<double>(ds.spec->shard_size()) * w.weight);
    size = scaled < 1.0 ? 1 : static_cast<uint64_t>(std::min(scaled, double(kMaxShardSize)));
  }
  if (ds.spec->shuffle() == SHUFFLE_RECORDS) size = std::min(size, kMaxRecordsShuffleShardSize);
  return std::max<uint64_t>(size, 1);
}

uint64_t ShardingState::EvenEndSize(const WorkerRec& w, const Dataset& ds, uint32_t epoch,
                                    uint64_t unleased, uint64_t size,
                                    const FetchRates* rates) const {
  // Never below one batch: a worker fills a step from the leases it holds, at most its lease
  // quota of them, and cannot complete one before the step is trained; leases smaller than a
  // batch cut its steps short (many small steps, each a full update on a few records). One
  // batch is the dataset's batch_size, or the worker's planned local batch when a plan names a
  // smaller one. Without a declared batch size (1 after the spec's defaults) nothing is known
  // to be safe: no shrinking.
  const uint64_t batch = ds.spec->batch_size();
  if (batch <= 1 || batch >= size) return size;
  const std::string& name = ds.spec->name();
  // Records of this epoch a lease holds unconsumed (its reported done prefix trained); a tail
  // backup's records are its primary's.
  auto left = [&](const LeaseRec& l) -> uint64_t {
    if (l.dataset != name || l.epoch != epoch || l.backup) return 0;
    return l.unconsumed();
  };
  uint64_t held = 0;  // what `w` holds already (the lease it reads, the ones it leased ahead)
  for (uint64_t id : w.leases) held = SaturatingAdd(held, left(leases_.at(id)));
  const double own_rate = rates != nullptr ? rates->Of(w.id) : 0.0;
  // Only the last rounds of leases can shrink: skip counting the consumers while `w`'s share
  // of the unleased records alone covers a whole lease (beyond what it holds, by the plan) --
  // by weight its share is taken as at least one over the registered count, by the plan at
  // least its rate over every planned worker's (the smaller of the two bounds when `w` has a
  // rate: whether the plan names every consumer is known only below).
  double least_share = 1.0 / static_cast<double>(workers_.size());
  if (own_rate > 0) least_share = std::min(least_share, own_rate / rates->total());
  const uint64_t whole = own_rate > 0 ? SaturatingAdd(size, held) : size;
  if (static_cast<double>(unleased) * least_share >= static_cast<double>(whole)) return size;
  // The dataset's consumers: the fetcher, and the live workers that hold a lease of it or whose
  // newest ended lease was of it (a job's other workers may read other datasets). The records
  // left: the unleased ones and what the consumers hold unconsumed -- every lease of the epoch
  // is a consumer's (a lost worker holds none), so that is the epoch's count of what its leases
  // hold. Both are kept as the state changes, not gathered here: this runs at every fetch of an
  // epoch's last rounds, and a visit of every worker and lease was most of a fetch's cost at
  // thousands of workers.
  const ConsumerSums sums = ConsumerSumsFor(w, name, rates);
  const double live = sums.weight, live_rate = sums.rate;
  const int consumers = sums.consumers;
  const bool all_rated = own_rate > 0 && sums.all_rated;
  uint64_t remaining = unleased;
  for (const Epoch& ep : ds.open) {
    if (ep.epoch == epoch) remaining = SaturatingAdd(remaining, ep.unconsumed_held);
  }
  // By the batch plan when it names every consumer (ranks of a synchronous job consume their
  // local batches a step), else by weight.
  const double share = all_rated ? own_rate / live_rate : (live > 0 ? w.weight / live : 0.0);
  if (!(share > 0)) return size;
  const uint64_t floor =
      all_rated ? std::clamp<uint64_t>(static_cast<uint64_t>(std::ceil(own_rate)), 1, batch) : batch;
  if (!all_rated) {
    // By weight the share is of the unleased records alone (as before plans were known here:
    // equal workers hold about equal leases, and a worker's progress is reported only every
    // heartbeat, so what others hold is overstated between reports).
    remaining = unleased;
    held = 0;
  }
  double target = std::ceil(static_cast<double>(remaining) * share) - static_cast<double>(held);
  // By the plan, half of what `w` lacks for its share (factoring): the progress the others'
  // leases show arrives with their heartbeats, several steps late and in no common phase, so a
  // share taken whole may be off by those steps; the next fetches, smaller, correct it.
  if (all_rated) target = std::ceil(target / 2);
  if (!(target > static_cast<double>(floor))) return floor;
  // A whole shard lasts a rank planned above the mean batch fewer steps: its share may take up
  // to that many more records in one lease (else it runs dry while the rest is leased to the
  // others), within what a lease may hold.
  uint64_t cap = size;
  if (all_rated && own_rate * consumers > live_rate) {
    const double limit = ds.spec->shuffle() == SHUFFLE_RECORDS
                             ? static_cast<double>(kMaxRecordsShuffleShardSize)
                             : static_cast<double>(kMaxShardSize);
    cap = static_cast<uint64_t>(std::min(
        limit, std::ceil(static_cast<double>(size) * own_rate * consumers / live_rate)));
  }
  return target >= static_cast<double>(cap) ? cap : static_cast<uint64_t>(target);
}

bool ShardingState::Consumes(const WorkerRec& o, const std::string& dataset) const {
  if (o.lost) return false;
  if (!o.ended.empty() && o.ended.rbegin()->second.dataset() == dataset) return true;
  for (uint64_t lid : o.leases) {
    if (leases_.at(lid).dataset == dataset) return true;
  }
  return false;
}

ShardingState::ConsumerSums ShardingState::SumConsumers(const std::string& dataset,
                                                        const WorkerRec* extra,
                                                        const FetchRates* rates) const {
  ConsumerSums sums;
  sums.rates_stamp = rates != nullptr ? rates->stamp() : 0;
  // The rates are read in step with workers_ (both maps ordered by worker id) instead of
  // looked up one by one.
  const std::map<std::string, double>* by_id = rates != nullptr ? &rates->per_worker() : nullptr;
  auto rate_it = by_id != nullptr ? by_id->begin() : std::map<std::string, double>::const_iterator();
  for (const auto& [id, o] : workers_) {
    if (o.lost || !(&o == extra || Consumes(o, dataset))) continue;
    sums.weight += o.weight;
    ++sums.consumers;
    double r = 0.0;
    for (; by_id != nullptr && rate_it != by_id->end(); ++rate_it) {
      const int order = rate_it->first.compare(id);
      if (order == 0) r = rate_it->second;
      if (order >= 0) break;
    }
    sums.rate += r;
    sums.all_rated = sums.all_rated && r > 0;
  }
  return sums;
}

ShardingState::ConsumerSums ShardingState::ConsumerSumsFor(const WorkerRec& w,
                                                           const std::string& dataset,
                                                           const FetchRates* rates) const {
  // A fetcher that reads nothing of the dataset yet counts among its consumers in its place in
  // worker order: summed for this fetch alone (its first leases of the dataset; rare near an
  // epoch's end).
  if (!w.lost && !Consumes(w, dataset)) return SumConsumers(dataset, &w, rates);
  const uint64_t stamp = rates != nullptr ? rates->stamp() : 0;
  auto it = consumer_sums_.find(dataset);
  if (it == consumer_sums_.end()) {
    it = consumer_sums_.emplace(dataset, SumConsumers(dataset, nullptr, rates)).first;
  } else if (it->second.rates_stamp != stamp) {
    it->second = SumConsumers(dataset, nullptr, rates);
  }
  return it->second;
}

// Records of `ep` not leased yet: its partitions' fresh positions and requeued ranges.
static uint64_t Unleased(const std::vector<ShardingState::Partition>& partitions) {
  uint64_t n = 0;
  for (const auto& p : partitions) {
    n = SaturatingAdd(n, p.limit - std::min(p.frontier, p.limit));
    for (const auto& q : p.requeue) n = SaturatingAdd(n, q.end - q.begin);
  }
  return n;
}

absl::StatusOr<FetchPlan> ShardingState::PlanFetch(const std::string& worker,
                                                   const std::string& dataset,
                                                   bool v2_planner,
                                                   const FetchRates* rates) const {
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
  // Near an epoch's end a lease is at most the worker's share of the records the epoch has not
  // leased yet (guided self-scheduling): the live workers run out within about one small lease
  // of each other, instead of one holding a whole shard while the others wait -- or, in a
  // synchronous job, train weight-0 repeats until it is done. A stream has no end to even out.
  const uint64_t full = ShardSizeFor(*w, *ds);
  const bool even = !ds->is_stream() && !v2_planner;
  for (size_t i = 0; i < ds->open.size(); ++i) {
    const Epoch& ep = ds->open[i];
    const uint64_t size =
        even ? EvenEndSize(*w, *ds, ep.epoch, Unleased(ep.partitions), full, rates) : full;
    for (uint32_t d = 0; d < ep.partitions.size(); ++d) {
      const Partition& dom = ep.partitions[d];
      if (dom.requeue.empty()) continue;
      const Pending& front = dom.requeue.front();
      plan.kind = FetchPlan::kLease;
      plan.epoch_index = i;
      plan.partition = d;
      plan.from_requeue = true;
      plan.begin = front.begin;
      plan.end = std::min(front.end, SaturatingAdd(front.begin, size));
      plan.attempts = front.attempts;
      return plan;
    }
    // Fresh positions: the partition that has handed out the fewest (balances stream partitions).
    int best = -1;
    for (uint32_t d = 0; d < ep.partitions.size(); ++d) {
      const Partition& dom = ep.partitions[d];
      if (dom.frontier >= dom.limit) continue;
      if (best < 0 || dom.frontier - dom.start < ep.partitions[best].frontier - ep.partitions[best].start) {
        best = static_cast<int>(d);
      }
    }
    if (best >= 0) {
      const Partition& dom = ep.partitions[best];
      plan.kind = FetchPlan::kLease;
      plan.epoch_index = i;
      plan.partition = static_cast<uint32_t>(best);
      plan.begin = dom.frontier;
      plan.end = std::min(dom.limit, SaturatingAdd(dom.frontier, size));
      return plan;
    }
  }
  const bool epochs_left = !ds->is_stream() &&
                           (ds->spec->num_epochs() == 0 || ds->next_epoch < ds->spec->num_epochs());
  if (epochs_left) {
    const bool may_open = ds->spec->epoch_barrier() ? ds->open.empty()
                                                   : ds->open.size() < kMaxOpenEpochs;
    if (may_open) {
      plan.kind = FetchPlan::kLease;
      plan.epoch_index = ds->open.size();
      plan.partition = 0;
      plan.begin = 0;
      plan.end = std::min(ds->records_per_epoch,
                          even ? EvenEndSize(*w, *ds, ds->next_epoch, ds->records_per_epoch,
                                             full, rates)
                               : full);
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
  if (ds->spec->epoch_barrier() && epochs_left) {
    plan.reason = "epoch barrier: waiting for the current epoch to finish";
  } else if (epochs_left) {
    plan.reason = "two epochs are open: waiting for the older one to finish";
  } else {
    plan.reason = "every pending record is leased; waiting for leases to finish or fail";
  }
  return plan;
}


CreateLeaseUpdate ShardingState::DecideLease(const FetchPlan& plan, const std::string& worker,
                                             const std::string& dataset,
                                             uint64_t request_id) const {
  const Dataset& ds = datasets_.at(dataset);
  CreateLeaseUpdate u;
  u.set_worker_id(worker);
  u.set_dataset(dataset);
  u.set_decided(true);
  u.set_lease_id(next_lease_id_);
  u.set_fencing_token(next_token_);
  u.set_begin(plan.begin);
  u.set_end(plan.end);
  u.set_request_id(request_id);
  u.set_incarnation(workers_.at(worker).incarnation);
  if (plan.kind == FetchPlan::kBackup) {
    const LeaseRec& primary = leases_.at(plan.backup_of);
    u.set_backup_of(primary.id);
    u.set_epoch(primary.epoch);
    u.set_partition(primary.partition);
    return u;
  }
  const bool opens = plan.epoch_index == ds.open.size();
  u.set_opens_epoch(opens);
  u.set_epoch(opens ? ds.next_epoch : ds.open[plan.epoch_index].epoch);
  u.set_partition(plan.partition);
  u.set_from_requeue(plan.from_requeue);
  u.set_attempts(plan.attempts);
  return u;
}

const ShardingState::LeaseRec* ShardingState::FindLeaseByRequest(const std::string& worker,
                                                                 uint64_t request_id) const {
  const WorkerRec* w = FindWorker(worker);
  if (w == nullptr || request_id == 0) return nullptr;
  for (uint64_t id : w->leases) {
    const LeaseRec& l = leases_.at(id);
    if (l.request_id == request_id && l.incarnation == w->incarnation) return &l;
  }
  return nullptr;
}

absl::Status ShardingState::CheckDecidedLease(const CreateLeaseUpdate& u) const {
  auto bad = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("create_lease of lease ", u.lease_id(), " does not fit the state: ", why));
  };
  const Dataset* ds = FindDataset(u.dataset());
  if (ds == nullptr) return absl::NotFoundError("unknown dataset '" + u.dataset() + "'");
  const WorkerRec* w = FindWorker(u.worker_id());
  if (w == nullptr) return absl::NotFoundError("unknown worker '" + u.worker_id() + "'");
  if (u.lease_id() != next_lease_id_ || u.fencing_token() != next_token_) {
    return bad(absl::StrCat("expected lease id ", next_lease_id_, " and token ", next_token_));
  }
  if (u.begin() >= u.end()) return bad("empty range");
  if (u.backup_of() != 0) {
    const LeaseRec* primary = FindLease(u.backup_of());
    if (primary == nullptr || primary->dataset != u.dataset() || primary->partner != 0 ||
        primary->backup || primary->epoch != u.epoch() || primary->partition != u.partition() ||
        u.begin() < primary->done_pos() || u.end() != primary->end) {
      return bad("the backed-up lease does not match");
    }
    return absl::OkStatus();
  }
  const Partition* part = nullptr;
  if (u.opens_epoch()) {
    if (ds->is_stream() || u.epoch() != ds->next_epoch ||
        (ds->spec->num_epochs() != 0 && u.epoch() >= ds->spec->num_epochs())) {
      return bad("it opens an epoch that cannot open");
    }
    if (u.partition() != 0 || u.begin() != 0 || u.end() > ds->records_per_epoch ||
        u.from_requeue()) {
      return bad("its range is outside the new epoch");
    }
    return absl::OkStatus();
  }
  for (const Epoch& ep : ds->open) {
    if (ep.epoch == u.epoch() && u.partition() < ep.partitions.size()) {
      part = &ep.partitions[u.partition()];
    }
  }
  if (part == nullptr) return bad("its epoch or partition is not open");
  if (u.from_requeue()) {
    if (part->requeue.empty() || part->requeue.front().begin != u.begin() ||
        u.end() > part->requeue.front().end) {
      return bad("its range is not the front of the requeue");
    }
  } else if (part->frontier != u.begin() || u.end() > part->limit) {
    return bad("its range does not start at the frontier");
  }
  return absl::OkStatus();
}

}  // namespace pacer
