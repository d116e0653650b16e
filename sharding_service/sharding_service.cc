#include "sharding_service/sharding_service.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/reply_limit.h"
#include "common/status.h"
#include "common/step_number.h"

namespace pacer {
namespace {

constexpr size_t kMaxDetail = 1024;
constexpr size_t kMaxCancelledPerWorker = 256;
constexpr int kMaxProgressPerHeartbeat = 1024;
constexpr int kMaxHeldLeasesPerHeartbeat = 4096;
constexpr int64_t kWaitRetryMs = 200;
constexpr size_t kMaxLoggedUpdate = 512;  // characters of an update quoted in a log line

std::string Truncated(std::string s, size_t max) {
  if (s.size() > max) s = s.substr(0, max) + "... (" + std::to_string(s.size()) + " chars)";
  return s;
}


}  // namespace

ShardingServiceImpl::ShardingServiceImpl(const ShardingServiceOptions& options, const Clock* clock,
                                         MetricsRegistry* metrics)
    : options_(options),
      clock_(clock),
      own_metrics_(metrics ? nullptr : std::make_unique<MetricsRegistry>()),
      metrics_(metrics ? metrics : own_metrics_.get()) {}

ShardingServiceImpl::~ShardingServiceImpl() {
  if (journal_) (void)journal_->Flush();
}

absl::StatusOr<std::unique_ptr<ShardingServiceImpl>> ShardingServiceImpl::Open(
    const ShardingServiceOptions& options, const Clock* clock, MetricsRegistry* metrics) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir is required");
  if (options.lease_timeout_ms <= 0 || options.worker_timeout_ms < options.lease_timeout_ms) {
    return absl::InvalidArgumentError(
        "lease_timeout_ms must be > 0 and worker_timeout_ms >= lease_timeout_ms");
  }
  // absl::Mutex's deadlock detector (on by default in this absl build) costs a graph lookup per
  // lock; the service takes one lock per request and never nests it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::unique_ptr<ShardingServiceImpl> svc(new ShardingServiceImpl(options, clock, metrics));
  Stopwatch watch(RealClock::Get());
  StateReplay replay;
  JournalOptions jo = options.journal;
  jo.dir = options.data_dir;
  jo.sync = options.sync;
  auto journal = ShardingJournal::Open(jo, replay.OnSnapshot(), replay.OnUpdate(), replay.OnPinned());
  if (!journal.ok()) return journal.status();
  svc->journal_ = std::move(*journal);
  absl::MutexLock l(&svc->mu_);
  svc->state_ = std::move(replay.state);
  svc->last_snapshot_seq_ = svc->state_.last_seq() - replay.replayed;
  svc->stats_.recovery_seconds = watch.ElapsedSeconds();
  svc->stats_.recovered_updates = replay.replayed;
  svc->metrics_.recovery_seconds.Get().Set(svc->stats_.recovery_seconds);
  const int64_t now = clock->NowMs();
  for (const auto& [id, w] : svc->state_.workers()) svc->last_seen_ms_[id] = now;  // grace
  for (const auto& [name, ds] : svc->state_.datasets()) {
    svc->counted_done_[name] = ds.records_done_total;
    svc->counted_requeues_[name] = ds.requeues_total;
  }
  svc->UpdateGauges();
  if (svc->state_.last_seq() > 0) {
    PACER_LOG(INFO) << "sharding: recovered " << svc->state_.datasets().size() << " datasets, "
                    << svc->state_.leases().size() << " leases at seq " << svc->state_.last_seq()
                    << " (" << replay.replayed << " updates replayed) in "
                    << svc->stats_.recovery_seconds << " s";
  }
  return svc;
}

ShardingJournal::SnapshotFn ShardingServiceImpl::StateReplay::OnSnapshot() {
  return [this](const ShardingSnapshot& snap) -> absl::Status {
    ASSIGN_OR_RETURN(state, ShardingState::FromSnapshot(snap, specs));
    return absl::OkStatus();
  };
}

ShardingJournal::UpdateFn ShardingServiceImpl::StateReplay::OnUpdate() {
  return [this](const Update& u) {
    ++replayed;
    return state.ApplyChecked(u);
  };
}

ShardingJournal::PinnedFn ShardingServiceImpl::StateReplay::OnPinned() {
  return [this](const std::string& key, const std::string& bytes) {
    return ShardingState::AddPinnedSpec(key, bytes, &specs);
  };
}

absl::Status ShardingServiceImpl::Ready() const {
  return Annotate(journal_->health(), "sharding service unavailable");
}

