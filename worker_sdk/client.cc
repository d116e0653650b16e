#include "worker_sdk/client.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "common/channel_wait.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/status.h"

namespace pacer {
namespace {

constexpr int kMaxProgressPerHeartbeat = 1024;  // the service's limit
constexpr size_t kMaxQueuedSteps = 16'384;      // the monitor's per-request limit
constexpr size_t kMaxStepsPerRequest = 4'096;

bool Retryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

LocalBatch InitialBatch(const ClientOptions& o) {
  LocalBatch b;
  b.micro_batch = o.initial_micro_batch;
  b.accumulation_steps = o.initial_accumulation_steps;
  return b;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  RETURN_IF_ERROR(options.Resolve());
  ShardingClientOptions so;
  so.address = options.address;
  so.token = options.token;
  so.worker_id = options.worker_id;
  so.node = options.node;
  so.run_id = options.run_id;
  so.rpc_timeout_ms = options.rpc_timeout_ms;
  so.retry_budget_ms = options.connect_budget_ms;
  so.credentials = options.credentials;
  so.tls = options.tls;
  so.test_lose_lease_reply = options.test_lose_lease_reply;
  auto sharding = ShardingClient::Connect(so);
  if (!sharding.ok()) {
    return Annotate(sharding.status(), "worker '" + options.worker_id + "' registering with pacerd at " +
                                           options.address);
  }
  std::unique_ptr<Client> c(new Client(std::move(options), std::move(*sharding)));
  if (c->options_.report_steps) {
    absl::Status s = c->RegisterWithMonitor();
    if (s.code() == absl::StatusCode::kUnimplemented) {
      PACER_LOG(WARNING) << "pacerd has no monitor service; step reports are off";
      c->monitor_enabled_ = false;
    } else if (!s.ok()) {
      c->sharding_->Cancel();
      return Annotate(s, "registering with the monitor");
    }
  } else {
    c->monitor_enabled_ = false;
  }
  c->reporter_ = std::thread([p = c.get()] { p->ReporterLoop(); });
  return c;
}

Client::Client(ClientOptions options, std::unique_ptr<ShardingClient> sharding)
    : options_(std::move(options)), sharding_(std::move(sharding)), plan_(InitialBatch(options_)) {
  interval_ms_ = options_.heartbeat_interval_ms > 0
                     ? options_.heartbeat_interval_ms
                     : std::max<int64_t>(10, sharding_->registration().heartbeat_interval_ms());
  if (sharding_->registration().heartbeat_interval_ms() <= 0 && options_.heartbeat_interval_ms <= 0) {
    interval_ms_ = 1'000;
  }
  // Resolve() made the credentials (common/tls.h).
  grpc::ChannelArguments args;
  ApplyTlsChannelArgs(options_.tls, &args);
  monitor_channel_ = grpc::CreateCustomChannel(options_.address, options_.credentials, args);
  monitor_ = Monitor::NewStub(monitor_channel_);
}

Client::~Client() { Close(2'000); }

absl::Status Client::RegisterWithMonitor() {
  MonitorRegisterRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_node(options_.node);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(options_.connect_budget_ms);
  int64_t backoff_ms = 20;
  std::mt19937_64 jitter(std::random_device{}());
  for (;;) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, options_.token);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.rpc_timeout_ms));
    MonitorRegisterResponse resp;
    absl::Status s = FromGrpcStatus(monitor_->RegisterWorker(&ctx, req, &resp));
    if (s.ok() || !Retryable(s.code()) || sharding_->cancelled() ||
        std::chrono::steady_clock::now() >= deadline) {
      return s;
    }
    // Backoff between attempts (not synchronisation), keeping the channel connecting.
    PauseWatchingChannel(monitor_channel_.get(), std::chrono::milliseconds(
        std::uniform_int_distribution<int64_t>(backoff_ms / 2, backoff_ms)(jitter)));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 1'000);
  }
}

