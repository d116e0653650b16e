#include "worker_sdk/shard_reader.h"

#include <algorithm>
#include <chrono>

#include "common/cond_wait.h"
#include "common/log.h"

namespace pacer {

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Create(Client* client,
                                                                 ShardReaderOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("ShardReader: client is null");
  if (options.dataset.empty()) return absl::InvalidArgumentError("ShardReader: dataset is empty");
  if (options.prefetch_leases < 1 || options.prefetch_leases > 3) {
    return absl::InvalidArgumentError("ShardReader: prefetch_leases must be 1..3");
  }
  std::unique_ptr<ShardReader> r(new ShardReader(client, std::move(options)));
  client->AddListener(r.get());
  r->prefetch_ = std::thread([p = r.get()] { p->PrefetchLoop(); });
  return r;
}

ShardReader::ShardReader(Client* client, ShardReaderOptions options)
    : client_(client), options_(std::move(options)) {}

ShardReader::~ShardReader() {
  client_->RemoveListener(this);  // from now on a next lease nobody reads is forgotten
  {
    absl::MutexLock l(&q_mu_);
    stopping_ = true;
  }
  q_cv_.SignalAll();
  if (prefetch_.joinable()) prefetch_.join();
  // Leases this reader will never finish: pacerd releases them at their done prefix.
  for (const Lease& lease : ready_) client_->sharding().ForgetLease(lease.lease_id());
  for (const OpenLease& o : open_) client_->sharding().ForgetLease(o.lease.lease_id());
}

void ShardReader::OnLeaseCancelled(uint64_t lease_id) {
  absl::MutexLock l(&cancel_mu_);
  cancelled_.insert(lease_id);
  cancel_generation_.fetch_add(1, std::memory_order_release);
}

size_t ShardReader::Held() const {
  return ready_.size() + (fetching_ ? 1 : 0) + static_cast<size_t>(next_pending_) + open_count_;
}

bool ShardReader::LeasingOn() const {
  return !stopping_ && !paused_ && !holding_off_ && !end_of_data_ && error_.ok();
}

bool ShardReader::WantLease() const {
  return LeasingOn() && Held() < 1 + static_cast<size_t>(options_.prefetch_leases);
}

bool ShardReader::LeaseOnItsWay() const { return fetching_ || next_pending_ > 0; }

bool ShardReader::WantFetch() const {
  // Starving with nothing on its way: the open leases are read to their end and wait for a
  // MarkConsumed that may come only after the next batch.
  return WantLease() ||
         (LeasingOn() && starving_ && ready_.empty() && !fetching_ && next_pending_ == 0);
}

void ShardReader::Accept(const FetchShardResponse& resp) {
  switch (resp.outcome()) {
    case FetchShardResponse::LEASED:
      if (paused_ || stopping_) {
        // Granted around a restore (which cancels it on the service) or while stopping: not
        // read, so not held.
        client_->sharding().ForgetLease(resp.lease().lease_id());
      } else {
        ready_.push_back(resp.lease());
      }
      service_waiting_ = false;
      break;
    case FetchShardResponse::WAIT:
      // The service asked us to come back later: no fetch before then (interruptible).
      service_waiting_ = true;
      ++wait_answers_;
      not_before_ = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(std::clamp<int64_t>(resp.retry_after_ms(), 10, 1'000));
      break;
    case FetchShardResponse::END_OF_DATA:
      end_of_data_ = true;
      records_quarantined_ = resp.records_quarantined();
      if (resp.records_quarantined() > 0) {
        PACER_LOG(WARNING) << "dataset '" << options_.dataset << "' ended with a hole: "
                           << resp.reason();
      }
      break;
    default:
      error_ = absl::InternalError("fetch: unknown outcome");
  }
}

void ShardReader::OnNextLease(uint64_t completed_lease_id,
                              const absl::StatusOr<FetchShardResponse>& next) {
  {
    absl::MutexLock l(&q_mu_);
    if (next_pending_ > 0) --next_pending_;
    if (next.ok()) {
      Accept(*next);
    } else if (next.status().code() == absl::StatusCode::kUnimplemented) {
      no_combined_ = true;  // an older pacerd: fetch on our own from now on
    }
    // Any other error leased nothing: the prefetch thread fetches alone (and meets a permanent
    // error itself).
  }
  q_cv_.SignalAll();
}

uint64_t ShardReader::records_quarantined() const {
  absl::MutexLock l(&q_mu_);
  return records_quarantined_;
}

void ShardReader::SyncOpenCount() {
  {
    absl::MutexLock l(&q_mu_);
    open_count_ = open_.size();
  }
  q_cv_.SignalAll();
}

void ShardReader::PrefetchLoop() {
  for (;;) {
    {
      absl::MutexLock l(&q_mu_);
      for (;;) {
        if (stopping_) return;
        if (!WantFetch()) {
          q_cv_.Wait(&q_mu_);
          continue;
        }
        if (std::chrono::steady_clock::now() >= not_before_) break;
        q_cv_.WaitWithTimeout(&q_mu_, TimeUntil(not_before_));
      }
      fetching_ = true;
    }
    auto resp = client_->sharding().Fetch(options_.dataset);
    absl::MutexLock l(&q_mu_);
    fetching_ = false;
    q_cv_.SignalAll();  // ReleaseAll may wait for this fetch
    if (!resp.ok()) {
      if (resp.status().code() == absl::StatusCode::kUnavailable ||
          resp.status().code() == absl::StatusCode::kDeadlineExceeded) {
        PACER_LOG(WARNING) << "fetch: " << resp.status().message() << "; will retry";
        not_before_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        continue;
      }
      error_ = resp.status();
      return;
    }
    Accept(*resp);
  }
}

bool ShardReader::TakeReady() {
  Lease lease;
  {
    absl::MutexLock l(&q_mu_);
    if (ready_.empty()) return false;
    lease = std::move(ready_.front());
    ready_.pop_front();
    ++open_count_;  // in the same step: the prefetcher sees the lease held all along
    starving_ = false;
  }
  OpenLease o;
  o.total = lease.end() - lease.begin();
  o.handed = o.reported = o.first_handed = std::min(lease.records_done(), o.total);
  o.first_position = records_read_;  // read to its end before the next lease: positions are contiguous
  // Skip the done prefix (a lease handed out again after a restore keeps its prefix).
  uint64_t skip = o.handed;
  while (o.range < static_cast<size_t>(lease.records_size())) {
    const uint64_t len = lease.records(o.range).end() - lease.records(o.range).begin();
    if (skip < len) {
      o.offset = skip;
      break;
    }
    skip -= len;
    ++o.range;
  }
  o.lease = std::move(lease);
  ++leases_read_;
  if (options_.on_lease) options_.on_lease(o.lease);
  open_.push_back(std::move(o));
  return true;
}

void ShardReader::DropCancelled() {
  const uint64_t gen = cancel_generation_.load(std::memory_order_acquire);
  if (gen == seen_cancel_generation_) return;
  seen_cancel_generation_ = gen;
  std::set<uint64_t> cancelled;
  {
    absl::MutexLock l(&cancel_mu_);
    cancelled = cancelled_;
  }
  open_.erase(std::remove_if(open_.begin(), open_.end(),
                             [&](const OpenLease& o) { return cancelled.count(o.lease.lease_id()); }),
              open_.end());
  {
    absl::MutexLock l(&q_mu_);
    ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                                [&](const Lease& x) { return cancelled.count(x.lease_id()); }),
                 ready_.end());
    open_count_ = open_.size();
  }
  q_cv_.SignalAll();
}

absl::StatusOr<ShardReader::Outcome> ShardReader::Next(size_t n, std::vector<uint64_t>* ids,
                                                       Blocking blocking,
                                                       std::vector<uint32_t>* epochs) {
  DropCancelled();
  size_t got = 0;
  while (got < n) {
    if (open_.empty() || open_.back().handed == open_.back().total) {
      if (TakeReady()) continue;
      absl::MutexLock l(&q_mu_);
      if (!starving_) {
        // More is wanted and every open lease is read to its end. Their completions (which
        // would lease the next shards) wait for MarkConsumed, which comes only after this
        // batch — also when the batch is partly filled (a local batch larger than a shard, as
        // batch plans make for fast workers): let the prefetcher lease without them.
        starving_ = true;
        q_cv_.SignalAll();
      }
      // A WAIT is an answer to an earlier request: while a fetch or a completion that leases
      // the next shard is on its way, kUntilPrefetched waits for that newer answer. A WAIT
      // often says this worker holds its whole lease quota (leases read to their end whose
      // completions went out after the last batch); returning on it would cut this batch short
      // and hand out the next ones empty until the WAIT's retry delay passed.
      //
      // kUntilData waits only while there is nothing to return: the next lease may be leased
      // only after the records already handed out are consumed and reported (end of an epoch),
      // so waiting with records in hand could wait forever. kUntilPrefetched stops waiting as
      // soon as the service says WAIT, so it may fill the batch from the next lease.
      //
      // kUntilData with nothing to return still must not wait on the reader itself: the leases in
      // open_ are read to their end but not consumed (a trainer reading ahead of MarkConsumed),
      // and the service may have nothing else to give until they complete — the rest of the data
      // is in them, or they fill the worker's lease quota. A WAIT answered after this call began
      // says so: return kWait and let the trainer mark them consumed.
      const bool holding_unconsumed = !open_.empty();
      const uint64_t waits_before = wait_answers_;
      if (blocking == Blocking::kUntilPrefetched || (blocking == Blocking::kUntilData && got == 0)) {
        CvWait(q_cv_, q_mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_) {
          const bool waited_on_self = blocking == Blocking::kUntilData && holding_unconsumed &&
                                      wait_answers_ != waits_before;
          return !ready_.empty() || end_of_data_ || !error_.ok() || stopping_ || holding_off_ ||
                 (blocking == Blocking::kUntilPrefetched && service_waiting_ && !LeaseOnItsWay()) ||
                 waited_on_self;
        });
        if (!ready_.empty()) continue;
      }
      if (!error_.ok()) return error_;
      if (end_of_data_ && ready_.empty()) return got > 0 ? Outcome::kRecords : Outcome::kEndOfData;
      if (stopping_) return absl::CancelledError("reader stopped");
      return got > 0 ? Outcome::kRecords : Outcome::kWait;
    }
    OpenLease& o = open_.back();
    while (got < n && o.handed < o.total) {
      const Range& r = o.lease.records(static_cast<int>(o.range));
      const uint64_t take = std::min<uint64_t>(n - got, (r.end() - r.begin()) - o.offset);
      for (uint64_t i = 0; i < take; ++i) ids->push_back(r.begin() + o.offset + i);
      if (epochs != nullptr) epochs->insert(epochs->end(), take, o.lease.epoch());
      got += take;
      records_read_ += take;
      o.handed += take;
      o.offset += take;
      if (o.offset == r.end() - r.begin()) {
        ++o.range;
        o.offset = 0;
      }
    }
  }
  return Outcome::kRecords;
}