absl::StatusOr<uint64_t> ShardingServiceImpl::Commit(Update update) {
  const ShardingState::LeaseRec* ending =
      update.has_end_lease() && update.end_lease().reason() == LEASE_COMPLETED
          ? state_.FindLease(update.end_lease().lease_id())
          : nullptr;
  const int64_t ending_created_ms = ending ? ending->created_ms : 0;
  absl::StatusOr<ApplyEffects> effects = state_.Commit(&update, clock_->NowMs());
  if (!effects.ok()) {
    // The request's checks let through an update the state refuses: a bug, not bad input.
    // Nothing changed (the state validates before it applies), so report it and carry on.
    PACER_LOG(ERROR) << "update rejected after validation: " << effects.status() << " ("
                     << Truncated(update.ShortDebugString(), kMaxLoggedUpdate) << ")";
    return absl::InternalError(absl::StrCat("internal error: ", effects.status().message()));
  }
  if (ending) shard_times_.Add(static_cast<double>(update.time_ms() - ending_created_ms) / 1000.0);
  pending_.push_back(update);  // appended when the request lets go of mu_ (AppendPending)
  stats_.updates++;
  metrics_.updates.Get().Increment();
  Notify(effects->cancelled_leases);
  // A delete forces a snapshot: the journal writes a spec's pinned entry once per key and
  // deletes it when no snapshot lists it, so the name's old spec must leave the disk before a
  // re-registration with a new spec is pinned under the same key.
  if (update.seq() - last_snapshot_seq_ >= options_.snapshot_every ||
      update.has_delete_dataset()) {
    AppendPending();  // the snapshot follows the updates it holds
    // Specs apart: the snapshot holds the dynamic state and names each spec; the specs are
    // shared, never copied, and the journal writes each once (a pinned entry). Serializing
    // happens on the journal's writer, not under mu_.
    ShardingState::JournalSnapshot snap = state_.ToJournalSnapshot();
    std::vector<PinnedEntry> pinned;
    pinned.reserve(snap.specs.size());
    for (auto& [key, spec] : snap.specs) pinned.push_back(PinnedEntry{key, std::move(spec)});
    journal_->WriteSnapshot(std::move(snap.snapshot), std::move(pinned));
    last_snapshot_seq_ = update.seq();
  }
  return update.seq();
}

void ShardingServiceImpl::AppendPending() {
  if (pending_.empty()) return;
  journal_->AppendAll(pending_);
  pending_.clear();
}

ShardingServiceImpl::Applied ShardingServiceImpl::Run(const std::function<Applied()>& body) {
  absl::MutexLock l(&mu_);
  Applied seq = body();
  // Every update the request made goes to the journal together (one group commit), also
  // when a later step of the request failed: what was applied must be written.
  AppendPending();
  return seq;
}

void ShardingServiceImpl::Serve(Done done, const std::function<Applied()>& body) {
  AnswerWhenDurable(Run(body), std::move(done));
}

void ShardingServiceImpl::AnswerWhenDurable(Applied seq, Done done) {
  if (!seq.ok()) {
    if (seq.status().code() == absl::StatusCode::kFailedPrecondition) metrics_.rejected.Get().Increment();
    done(seq.status());
    return;
  }
  journal_->WhenDurable(*seq, std::move(done));
}

void ShardingServiceImpl::Touch(const std::string& worker) {
  last_seen_ms_[worker] = clock_->NowMs();
}

void ShardingServiceImpl::Notify(const std::vector<std::pair<std::string, uint64_t>>& cancelled) {
  for (const auto& [worker, lease] : cancelled) {
    auto& v = cancelled_[worker];
    if (v.size() < kMaxCancelledPerWorker) v.push_back(lease);
  }
}

void ShardingServiceImpl::UpdateGauges() {
  const int64_t now = clock_->NowMs();
  struct PerDataset {
    double leases = 0, oldest_s = 0, stalest_s = 0;
  };
  std::map<std::string, PerDataset> per;
  for (const auto& [name, ds] : state_.datasets()) per[name];
  for (const auto& [id, lease] : state_.leases()) {
    PerDataset& p = per[lease.dataset];
    p.leases += 1;
    p.oldest_s = std::max(p.oldest_s, std::max<int64_t>(0, now - lease.created_ms) / 1000.0);
    const int64_t since = std::max(lease.created_ms, lease.progress_ms);
    p.stalest_s = std::max(p.stalest_s, std::max<int64_t>(0, now - since) / 1000.0);
  }
  for (const auto& [name, p] : per) {
    metrics_.leases_active.With({name}).Set(p.leases);
    metrics_.oldest_lease_age.With({name}).Set(p.oldest_s);
    metrics_.oldest_progress_age.With({name}).Set(p.stalest_s);
  }
  for (auto& [name, counted] : counted_done_) {
    if (state_.datasets().count(name) > 0) continue;
    // Deleted: its gauges read 0 (its counters keep what they counted).
    for (auto* g : {&metrics_.leases_active, &metrics_.oldest_lease_age,
                    &metrics_.oldest_progress_age, &metrics_.epoch, &metrics_.epoch_progress,
                    &metrics_.finished, &metrics_.quarantined_ranges, &metrics_.quarantined_records}) {
      g->With({name}).Set(0);
    }
    counted = 0;
    counted_requeues_[name] = 0;
  }
  for (const auto& [name, ds] : state_.datasets()) {
    metrics_.quarantined_ranges.With({name}).Set(static_cast<double>(ds.quarantined.size()));
    metrics_.quarantined_records.With({name}).Set(static_cast<double>(ds.records_quarantined_total));
    const bool finished = ds.Finished();
    metrics_.finished.With({name}).Set(finished ? 1 : 0);
    metrics_.epoch.With({name}).Set(ds.completed_epochs);
    if (!ds.is_stream() && ds.records_per_epoch > 0) {
      const DatasetInfo info = state_.DescribeDataset(ds, /*include_files=*/false);
      metrics_.epoch.With({name}).Set(info.completed_epochs());
      metrics_.epoch_progress.With({name}).Set(
          finished ? 1.0
                   : static_cast<double>(info.records_done_current_epoch()) / ds.records_per_epoch);
    }
    // A checkpoint restore or a reset moves records done back; the counter (monotonic) then
    // counts records done again from the restored position on.
    uint64_t& done = counted_done_[name];
    prometheus::Counter& records_done = metrics_.records_done.With({name});  // exported from 0
    if (ds.records_done_total > done) {
      records_done.Increment(static_cast<double>(ds.records_done_total - done));
    }
    done = ds.records_done_total;
    uint64_t& requeues = counted_requeues_[name];
    prometheus::Counter& requeued = metrics_.requeues.With({name});
    if (ds.requeues_total > requeues) requeued.Increment(static_cast<double>(ds.requeues_total - requeues));
    metrics_.leases_granted.With({name});
    metrics_.backups_granted.With({name});
    requeues = ds.requeues_total;
  }
  double active = 0, silent = 0, lost = 0;
  for (const auto& [id, w] : state_.workers()) {
    auto seen = last_seen_ms_.find(id);
    const int64_t quiet = seen == last_seen_ms_.end() ? 0 : now - seen->second;
    if (w.lost) {
      lost += 1;
    } else if (quiet > options_.lease_timeout_ms) {
      silent += 1;
    } else {
      active += 1;
    }
  }
  metrics_.workers.With({"active"}).Set(active);
  metrics_.workers.With({"silent"}).Set(silent);
  metrics_.workers.With({"lost"}).Set(lost);
}