void Client::EnqueueProgress(const Lease& lease, uint64_t records_done) {
  absl::MutexLock l(&mu_);
  if (completions_.count(lease.lease_id())) return;
  auto [it, inserted] = progress_.try_emplace(lease.lease_id());
  ProgressRequest& r = it->second.request;
  if (inserted) {
    r.set_worker_id(options_.worker_id);
    r.set_incarnation(sharding_->incarnation());
    r.set_lease_id(lease.lease_id());
    r.set_fencing_token(lease.fencing_token());
  }
  r.set_records_done(std::max(r.records_done(), records_done));
}

void Client::EnqueueCompletion(const Lease& lease) {
  {
    absl::MutexLock l(&mu_);
    progress_.erase(lease.lease_id());
    completions_[lease.lease_id()].lease = lease;
    urgent_ = true;
  }
}

void Client::EnqueueCompletionAndFetch(const Lease& lease, const std::string& next_dataset,
                                       ReportListener* listener) {
  absl::Status refused;
  {
    absl::MutexLock l(&mu_);
    progress_.erase(lease.lease_id());
    PendingCompletion& c = completions_[lease.lease_id()];
    c.lease = lease;
    if (!health_.ok() || stopping_) {
      refused = absl::CancelledError("client stopped: nothing more is sent");
    } else if (c.next_for != nullptr) {
      refused = absl::FailedPreconditionError("this completion already leases a next shard");
    } else {
      c.next_dataset = next_dataset;
      c.next_for = listener;
    }
    urgent_ = true;
  }
  if (!refused.ok()) DeliverNext(listener, lease.lease_id(), refused);
}

void Client::EnqueueStep(const StepReport& report) {
  if (!monitor_enabled_.load(std::memory_order_relaxed)) return;
  absl::MutexLock l(&mu_);
  if (steps_.size() >= kMaxQueuedSteps) {
    steps_.erase(steps_.begin());  // the monitor was unreachable for long: oldest go first
    ++stats_.steps_dropped;
  }
  steps_.push_back(report);
  steps_.back().set_worker_id(options_.worker_id);
  newest_step_ = report;
  newest_step_sent_ = false;
}

void Client::NoteStepBegun(const Clock* clock, uint64_t step, int64_t begin_ns, uint64_t samples) {
  absl::MutexLock l(&mu_);
  running_.clock = clock;
  running_.running = true;
  running_.step = step;
  running_.begin_ns = begin_ns;
  running_.phase_ns = 0;
  running_.open_ns = 0;
  running_.samples = samples;
  running_.samples_done = 0;
  running_.done_compute_ns = 0;
}

void Client::NoteStepProgress(uint64_t samples_done, int64_t compute_ns) {
  absl::MutexLock l(&mu_);
  running_.samples_done = samples_done;
  running_.done_compute_ns = compute_ns;
}

void Client::NoteStepPhase(int64_t phase_ns, int64_t open_ns) {
  absl::MutexLock l(&mu_);
  running_.phase_ns = phase_ns;
  running_.open_ns = open_ns;
}

void Client::NoteStepEnded() {
  absl::MutexLock l(&mu_);
  running_.running = false;
}

void Client::NoteRegroupGeneration(uint64_t generation) {
  uint64_t held = regroup_generation_.load(std::memory_order_relaxed);
  while (held < generation &&
         !regroup_generation_.compare_exchange_weak(held, generation, std::memory_order_acq_rel)) {
  }
}

std::string Client::stop_reason() const {
  absl::MutexLock l(&mu_);
  return stop_reason_;
}

absl::Status Client::health() const {
  absl::MutexLock l(&mu_);
  return health_;
}

ClientStats Client::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void Client::AddListener(ReportListener* listener) {
  absl::MutexLock l(&listeners_mu_);
  listeners_.push_back(listener);
}