void ShardReader::MarkConsumed() { MarkConsumedThrough(records_read_); }

void ShardReader::MarkConsumedThrough(uint64_t position) {
  DropCancelled();
  for (auto it = open_.begin(); it != open_.end();) {
    OpenLease& o = *it;
    if (position <= o.first_position) break;  // this lease and the later ones: not yet trained
    // The lease's records were handed out as positions first_position, first_position + 1, ...
    const uint64_t prefix = std::min(o.handed, o.first_handed + (position - o.first_position));
    if (prefix == o.total) {
      if (options_.on_report) options_.on_report(o.lease.lease_id(), o.total);
      bool lease_next;
      {
        absl::MutexLock l(&q_mu_);
        --open_count_;
        lease_next = !no_combined_ && WantLease();
        if (lease_next) ++next_pending_;  // counted before the prefetcher can look
      }
      if (lease_next) {
        client_->EnqueueCompletionAndFetch(o.lease, options_.dataset, this);
      } else {
        client_->EnqueueCompletion(o.lease);
      }
      it = open_.erase(it);
      continue;
    }
    if (prefix > o.reported) {
      if (options_.on_report) options_.on_report(o.lease.lease_id(), prefix);
      client_->EnqueueProgress(o.lease, prefix);
      o.reported = prefix;
    }
    ++it;
  }
}