// ---------------------------------------------------------------------------------------------

void ShardingServiceImpl::RegisterDataset(const RegisterDatasetRequest& req,
                                          RegisterDatasetResponse* resp, Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    ASSIGN_OR_RETURN(DatasetSpec spec, ShardingState::NormalizeSpec(req.spec()));
    if (const auto* existing = state_.FindDataset(spec.name())) {
      if (existing->spec->SerializeAsString() != spec.SerializeAsString()) {
        return SpecMismatchError(*existing->spec, spec);
      }
      resp->set_created(false);
      return state_.last_seq();
    }
    if (state_.datasets().size() >= std::min(options_.max_datasets, kMaxDatasets)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("at most ", std::min(options_.max_datasets, kMaxDatasets), " datasets per job"));
    }
    uint64_t files = spec.files().files_size();
    const uint64_t held = ShardingState::HeldBytes(spec);
    uint64_t held_total = held;
    for (const auto& [name, ds] : state_.datasets()) {
      files += ds.spec->files().files_size();
      held_total += ds.held_bytes;
    }
    if (files > std::min(options_.max_files_total, kMaxFilesTotal)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "at most ", std::min(options_.max_files_total, kMaxFilesTotal),
          " files over every dataset of a job (--max-files)"));
    }
    const uint64_t max_bytes = options_.max_dataset_bytes;
    if (held_total > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "dataset '", spec.name(), "' would hold ", held, " bytes of pacerd's memory (its spec and ",
          "partitions), ", held_total, " with every dataset registered: over the limit of ", max_bytes,
          " bytes (--max-dataset-bytes); delete a dataset or raise the limit"));
    }
    Update u;
    *u.mutable_register_dataset()->mutable_spec() = req.spec();
    resp->set_created(true);
    return Commit(std::move(u));
  });
}

void ShardingServiceImpl::RegisterWorker(const RegisterWorkerRequest& req,
                                         RegisterWorkerResponse* resp, Done done) {
  AnswerWhenDurable(ApplyRegisterWorker(req, resp), std::move(done));
}

ShardingServiceImpl::Applied ShardingServiceImpl::ApplyRegisterWorker(const RegisterWorkerRequest& req,
                                                                      RegisterWorkerResponse* resp) {
  return Run([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    if (!IsValidName(req.worker_id(), kMaxWorkerIdLength)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker_id: must be 1..", kMaxWorkerIdLength, " characters of [A-Za-z0-9._:/-] (got ",
          req.worker_id().size(), " characters)"));
    }
    if (req.node().size() > kMaxWorkerIdLength) {
      return absl::InvalidArgumentError(
          absl::StrCat("node: at most ", kMaxWorkerIdLength, " characters"));
    }
    const auto* before = state_.FindWorker(req.worker_id());
    if (before == nullptr && state_.workers().size() >= std::min(options_.max_workers, kMaxWorkers)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("at most ", std::min(options_.max_workers, kMaxWorkers), " workers per job"));
    }
    const uint64_t previous = before ? before->incarnation : 0;
    Update u;
    u.mutable_register_worker()->set_worker_id(req.worker_id());
    u.mutable_register_worker()->set_node(req.node());
    ASSIGN_OR_RETURN(uint64_t s, Commit(std::move(u)));
    const auto* w = state_.FindWorker(req.worker_id());
    resp->set_incarnation(w->incarnation);
    resp->set_previous_incarnation(previous);
    if (previous != 0) {
      // Every remembered lease of the earlier incarnations (the new one has none yet): the
      // incarnation just replaced may never have resolved what the one before it left open.
      for (const auto& [id, e] : w->ended) *resp->add_previous_leases() = e;
    }
    resp->set_lease_timeout_ms(options_.lease_timeout_ms);
    resp->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
    cancelled_.erase(req.worker_id());  // the new process never held those leases
    Touch(req.worker_id());
    return s;
  });
}