void Client::RemoveListener(ReportListener* listener) {
  absl::MutexLock l(&listeners_mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener), listeners_.end());
}

bool Client::Drained() const {
  return progress_.empty() && completions_.empty() && in_flight_ == 0;
}

absl::StatusOr<bool> Client::ReportStepPastLine(int64_t timeout_ms) {
  absl::MutexLock l(&mu_);
  if (!health_.ok()) return health_;
  if (!options_.honors_exclusion) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now - line_report_kept_in_ < std::chrono::milliseconds(interval_ms_)) return excluded();
  const uint64_t want = heartbeats_begun_ + 1;  // one whose request is built after this call
  ++stats_.step_line_reports;
  urgent_ = true;
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return heartbeats_ended_ >= want || stopping_ || !health_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Milliseconds(timeout_ms))) {
    return absl::DeadlineExceededError("step line: no heartbeat reply within " +
                                       std::to_string(timeout_ms) + " ms");
  }
  if (!health_.ok()) return health_;
  const bool out = excluded();
  if (!out) line_report_kept_in_ = std::chrono::steady_clock::now();
  return out;
}

absl::Status Client::Flush(int64_t timeout_ms) {
  auto over = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Drained() || !health_.ok() || stopping_; };
  absl::MutexLock l(&mu_);
  urgent_ = true;
  const bool done = mu_.AwaitWithTimeout(absl::Condition(&over), absl::Milliseconds(timeout_ms));
  if (!health_.ok()) return health_;
  if (!done || !Drained()) {
    return absl::DeadlineExceededError("flush: reports still unacknowledged after " +
                                       std::to_string(timeout_ms) + " ms (pacerd unreachable?)");
  }
  return absl::OkStatus();
}

void Client::Close(int64_t flush_timeout_ms) {
  std::call_once(closed_, [&] {
    if (reporter_.joinable() && health().ok()) {
      absl::Status s = Flush(flush_timeout_ms);
      if (!s.ok()) {
        PACER_LOG(WARNING) << "closing with unacknowledged reports: " << s.message();
      }
    }
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
    }
    sharding_->Cancel();
    if (reporter_.joinable()) reporter_.join();
    AbandonNextLeases(absl::CancelledError("client closed"));
  });
}

void Client::LatchPermanent(const absl::Status& s) {
  {
    absl::MutexLock l(&mu_);
    if (health_.ok()) {
      health_ = s;
      PACER_LOG(ERROR) << "worker '" << options_.worker_id << "': " << s.message();
    }
  }
  AbandonNextLeases(s);  // nothing more is sent: whoever waits for a next lease must not
}

void Client::DeliverNext(ReportListener* listener, uint64_t completed_lease_id,
                         const absl::StatusOr<FetchShardResponse>& next) {
  {
    absl::MutexLock l(&listeners_mu_);
    if (std::find(listeners_.begin(), listeners_.end(), listener) != listeners_.end()) {
      listener->OnNextLease(completed_lease_id, next);
      return;
    }
  }
  // The reader that asked is gone: nobody will read this lease. Not listing it as held any
  // more lets pacerd release it at its done prefix.
  if (next.ok() && next->outcome() == FetchShardResponse::LEASED) {
    sharding_->ForgetLease(next->lease().lease_id());
  }
}

void Client::AbandonNextLeases(const absl::Status& why) {
  std::vector<std::pair<ReportListener*, uint64_t>> waiting;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, c] : completions_) {
      if (c.next_for == nullptr) continue;
      waiting.emplace_back(c.next_for, id);
      c.next_for = nullptr;
      c.next_dataset.clear();
    }
  }
  for (const auto& [listener, id] : waiting) DeliverNext(listener, id, why);
}

void Client::Acknowledge(uint64_t lease_id, uint64_t records_done) {
  absl::MutexLock l(&listeners_mu_);
  for (ReportListener* r : listeners_) r->OnAcknowledged(lease_id, records_done);
}