absl::Status ShardReader::SaveCheckpoint(const std::string& tag, int64_t flush_timeout_ms) {
  MarkConsumed();
  if (absl::Status s = client_->Flush(flush_timeout_ms); !s.ok()) return s;
  return client_->sharding().SaveCheckpoint(tag);
}

uint64_t ShardReader::records_held() const {
  uint64_t n = 0;
  for (const OpenLease& o : open_) {
    if (!o.cancelled) n += o.total - std::min(o.handed, o.total);
  }
  absl::MutexLock l(&q_mu_);
  for (const Lease& lease : ready_) {
    const uint64_t total = lease.end() - lease.begin();
    n += total - std::min<uint64_t>(lease.records_done(), total);
  }
  return n;
}

absl::StatusOr<int> ShardReader::ReleaseAll(int64_t timeout_ms, uint64_t trained_through) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  {
    // No new lease from now on; a fetch in flight lands in ready_ and is released below.
    absl::MutexLock l(&q_mu_);
    holding_off_ = true;
    if (!CvWaitUntil(q_cv_, q_mu_, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_) { return !fetching_ || stopping_; })) {
      return absl::DeadlineExceededError("release: a lease fetch is still in flight");
    }
  }
  // Counted first: a release must not race the queued reports of its own lease (the service
  // would take the release's prefix, and the later report would find the lease ended). Holding
  // off, these completions lease nothing; the Flush also waits for earlier ones that do, whose
  // next leases land in ready_ before it returns.
  MarkConsumedThrough(std::min(trained_through, records_read_));
  const int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now()).count();
  if (absl::Status s = client_->Flush(std::max<int64_t>(left_ms, 1)); !s.ok()) return s;
  {
    absl::MutexLock l(&q_mu_);
    if (!CvWaitUntil(q_cv_, q_mu_, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_) { return next_pending_ == 0 || stopping_; })) {
      return absl::DeadlineExceededError("release: a completion leasing the next shard is in flight");
    }
    for (Lease& lease : ready_) {
      OpenLease o;
      o.total = lease.end() - lease.begin();
      o.handed = o.reported = std::min(lease.records_done(), o.total);
      o.lease = std::move(lease);
      if (options_.on_lease) options_.on_lease(o.lease);  // the ledger lists every lease held
      open_.push_back(std::move(o));
    }
    ready_.clear();
    open_count_ = open_.size();
  }
  DropCancelled();
  int released = 0;
  while (!open_.empty()) {
    const OpenLease& o = open_.front();
    absl::Status s = client_->sharding().Release(o.lease, o.reported, /*failed=*/false,
                                                 "worker excluded from the job's steps");
    // NOT_FOUND / FAILED_PRECONDITION: the lease had already ended (expired, fenced); it is not
    // this worker's any more either way.
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound &&
        s.code() != absl::StatusCode::kFailedPrecondition) {
      SyncOpenCount();
      return s;
    }
    open_.pop_front();
    ++released;
  }
  SyncOpenCount();
  return released;
}