absl::StatusOr<uint64_t> ShardingServiceImpl::DoFetch(const std::string& worker,
                                                      uint64_t incarnation,
                                                      const std::string& dataset,
                                                      uint64_t request_id,
                                                      FetchShardResponse* resp) {
  RETURN_IF_ERROR(state_.CheckWorker(worker, incarnation));
  Touch(worker);
  auto leased = [&](const ShardingState::LeaseRec& lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    resp->set_outcome(FetchShardResponse::LEASED);
    *resp->mutable_lease() = state_.DescribeLease(lease);
    resp->mutable_lease()->set_request_id(request_id);
    resp->mutable_lease()->set_deadline_unix_ms(clock_->NowMs() + options_.lease_timeout_ms);
  };
  if (const auto* again = state_.FindLeaseByRequest(worker, request_id)) {
    // A retry whose first reply was lost (or arrived after the client's deadline): the lease
    // that request already got. Waiting for last_seq covers the first attempt's commit.
    if (again->dataset != dataset) {
      return absl::InvalidArgumentError(absl::StrCat("request_id ", request_id,
                                                     " was already used for dataset '",
                                                     again->dataset, "'"));
    }
    leased(*again);
    return state_.last_seq();
  }
  const std::shared_ptr<const FetchRates> rates = fetch_rates_ ? fetch_rates_() : nullptr;
  ASSIGN_OR_RETURN(FetchDecision decision,
                   state_.DecideFetch(worker, dataset, request_id, rates.get()));
  if (decision.kind == FetchPlan::kWait) {
    resp->set_outcome(FetchShardResponse::WAIT);
    resp->set_retry_after_ms(kWaitRetryMs);
    resp->set_reason(decision.reason);
    return state_.last_seq();
  }
  if (decision.kind == FetchPlan::kEndOfData) {
    resp->set_outcome(FetchShardResponse::END_OF_DATA);
    const auto* ds = state_.FindDataset(dataset);
    resp->set_records_quarantined(ds->records_quarantined_total);
    if (ds->records_quarantined_total > 0) {
      resp->set_reason(absl::StrCat(ds->records_quarantined_total,
                                    " records were quarantined as poison and never trained on"));
    }
    return state_.last_seq();
  }
  if (state_.leases().size() >= kMaxLiveLeases) {
    // Each worker holds at most max_leases a dataset, but the job token acts for every worker.
    return absl::ResourceExhaustedError(absl::StrCat(
        "at most ", kMaxLiveLeases, " leases may be held at once over the job; complete or release some"));
  }
  ASSIGN_OR_RETURN(uint64_t s, Commit(std::move(*decision.update)));
  const auto* lease = state_.FindLease(state_.last_lease_id());
  leased(*lease);
  metrics_.leases_granted.With({lease->dataset}).Increment();
  if (lease->backup) metrics_.backups_granted.With({lease->dataset}).Increment();
  return s;
}

uint64_t ShardingServiceImpl::FetchNext(uint64_t reported_seq, const std::string& worker,
                                        uint64_t incarnation, const std::string& dataset,
                                        uint64_t request_id, FetchShardResponse* next) {
  absl::StatusOr<uint64_t> s = DoFetch(worker, incarnation, dataset, request_id, next);
  if (s.ok()) return std::max(reported_seq, *s);
  // The report was counted: say so (the call succeeds) and answer the lease part with WAIT and
  // the reason, so that a client fetching on its own meets the error itself — a failed call
  // would read as "not counted".
  next->Clear();
  next->set_outcome(FetchShardResponse::WAIT);
  next->set_retry_after_ms(0);
  next->set_reason("no next lease: " + s.status().ToString());
  return reported_seq;
}

void ShardingServiceImpl::SetFetchRatesSource(FetchRatesSource source) {
  absl::MutexLock l(&mu_);
  fetch_rates_ = std::move(source);
}

void ShardingServiceImpl::FetchShard(const FetchShardRequest& req, FetchShardResponse* resp,
                                     Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    return DoFetch(req.worker_id(), req.incarnation(), req.dataset(), req.request_id(), resp);
  });
}