void Client::Cancelled(uint64_t lease_id) {
  {
    absl::MutexLock l(&mu_);
    ++stats_.leases_cancelled;
  }
  absl::MutexLock l(&listeners_mu_);
  for (ReportListener* r : listeners_) r->OnLeaseCancelled(lease_id);
}

void Client::ReporterLoop() {
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    {
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || urgent_; };
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&woken),
                           absl::FromChrono(std::max(next - std::chrono::steady_clock::now(),
                                                     std::chrono::steady_clock::duration::zero())));
      if (stopping_) break;
      urgent_ = false;
    }
    next = std::chrono::steady_clock::now() + std::chrono::milliseconds(interval_ms_);
    if (!health().ok()) continue;  // latched: nothing more will be accepted
    ReportOnce();
  }
}

void Client::ReportOnce() {
  SendHeartbeat();
  SendCompletions();
  SendSteps();
}

void Client::SendHeartbeat() {
  HeartbeatRequest req;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, p] : progress_) {
      if (req.progress_size() >= kMaxProgressPerHeartbeat) {
        urgent_ = true;  // the rest goes in the next round, at once
        break;
      }
      *req.add_progress() = p.request;
    }
    in_flight_ += req.progress_size();
    ++heartbeats_begun_;
    if (options_.honors_exclusion) {
      // The burst rule's evidence (HeartbeatRequest.step_timings): the newest step ended since
      // the last heartbeat, and how long the running step has computed so far.
      if (!newest_step_sent_) {
        HeartbeatStepTiming* t = req.add_step_timings();
        t->set_step(newest_step_.step());
        t->set_compute_s(newest_step_.compute_s());
        t->set_samples(newest_step_.samples());
        t->set_wall_s(newest_step_.wall_s());
        t->set_time_ms(newest_step_.time_ms());
        newest_step_sent_ = true;
      }
      if (running_.running && running_.clock != nullptr && running_.samples > 0) {
        const int64_t now = running_.clock->MonotonicNs();
        const int64_t computing_until = running_.open_ns > 0 ? running_.open_ns : now;
        const int64_t compute_ns =
            std::max<int64_t>(0, computing_until - running_.begin_ns - running_.phase_ns);
        HeartbeatStepTiming* t = req.add_step_timings();
        t->set_step(running_.step);
        t->set_compute_s(static_cast<double>(compute_ns) / 1e9);
        t->set_samples(running_.samples);
        t->set_wall_s(static_cast<double>(now - running_.begin_ns) / 1e9);
        t->set_in_progress(true);
        if (running_.samples_done > 0 && running_.done_compute_ns > 0) {
          t->set_samples_done(std::min(running_.samples_done, running_.samples));
          t->set_done_compute_s(static_cast<double>(running_.done_compute_ns) / 1e9);
        }
      }
    }
  }
  req.set_step(step_.load(std::memory_order_relaxed));
  req.set_plan_version(plan_.newest_version());
  req.set_regroup_generation(regroup_generation());
  req.set_exclusion_version(exclusion_version());
  req.set_honors_exclusion(options_.honors_exclusion);
  req.set_max_local_batch(options_.max_local_batch);
  auto resp = sharding_->Heartbeat(req);
  std::vector<std::pair<uint64_t, uint64_t>> acked;
  std::vector<uint64_t> cancelled;
  std::vector<std::pair<ReportListener*, uint64_t>> next_abandoned;
  {
    absl::MutexLock l(&mu_);
    in_flight_ -= req.progress_size();
    ++heartbeats_ended_;
    if (!resp.ok()) {
      ++stats_.heartbeat_failures;
    } else {
      ++stats_.heartbeats_ok;
      step_line_s_.store(options_.honors_exclusion ? resp->step_line_s() : 0, std::memory_order_release);
      cancelled.assign(resp->cancelled_leases().begin(), resp->cancelled_leases().end());
      // Leases pacerd released because this worker never saw their fetch reply: none of them
      // should be in hand (the held set lists every lease received); drop any that is.
      for (uint64_t id : resp->released_unknown_leases()) {
        ++stats_.leases_released_unknown;
        cancelled.push_back(id);
      }
      for (const auto& p : req.progress()) {
        const bool was_cancelled =
            std::find(cancelled.begin(), cancelled.end(), p.lease_id()) != cancelled.end();
        auto it = progress_.find(p.lease_id());
        if (was_cancelled) {
          if (it != progress_.end()) progress_.erase(it);
          continue;
        }
        acked.emplace_back(p.lease_id(), p.records_done());
        ++stats_.progress_acked;
        if (it != progress_.end() && it->second.request.records_done() <= p.records_done()) {
          progress_.erase(it);
        }
      }
      for (uint64_t id : cancelled) {
        progress_.erase(id);
        auto c = completions_.find(id);
        if (c == completions_.end()) continue;
        if (c->second.next_for != nullptr) next_abandoned.emplace_back(c->second.next_for, id);
        completions_.erase(c);
      }
      for (const auto& cmd : resp->commands()) {
        if (cmd.has_batch_plan()) {
          if (plan_.Offer(cmd.batch_plan())) ++stats_.plans_received;
        } else if (cmd.has_regroup()) {
          if (cmd.regroup().generation() > regroup_generation()) ++stats_.regroups_received;
          NoteRegroupGeneration(cmd.regroup().generation());
        } else if (cmd.has_exclusion()) {
          // Only the reporter thread writes exclusion_; versions only move forward.
          const uint64_t v = cmd.exclusion().version();
          if (options_.honors_exclusion && v > exclusion_version()) {
            ++stats_.exclusions_received;
            exclusion_.store(v << 1 | (cmd.exclusion().excluded() ? 1 : 0), std::memory_order_release);
            PACER_LOG(INFO) << "worker '" << options_.worker_id << "': "
                            << (cmd.exclusion().excluded() ? "excluded from" : "included in")
                            << " the job's steps (decision " << v << ")";
          }
        } else if (cmd.kind_case() == WorkerCommand::kStop) {
          stop_reason_ = cmd.stop();
          stop_requested_.store(true, std::memory_order_release);
        }
      }
    }
  }
  if (!resp.ok()) {
    if (!Retryable(resp.status().code()) && resp.status().code() != absl::StatusCode::kCancelled) {
      LatchPermanent(Annotate(resp.status(), "heartbeat"));
    } else if (resp.status().code() != absl::StatusCode::kCancelled) {
      PACER_LOG(WARNING) << "heartbeat: " << resp.status().message() << "; will retry";
    }
    return;
  }
  for (const auto& [listener, id] : next_abandoned) {
    DeliverNext(listener, id, absl::FailedPreconditionError("lease cancelled before it completed"));
  }
  for (const auto& [id, done] : acked) Acknowledge(id, done);
  for (uint64_t id : cancelled) Cancelled(id);
}