void ShardReader::Resume() {
  {
    absl::MutexLock l(&q_mu_);
    holding_off_ = false;
  }
  q_cv_.SignalAll();
}

void ShardReader::RetryNow() {
  {
    absl::MutexLock l(&q_mu_);
    if (!service_waiting_) return;
    service_waiting_ = false;
    not_before_ = std::chrono::steady_clock::now();
  }
  q_cv_.SignalAll();
}

bool ShardReader::holding_off() const {
  absl::MutexLock l(&q_mu_);
  return holding_off_;
}

absl::Status ShardReader::RestoreCheckpoint(const std::string& tag) {
  {
    absl::MutexLock l(&q_mu_);
    paused_ = true;
  }
  absl::Status s = client_->sharding().RestoreCheckpoint(tag);
  // The restore cancelled every lease on the service (and if it failed, dropping them here
  // without listing them as held lets pacerd release them).
  for (const OpenLease& o : open_) client_->sharding().ForgetLease(o.lease.lease_id());
  open_.clear();
  {
    absl::MutexLock l(&q_mu_);
    for (const Lease& lease : ready_) client_->sharding().ForgetLease(lease.lease_id());
    ready_.clear();
    open_count_ = 0;
    starving_ = false;
    end_of_data_ = false;
    service_waiting_ = false;
    not_before_ = {};
    paused_ = false;
  }
  q_cv_.SignalAll();
  return s;
}

}  // namespace pacer