absl::StatusOr<uint64_t> ShardingServiceImpl::AnswerEnded(const std::string& worker,
                                                          uint64_t lease_id,
                                                          uint64_t records_done,
                                                          bool completing,
                                                          const absl::Status& why) {
  // A retry (or a late report) after the lease ended: success exactly when the records it
  // claims were counted for this lease, FAILED_PRECONDITION saying how far it got otherwise.
  if (why.code() != absl::StatusCode::kFailedPrecondition) return why;
  const EndedLease* ended = state_.FindEnded(worker, lease_id);
  if (ended == nullptr) {
    if (state_.FindLease(lease_id) != nullptr) return why;  // held by another worker/token
    return absl::FailedPreconditionError(state_.ExplainUnknownLease(worker, lease_id));
  }
  const uint64_t len = ended->end() - ended->begin();
  const bool counted = completing ? (ended->reason() == LEASE_COMPLETED || ended->records_done() >= len)
                                  : ended->records_done() >= records_done;
  if (counted) return state_.last_seq();
  return absl::FailedPreconditionError(absl::StrCat(
      "lease ", lease_id, " has ended (", LeaseEndReasonName(ended->reason()), ") with ",
      ended->records_done(), " of its ", len, " records done; records past that were not counted"));
}

absl::StatusOr<uint64_t> ShardingServiceImpl::DoProgress(const ProgressRequest& req,
                                                         ProgressResponse* resp) {
  if (absl::Status s = state_.CheckLease(req.worker_id(), req.incarnation(), req.lease_id(),
                                         req.fencing_token());
      !s.ok()) {
    ASSIGN_OR_RETURN(uint64_t seq, AnswerEnded(req.worker_id(), req.lease_id(), req.records_done(),
                                               /*completing=*/false, s));
    if (resp) resp->set_records_done(state_.FindEnded(req.worker_id(), req.lease_id())->records_done());
    return seq;
  }
  Touch(req.worker_id());
  const auto* lease = state_.FindLease(req.lease_id());
  const uint64_t len = lease->end - lease->begin;
  if (req.records_done() > len) {
    return absl::InvalidArgumentError(absl::StrCat("records_done ", req.records_done(),
                                                   " exceeds the lease's ", len, " records"));
  }
  if (req.records_done() <= lease->done) {  // a retry, or behind a backup partner: no change
    if (resp) resp->set_records_done(lease->done);
    return state_.last_seq();
  }
  Update u;
  u.mutable_progress()->set_lease_id(req.lease_id());
  u.mutable_progress()->set_records_done(req.records_done());
  ASSIGN_OR_RETURN(uint64_t s, Commit(std::move(u)));
  if (resp) resp->set_records_done(state_.FindLease(req.lease_id())->done);
  return s;
}

void ShardingServiceImpl::ReportProgress(const ProgressRequest& req, ProgressResponse* resp,
                                         Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    ASSIGN_OR_RETURN(uint64_t s, DoProgress(req, resp));
    if (req.next_dataset().empty()) return s;
    // The next lease in the same durable commit: its seq is later, so waiting for it covers both.
    return FetchNext(s, req.worker_id(), req.incarnation(), req.next_dataset(),
                     req.next_request_id(), resp->mutable_next());
  });
}

void ShardingServiceImpl::CompleteShard(const CompleteShardRequest& req,
                                        CompleteShardResponse* resp, Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    absl::StatusOr<uint64_t> completed;
    if (absl::Status s = state_.CheckLease(req.worker_id(), req.incarnation(), req.lease_id(),
                                           req.fencing_token());
        !s.ok()) {
      // A retried completion whose first attempt went through is a success.
      completed = AnswerEnded(req.worker_id(), req.lease_id(), 0, /*completing=*/true, s);
    } else {
      Touch(req.worker_id());
      const auto* lease = state_.FindLease(req.lease_id());
      Update u;
      u.mutable_end_lease()->set_lease_id(req.lease_id());
      u.mutable_end_lease()->set_reason(LEASE_COMPLETED);
      u.mutable_end_lease()->set_records_done(lease->end - lease->begin);
      completed = Commit(std::move(u));
    }
    if (!completed.ok() || req.next_dataset().empty()) return completed;
    // One durable call per shard: the next lease is committed right after the completion, in
    // the same group commit, and the reply waits for the later of the two.
    return FetchNext(*completed, req.worker_id(), req.incarnation(), req.next_dataset(),
                     req.next_request_id(), resp->mutable_next());
  });
}

void ShardingServiceImpl::ReleaseShard(const ReleaseShardRequest& req, ReleaseShardResponse* resp,
                                       Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    if (absl::Status s = state_.CheckLease(req.worker_id(), req.incarnation(), req.lease_id(),
                                           req.fencing_token());
        !s.ok()) {
      // A retried release: already ended; success when the records it reports were counted.
      return AnswerEnded(req.worker_id(), req.lease_id(), req.records_done(),
                         /*completing=*/false, s);
    }
    Touch(req.worker_id());
    const auto* lease = state_.FindLease(req.lease_id());
    if (req.records_done() > lease->end - lease->begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "records_done ", req.records_done(), " exceeds the lease's ",
          lease->end - lease->begin, " records"));
    }
    if (req.detail().size() > kMaxDetail) {
      return absl::InvalidArgumentError("detail: at most 1024 characters");
    }
    Update u;
    auto* e = u.mutable_end_lease();
    e->set_lease_id(req.lease_id());
    e->set_reason(req.failed() ? LEASE_FAILED : LEASE_RELEASED);
    e->set_records_done(std::max(req.records_done(), lease->done));
    e->set_detail(req.detail());
    ASSIGN_OR_RETURN(uint64_t s, Commit(std::move(u)));
    return s;
  });
}