void Client::SendCompletions() {
  std::vector<PendingCompletion> todo;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, c] : completions_) todo.push_back(c);
    in_flight_ += todo.size();
  }
  for (size_t i = 0; i < todo.size(); ++i) {
    const Lease& lease = todo[i].lease;
    absl::Status s;
    if (todo[i].next_for != nullptr) {
      // One durable call: the completion and the next lease. The listener hears the answer
      // before the completion leaves the queue, so a Flush() that returns has delivered it.
      auto r = sharding_->CompleteAndFetch(lease, todo[i].next_dataset);
      s = r.status();
      absl::StatusOr<FetchShardResponse> next =
          !r.ok() ? absl::StatusOr<FetchShardResponse>(r.status())
          : r->has_next() ? absl::StatusOr<FetchShardResponse>(r->next())
                          : absl::UnimplementedError("pacerd does not lease in CompleteShard");
      if (!r.ok() && !Retryable(s.code()) && s.code() != absl::StatusCode::kCancelled) {
        // The completion or the next lease failed (a dataset that failed meanwhile): ask the
        // completion alone, which is idempotent, for its own answer.
        s = sharding_->Complete(lease);
      }
      if (!r.ok()) {
        // Sent again (if at all) as a plain completion: the listener fetches on its own.
        absl::MutexLock l(&mu_);
        if (auto it = completions_.find(lease.lease_id());
            it != completions_.end() && it->second.next_for == todo[i].next_for) {
          it->second.next_for = nullptr;
          it->second.next_dataset.clear();
        }
      }
      DeliverNext(todo[i].next_for, lease.lease_id(), next);
    } else {
      s = sharding_->Complete(lease);
    }
    const uint64_t len = lease.end() - lease.begin();
    {
      absl::MutexLock l(&mu_);
      --in_flight_;
      if (s.ok()) {
        completions_.erase(lease.lease_id());
        ++stats_.completions_acked;
      } else if (s.code() == absl::StatusCode::kFailedPrecondition) {
        completions_.erase(lease.lease_id());
      }
    }
    if (s.ok()) {
      Acknowledge(lease.lease_id(), len);
    } else if (s.code() == absl::StatusCode::kFailedPrecondition) {
      PACER_LOG(WARNING) << "lease " << lease.lease_id() << " not completed: " << s.message();
      Cancelled(lease.lease_id());
    } else {
      if (!Retryable(s.code()) && s.code() != absl::StatusCode::kCancelled) {
        LatchPermanent(Annotate(s, "complete shard"));
      }
      absl::MutexLock l(&mu_);
      in_flight_ -= todo.size() - i - 1;  // the rest stays queued for the next round
      return;
    }
  }
}