absl::StatusOr<uint64_t> ShardingServiceImpl::ReleaseUnknownLeases(const HeartbeatRequest& req,
                                                                   HeartbeatResponse* resp) {
  // Lost fetch replies (the protocol, once):
  //  1. The worker gives every FetchShard call a request id, the same on each retry.
  //  2. Its heartbeat lists the leases it holds and the highest request id whose call ended.
  //  3. A lease of this incarnation created by such an ended request and not listed was never
  //     received: it is released at its done prefix (not a failure), so its records go back to
  //     the queue instead of waiting for an expiry that the worker's own calls keep renewing.
  // A request still in flight has an id above last_fetch_request_id, so its lease is safe.
  uint64_t last = state_.last_seq();
  if (!req.reports_held_leases()) return last;
  if (req.held_leases_size() > kMaxHeldLeasesPerHeartbeat) {
    return absl::InvalidArgumentError(
        absl::StrCat("held_leases: at most ", kMaxHeldLeasesPerHeartbeat, " per heartbeat"));
  }
  const std::set<uint64_t> held(req.held_leases().begin(), req.held_leases().end());
  std::vector<uint64_t> unknown;
  for (uint64_t id : state_.FindWorker(req.worker_id())->leases) {
    const auto* l = state_.FindLease(id);
    if (l->request_id != 0 && l->request_id <= req.last_fetch_request_id() &&
        l->incarnation == req.incarnation() && held.count(id) == 0) {
      unknown.push_back(id);
    }
  }
  for (uint64_t id : unknown) {
    Update u;
    auto* e = u.mutable_end_lease();
    e->set_lease_id(id);
    e->set_reason(LEASE_RELEASED);
    e->set_records_done(state_.FindLease(id)->done);
    e->set_detail("the worker never received this lease (its fetch reply was lost)");
    ASSIGN_OR_RETURN(last, Commit(std::move(u)));
    resp->add_released_unknown_leases(id);
    metrics_.unknown_released.Get().Increment();
  }
  if (!unknown.empty()) {
    PACER_LOG(INFO) << "worker '" << req.worker_id() << "': released " << unknown.size()
                    << " leases whose fetch reply never reached it";
  }
  return last;
}

void ShardingServiceImpl::Heartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp,
                                    Done done) {
  AnswerWhenDurable(ApplyHeartbeat(req, resp), std::move(done));
}

ShardingServiceImpl::Applied ShardingServiceImpl::ApplyHeartbeat(const HeartbeatRequest& req,
                                                                 HeartbeatResponse* resp) {
  return Run([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    RETURN_IF_ERROR(state_.CheckWorker(req.worker_id(), req.incarnation()));
    RETURN_IF_ERROR(CheckStepNumber(req.step(), req.worker_id(), "heartbeat"));
    if (req.progress_size() > kMaxProgressPerHeartbeat) {
      return absl::InvalidArgumentError("progress: at most 1024 reports per heartbeat");
    }
    Touch(req.worker_id());
    uint64_t last = state_.last_seq();
    for (const auto& p : req.progress()) {
      if (p.worker_id() != req.worker_id() || p.incarnation() != req.incarnation()) {
        return absl::InvalidArgumentError("progress: every report must name this worker");
      }
      if (!p.next_dataset().empty()) {
        return absl::InvalidArgumentError(
            "progress: next_dataset is for ReportProgress, not for reports in a heartbeat");
      }
    }
    for (const auto& p : req.progress()) {
      auto s = DoProgress(p, nullptr);
      if (s.ok()) {
        last = *s;
      } else if (s.status().code() == absl::StatusCode::kFailedPrecondition) {
        // The lease ended (expired, fenced): tell the worker, keep the rest of the batch.
        resp->add_cancelled_leases(p.lease_id());
        metrics_.rejected.Get().Increment();
      } else {
        return s.status();
      }
    }
    ASSIGN_OR_RETURN(uint64_t released, ReleaseUnknownLeases(req, resp));
    last = std::max(last, released);
    if (auto it = cancelled_.find(req.worker_id()); it != cancelled_.end()) {
      for (uint64_t id : it->second) resp->add_cancelled_leases(id);
      cancelled_.erase(it);
    }
    resp->set_lease_deadline_unix_ms(clock_->NowMs() + options_.lease_timeout_ms);
    return last;
  });
}

void ShardingServiceImpl::SaveCheckpoint(const CheckpointRequest& req, CheckpointResponse* resp,
                                         Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    RETURN_IF_ERROR(ShardingState::ValidateCheckpointTag(req.tag()));
    Update u;
    u.mutable_save_checkpoint()->set_tag(req.tag());
    return Commit(std::move(u));
  });
}