void Client::SendSteps() {
  if (!monitor_enabled_.load(std::memory_order_relaxed)) return;
  ReportStepsRequest req;
  {
    absl::MutexLock l(&mu_);
    const size_t n = std::min(steps_.size(), kMaxStepsPerRequest);
    if (n == 0) return;
    for (size_t i = 0; i < n; ++i) *req.add_steps() = std::move(steps_[i]);
    steps_.erase(steps_.begin(), steps_.begin() + static_cast<long>(n));
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, options_.token);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.rpc_timeout_ms));
    ReportStepsResponse resp;
    absl::Status s = FromGrpcStatus(monitor_->ReportSteps(&ctx, req, &resp));
    if (!s.ok()) {
      absl::MutexLock l(&mu_);
      if (s.code() == absl::StatusCode::kUnimplemented) {
        monitor_enabled_ = false;
        return;
      }
      // Put them back in front (bounded); the monitor drops reports that grew stale.
      std::vector<StepReport> back(req.steps().begin(), req.steps().end());
      steps_.insert(steps_.begin(), back.begin(), back.end());
      if (steps_.size() > kMaxQueuedSteps) {
        stats_.steps_dropped += steps_.size() - kMaxQueuedSteps;
        steps_.erase(steps_.begin(), steps_.begin() + static_cast<long>(steps_.size() - kMaxQueuedSteps));
      }
      return;
    }
    auto unknown = resp.rejected_by_reason().find("unknown_worker");
    const bool forgotten = unknown != resp.rejected_by_reason().end() && unknown->second > 0;
    {
      absl::MutexLock l(&mu_);
      stats_.steps_sent += resp.accepted() + resp.clamped();
      if (!forgotten || attempt == 1) stats_.steps_rejected += resp.rejected();
    }
    // pacerd restarted: the monitor's state is soft. Declare the worker again and resend once.
    if (!forgotten || attempt == 1 || !RegisterWithMonitor().ok()) return;
    absl::MutexLock l(&mu_);
    ++stats_.monitor_reregistrations;
  }
}

}  // namespace pacer