void ShardingServiceImpl::RestoreCheckpoint(const CheckpointRequest& req, CheckpointResponse* resp,
                                            Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    if (!state_.HasCheckpoint(req.tag())) {
      return absl::NotFoundError("unknown checkpoint '" + req.tag() + "'");
    }
    Update u;
    u.mutable_restore_checkpoint()->set_tag(req.tag());
    ASSIGN_OR_RETURN(uint64_t s, Commit(std::move(u)));
    return s;
  });
}

void ShardingServiceImpl::ListDatasets(const ListDatasetsRequest& req, ListDatasetsResponse* resp,
                                       Done done) {
  absl::StatusOr<uint64_t> seq = uint64_t{0};
  {
    absl::MutexLock l(&mu_);
    // A listing with files is refused before it is built when the specs alone are over the
    // reply limit (common/reply_limit.h): 256 MiB of file lists must not be copied to be dropped.
    uint64_t specs = 0;
    for (const auto& [name, ds] : state_.datasets()) {
      if (req.name().empty() || name == req.name()) specs += req.include_files() ? ds.held_bytes : 0;
    }
    if (specs > kMaxReplyBytes) {
      seq = absl::ResourceExhaustedError(absl::StrCat(
          "list datasets: the file lists hold ", specs, " bytes, over pacerd's reply limit of ",
          kMaxReplyBytes, " bytes; list one dataset (name) or leave include_files off"));
    }
    for (const auto& [name, ds] : state_.datasets()) {
      if (!seq.ok()) break;
      if (!req.name().empty() && name != req.name()) continue;
      DatasetInfo* info = resp->add_datasets();
      // File lists can be large (2 M files are allowed): only on request, so that a listing
      // stays far below gRPC's message limit — and is not copied under the lock otherwise.
      *info = state_.DescribeDataset(ds, req.include_files());
    }
    if (seq.ok()) {
      resp->set_journal_seq(state_.last_seq());
      seq = state_.last_seq();
    }
  }
  AnswerWhenDurable(seq, std::move(done));
}

void ShardingServiceImpl::SetAllocation(const SetAllocationRequest& req,
                                        SetAllocationResponse* resp, Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    const auto& a = req.allocation();
    if (state_.FindWorker(a.worker_id()) == nullptr) {
      return absl::NotFoundError("unknown worker '" + a.worker_id() + "'");
    }
    RETURN_IF_ERROR(ShardingState::ValidateAllocation(a));
    Update u;
    *u.mutable_set_allocation() = a;
    return Commit(std::move(u));
  });
}

void ShardingServiceImpl::SetTailBackup(const SetTailBackupRequest& req,
                                        SetTailBackupResponse* resp, Done done) {
  Serve(std::move(done), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    if (state_.FindDataset(req.dataset()) == nullptr) {
      return absl::NotFoundError("unknown dataset '" + req.dataset() + "'");
    }
    Update u;
    u.mutable_set_tail_backup()->set_dataset(req.dataset());
    u.mutable_set_tail_backup()->set_enabled(req.enabled());
    return Commit(std::move(u));
  });
}

void ShardingServiceImpl::DeleteDataset(const DeleteDatasetRequest& req,
                                        DeleteDatasetResponse* resp, Done done) {
  AnswerWhenDurable(ApplyDeleteDataset(req, resp), std::move(done));
}

ShardingServiceImpl::Applied ShardingServiceImpl::ApplyDeleteDataset(const DeleteDatasetRequest& req,
                                                                     DeleteDatasetResponse* resp) {
  return Run([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    const auto* ds = state_.FindDataset(req.dataset());
    if (ds == nullptr) return absl::NotFoundError("unknown dataset '" + req.dataset() + "'");
    const uint64_t done_total = ds->records_done_total;
    const size_t before = state_.leases().size();
    Update u;
    u.mutable_delete_dataset()->set_dataset(req.dataset());
    ASSIGN_OR_RETURN(uint64_t s, Commit(std::move(u)));
    resp->set_leases_ended(before - state_.leases().size());
    resp->set_records_done_dropped(done_total);
    return s;
  });
}

void ShardingServiceImpl::ResetDataset(const ResetDatasetRequest& req, ResetDatasetResponse* resp,
                                       Done done) {
  AnswerWhenDurable(ApplyResetDataset(req, resp), std::move(done));
}

ShardingServiceImpl::Applied ShardingServiceImpl::ApplyResetDataset(const ResetDatasetRequest& req,
                                                                    ResetDatasetResponse* resp) {
  return Run([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Applied {
    RETURN_IF_ERROR(Ready());
    const auto* ds = state_.FindDataset(req.dataset());
    if (ds == nullptr) return absl::NotFoundError("unknown dataset '" + req.dataset() + "'");
    resp->set_records_done_dropped(ds->records_done_total);
    const size_t before = state_.leases().size();
    Update u;
    u.mutable_reset_dataset()->set_dataset(req.dataset());
    ASSIGN_OR_RETURN(uint64_t s, Commit(std::move(u)));
    resp->set_leases_ended(before - state_.leases().size());
    return s;
  });
}

int ShardingServiceImpl::ExpireOverdue() {
  absl::MutexLock l(&mu_);
  if (!Ready().ok()) return 0;
  const int64_t now = clock_->NowMs();
  int expired = 0;
  std::vector<std::string> workers;
  for (const auto& [id, w] : state_.workers()) workers.push_back(id);
  for (const std::string& id : workers) {
    const auto* w = state_.FindWorker(id);
    auto seen = last_seen_ms_.find(id);
    const int64_t silent = seen == last_seen_ms_.end() ? 0 : now - seen->second;
    if (silent > options_.lease_timeout_ms && !w->leases.empty()) {
      const std::vector<uint64_t> held(w->leases.begin(), w->leases.end());
      for (uint64_t lease : held) {
        Update u;
        u.mutable_end_lease()->set_lease_id(lease);
        u.mutable_end_lease()->set_reason(LEASE_EXPIRED);
        u.mutable_end_lease()->set_records_done(state_.FindLease(lease)->done);
        u.mutable_end_lease()->set_detail(absl::StrCat("worker silent for ", silent, " ms"));
        if (Commit(std::move(u)).ok()) {
          ++expired;
          metrics_.expired.Get().Increment();
        }
      }
    }
    w = state_.FindWorker(id);
    if (silent > options_.worker_timeout_ms && !w->lost) {
      Update u;
      u.mutable_worker_lost()->set_worker_id(id);
      (void)Commit(std::move(u));
      PACER_LOG(WARNING) << "worker '" << id << "' lost: silent for " << silent << " ms";
    }
  }
  AppendPending();
  if (expired > 0) PACER_LOG(INFO) << "expired " << expired << " leases";
  UpdateGauges();  // gauges are refreshed on this periodic tick, not on every request
  return expired;
}

std::optional<int> ShardingServiceImpl::LoseGoneWorker(const std::string& worker, const std::string& why) {
  absl::MutexLock l(&mu_);
  if (!Ready().ok()) return std::nullopt;  // the journal cannot take it now: again later
  const auto* w = state_.FindWorker(worker);
  if (w == nullptr || w->lost || w->leases.empty()) return 0;  // a finished worker is not lost
  auto seen = last_seen_ms_.find(worker);
  if (seen != last_seen_ms_.end() && clock_->NowMs() - seen->second < 2 * options_.heartbeat_interval_ms) {
    return std::nullopt;
  }
  const int held = static_cast<int>(w->leases.size());
  Update u;
  u.mutable_worker_lost()->set_worker_id(worker);
  if (!Commit(std::move(u)).ok()) return std::nullopt;
  AppendPending();
  PACER_LOG(WARNING) << "worker '" << worker << "' lost: " << why << "; " << held
                     << " lease(s) ended, their records back in the queue";
  return held;
}

absl::Status ShardingServiceImpl::Flush() { return journal_->Flush(); }

LeaseFacts ShardingServiceImpl::WorkerLeaseFacts() const {
  absl::MutexLock l(&mu_);
  LeaseFacts f;
  f.oldest_lease_age_s = OldestLeaseAges(state_, clock_->NowMs());
  f.typical_shard_time_s = shard_times_.Median();
  return f;
}

std::optional<WorkerDirectory::Registration> ShardingServiceImpl::Registration(
    const std::string& worker) const {
  absl::MutexLock l(&mu_);
  const ShardingState::WorkerRec* w = state_.FindWorker(worker);
  if (w == nullptr) return std::nullopt;
  return WorkerDirectory::Registration{w->incarnation, w->node};
}

ShardingServiceStats ShardingServiceImpl::stats() const {
  absl::MutexLock l(&mu_);
  ShardingServiceStats s = stats_;
  s.journal = journal_->stats();
  return s;
}

ShardingSnapshot ShardingServiceImpl::SnapshotForTest() const {
  absl::MutexLock l(&mu_);
  return state_.ToSnapshot();
}

// ---- Resuming after a failed journal write (a full disk): the one place that swaps the whole
// state ----

absl::Status ShardingServiceImpl::RecoverJournal() {
  absl::MutexLock l(&mu_);
  if (journal_->health().ok()) return absl::OkStatus();
  // Under mu_ nothing is appended, so the journal can drop its queue and reopen. What the
  // memory holds beyond the durable seq was applied but never acknowledged: rebuilt by replay,
  // exactly as at a restart.
  StateReplay replay;
  absl::Status s = journal_->Recover(replay.OnSnapshot(), replay.OnUpdate(), replay.OnPinned());
  if (!s.ok()) return s;
  ShardingState& state = replay.state;
  const uint64_t replayed = replay.replayed;
  const uint64_t dropped = state_.last_seq() - std::min(state_.last_seq(), state.last_seq());
  state_ = std::move(state);
  last_snapshot_seq_ = state_.last_seq() - replayed;
  cancelled_.clear();  // may name leases whose ending was never written
  pending_.clear();    // (empty: every request appends before it lets go of mu_)
  const int64_t now = clock_->NowMs();
  for (const auto& [id, w] : state_.workers()) last_seen_ms_[id] = now;  // a grace, as at a restart
  UpdateGauges();
  PACER_LOG(WARNING) << "sharding: journal recovered at seq " << state_.last_seq() << "; "
                     << dropped << " unacknowledged update(s) applied in memory were discarded";
  return absl::OkStatus();
}

}  // namespace pacer
