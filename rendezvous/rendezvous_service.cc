#include "rendezvous/rendezvous_service.h"

#include <charconv>

#include "common/reply_limit.h"

namespace pacer {

RendezvousServiceImpl::RendezvousServiceImpl(RendezvousOptions options, MetricsRegistry* metrics)
    : options_(options),
      own_metrics_(metrics ? nullptr : std::make_unique<MetricsRegistry>()),
      metrics_(metrics ? metrics : own_metrics_.get()),
      store_budget_({options_.max_bytes, options_.max_bytes_per_caller}, "the store",
                    "RendezvousOptions::max_bytes", "RendezvousOptions::max_bytes_per_caller"),
      waiting_budget_({options_.max_waiting_bytes, options_.max_waiting_bytes_per_caller},
                      "rendezvous get: waiting calls", "RendezvousOptions::max_waiting_bytes",
                      "RendezvousOptions::max_waiting_bytes_per_caller"),
      reply_budget_({options_.max_reply_bytes_in_flight, options_.max_reply_bytes_in_flight_per_caller},
                    "rendezvous get: replies not yet sent",
                    "RendezvousOptions::max_reply_bytes_in_flight",
                    "RendezvousOptions::max_reply_bytes_in_flight_per_caller") {}

namespace {

// What a key costs in the store: its bytes, its value's, and the store's own structures.
size_t EntryBytes(const std::string& key, const std::string& value) {
  return key.size() + value.size() + kStoreEntryOverheadBytes;
}

// Every key of a Get or Check: 1..max_keys_per_get keys of 1..max_key_bytes bytes.
absl::Status CheckKeys(const google::protobuf::RepeatedPtrField<std::string>& keys,
                       const RendezvousOptions& options, const char* what) {
  if (keys.empty() || keys.size() > static_cast<int>(options.max_keys_per_get)) {
    return absl::InvalidArgumentError(std::string(what) + ": between 1 and " +
                                      std::to_string(options.max_keys_per_get) + " keys (got " +
                                      std::to_string(keys.size()) + ")");
  }
  for (int i = 0; i < keys.size(); ++i) {
    if (keys[i].empty() || keys[i].size() > options.max_key_bytes) {
      return absl::InvalidArgumentError(std::string(what) + ": keys[" + std::to_string(i) +
                                        "] is " + std::to_string(keys[i].size()) +
                                        " bytes; a key is 1.." +
                                        std::to_string(options.max_key_bytes) + " bytes");
    }
  }
  return absl::OkStatus();
}

}  // namespace

void RendezvousServiceImpl::UpdateGauges() {
  metrics_.generation.Get().Set(static_cast<double>(generation_));
  metrics_.keys.Get().Set(static_cast<double>(kv_.size()));
  metrics_.waiting.Get().Set(static_cast<double>(waiters_.size()));
}

RendezvousServiceImpl::~RendezvousServiceImpl() {
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    while (!waiters_.empty()) {
      out.emplace_back(TakeWaiter(waiters_.begin()), absl::CancelledError("rendezvous: shutting down"));
    }
  }
  Run(out);
}

void RendezvousServiceImpl::Shutdown() {
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    shutdown_ = true;
    while (!waiters_.empty()) {
      out.emplace_back(TakeWaiter(waiters_.begin()),
                       absl::UnavailableError("rendezvous: pacerd is stopping"));
    }
    UpdateGauges();
  }
  Run(out);
}

void RendezvousServiceImpl::Run(std::vector<Completion>& completions) {
  for (auto& [done, status] : completions) done(status);
  completions.clear();
}

absl::Status RendezvousServiceImpl::CheckGeneration(uint64_t generation) const {
  if (generation_ == 0 || generation > generation_) {
    return absl::FailedPreconditionError(
        "rendezvous: generation " + std::to_string(generation) +
        " is unknown (current " + std::to_string(generation_) +
        "; pacerd restarted?): Join again");
  }
  if (generation < generation_) {
    return absl::AbortedError("rendezvous: generation " + std::to_string(generation) +
                              " was superseded by " + std::to_string(generation_) +
                              ": regroup");
  }
  return absl::OkStatus();
}

void RendezvousServiceImpl::Bump(std::vector<Completion>* out) {
  if (generation_ > 0) {
    ++regroups_;
    metrics_.regroups.Get().Increment();
  }
  ++generation_;
  kv_.clear();
  store_budget_.Clear();
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.generation < generation_) {
      absl::Status aborted = absl::AbortedError(
          "rendezvous: generation " + std::to_string(it->second.generation) +
          " was superseded by " + std::to_string(generation_) + " while waiting: regroup");
      auto next = std::next(it);
      out->emplace_back(TakeWaiter(it), std::move(aborted));
      it = next;
    } else {
      ++it;
    }
  }
}

absl::Status RendezvousServiceImpl::Join(const RendezvousJoinRequest& req,
                                         RendezvousJoinResponse* resp, JoinAuthority authority) {
  if (req.worker_id().empty()) return absl::InvalidArgumentError("rendezvous join: worker_id is empty");
  if (req.world_size() == 0) return absl::InvalidArgumentError("rendezvous join: world_size must be > 0");
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    if (world_size_ == 0 && !authority.may_open) {
      // Only the chief fixes the world size, so a stray Join cannot size the group for everyone.
      return absl::UnavailableError(
          "rendezvous join: the group is not open yet; the chief (rank 0) opens it — retrying");
    }
    if (world_size_ != 0 && req.world_size() != world_size_) {
      return absl::InvalidArgumentError(
          "rendezvous join: world_size " + std::to_string(req.world_size()) +
          " differs from the group's " + std::to_string(world_size_));
    }
    const uint32_t world = world_size_ != 0 ? world_size_ : req.world_size();
    int32_t held = -1;  // the rank this worker holds already
    for (const auto& [rank, m] : members_) {
      if (m.worker_id == req.worker_id()) held = rank;
    }
    int32_t rank = req.rank();
    if (rank < -1 || rank >= static_cast<int32_t>(world)) {
      return absl::InvalidArgumentError("rendezvous join: rank " + std::to_string(rank) +
                                        " outside [0, " + std::to_string(world) + ")");
    }
    if (rank == -1) {
      rank = held;
      for (int32_t r = 0; rank == -1 && r < static_cast<int32_t>(world); ++r) {
        if (!members_.count(r)) rank = r;
      }
      if (rank == -1) {
        return absl::FailedPreconditionError("rendezvous join: the group of " +
                                             std::to_string(world) + " ranks is full");
      }
    }
    if (held != -1 && held != rank) {
      return absl::FailedPreconditionError("rendezvous join: worker '" + req.worker_id() +
                                           "' holds rank " + std::to_string(held) +
                                           ", not " + std::to_string(rank));
    }
    auto it = members_.find(rank);
    if (it != members_.end() && it->second.worker_id != req.worker_id()) {
      return absl::FailedPreconditionError("rendezvous join: rank " + std::to_string(rank) +
                                           " is held by worker '" + it->second.worker_id + "'");
    }
    world_size_ = world;
    if (generation_ == 0) Bump(&out);
    if (it == members_.end()) {
      members_[rank] = Member{req.worker_id(), req.incarnation()};
    } else if (it->second.incarnation != req.incarnation()) {
      it->second.incarnation = req.incarnation();  // the worker restarted: regroup
      Bump(&out);
    }
    resp->set_generation(generation_);
    resp->set_rank(rank);
    resp->set_world_size(world_size_);
    UpdateGauges();
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Reform(const RendezvousReformRequest& req,
                                           RendezvousReformResponse* resp) {
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    if (generation_ == 0) {
      return absl::FailedPreconditionError("rendezvous reform: no group yet (Join first)");
    }
    // Only a member moves the generation on. A worker that is not (yet) one — a rank that lost
    // its group in a pacerd restart and reforms before it joins again, or a stray caller —
    // learns the current generation and changes nothing. No worker id: pacerd itself, or a
    // launcher through the gRPC adapter (which lets only the job or admin token omit it).
    bool member = req.worker_id().empty();
    for (const auto& [rank, m] : members_) member = member || m.worker_id == req.worker_id();
    if (member && req.generation() == generation_) Bump(&out);
    resp->set_generation(generation_);
    UpdateGauges();
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Store(const std::string& key, std::string value,
                                          const std::string& caller, const char* what) {
  auto it = kv_.find(key);
  const size_t now = EntryBytes(key, value);
  if (it != kv_.end()) store_budget_.Release(it->second.caller, EntryBytes(key, it->second.value));
  absl::Status s = store_budget_.Charge(caller, now);
  if (!s.ok()) {
    if (it != kv_.end()) {  // the old value stays, and its charge
      store_budget_.Charge(it->second.caller, EntryBytes(key, it->second.value)).IgnoreError();
    }
    return absl::ResourceExhaustedError(std::string(what) + ": " + std::string(s.message()) +
                                        "; keys and values, " +
                                        std::to_string(kStoreEntryOverheadBytes) +
                                        " bytes more a key");
  }
  kv_[key] = Entry{std::move(value), caller};
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Set(const RendezvousSetRequest& req, RendezvousSetResponse*,
                                        const std::string& caller) {
  if (req.key().empty()) return absl::InvalidArgumentError("rendezvous set: empty key");
  if (req.key().size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError("rendezvous set: key of " + std::to_string(req.key().size()) +
                                      " bytes is over " + std::to_string(options_.max_key_bytes));
  }
  if (req.value().size() > options_.max_value_bytes) {
    return absl::InvalidArgumentError("rendezvous set: value of " +
                                      std::to_string(req.value().size()) + " bytes is over " +
                                      std::to_string(options_.max_value_bytes));
  }
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    if (absl::Status s = CheckGeneration(req.generation()); !s.ok()) return s;
    RETURN_IF_ERROR(Store(req.key(), req.value(), caller, "rendezvous set"));
    WakeReady(&out);
    UpdateGauges();
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Add(const RendezvousAddRequest& req, RendezvousAddResponse* resp,
                                        const std::string& caller) {
  if (req.key().empty()) return absl::InvalidArgumentError("rendezvous add: empty key");
  if (req.key().size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError("rendezvous add: key of " + std::to_string(req.key().size()) +
                                      " bytes is over " + std::to_string(options_.max_key_bytes));
  }
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    if (absl::Status s = CheckGeneration(req.generation()); !s.ok()) return s;
    auto it = kv_.find(req.key());
    int64_t n = 0;
    if (it != kv_.end()) {
      const std::string& v = it->second.value;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (v.empty() || ec != std::errc() || p != v.data() + v.size()) {
        return absl::FailedPreconditionError("rendezvous add: key '" + req.key() +
                                             "' holds a value that is not a counter");
      }
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(n, req.delta(), &sum)) {
      return absl::OutOfRangeError("rendezvous add: counter '" + req.key() + "' would overflow int64");
    }
    RETURN_IF_ERROR(Store(req.key(), std::to_string(sum), caller, "rendezvous add"));
    resp->set_value(sum);
    WakeReady(&out);
    UpdateGauges();
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Check(const RendezvousCheckRequest& req,
                                          RendezvousCheckResponse* resp) {
  RETURN_IF_ERROR(CheckKeys(req.keys(), options_, "rendezvous check"));
  absl::MutexLock l(&mu_);
  if (absl::Status s = CheckGeneration(req.generation()); !s.ok()) return s;
  bool all = true;
  for (const std::string& k : req.keys()) all = all && kv_.count(k) > 0;
  resp->set_all_set(all);
  return absl::OkStatus();
}

bool RendezvousServiceImpl::AllSet(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!kv_.count(k)) return false;
  }
  return true;
}

absl::Status RendezvousServiceImpl::FillValues(const std::vector<std::string>& keys,
                                               RendezvousGetResponse* resp, const void* tag,
                                               const std::string& caller) {
  resp->clear_values();
  // The reply's size before it is built: values plus a few bytes of framing each. A Get that
  // names a 1 MiB key 4 096 times would otherwise build a 4 GiB reply.
  uint64_t bytes = 0;
  for (const auto& k : keys) bytes += kv_.at(k).value.size() + 8;
  if (bytes > kMaxReplyBytes) {
    return absl::ResourceExhaustedError(
        "rendezvous get: the values of " + std::to_string(keys.size()) + " keys are " +
        std::to_string(bytes) + " bytes, over pacerd's reply limit of " +
        std::to_string(kMaxReplyBytes) + " bytes; get fewer keys at once");
  }
  RETURN_IF_ERROR(reply_budget_.Charge(caller, bytes));
  Reply& r = replies_[tag];
  if (r.charged > 0) reply_budget_.Release(r.caller, r.charged);  // a tag reused unfinished
  r = Reply{caller, bytes};
  for (const auto& k : keys) resp->add_values(kv_.at(k).value);
  return absl::OkStatus();
}

RendezvousServiceImpl::Done RendezvousServiceImpl::TakeWaiter(
    std::map<const void*, Waiter>::iterator it) {
  waiting_budget_.Release(it->second.caller, it->second.charged);
  Done done = std::move(it->second.done);
  waiters_.erase(it);
  return done;
}

void RendezvousServiceImpl::WakeReady(std::vector<Completion>* out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (AllSet(it->second.keys)) {
      absl::Status s = FillValues(it->second.keys, it->second.resp, it->first, it->second.caller);
      auto next = std::next(it);
      out->emplace_back(TakeWaiter(it), std::move(s));
      it = next;
    } else {
      ++it;
    }
  }
}

void RendezvousServiceImpl::Finished(const void* tag) {
  absl::MutexLock l(&mu_);
  auto it = replies_.find(tag);
  if (it == replies_.end()) return;
  reply_budget_.Release(it->second.caller, it->second.charged);
  replies_.erase(it);
}

void RendezvousServiceImpl::Get(const RendezvousGetRequest& req, RendezvousGetResponse* resp,
                                const void* tag, Done done, const std::string& caller) {
  absl::Status s = CheckKeys(req.keys(), options_, "rendezvous get");
  if (s.ok()) {
    absl::MutexLock l(&mu_);
    std::vector<std::string> keys(req.keys().begin(), req.keys().end());
    if (s = CheckGeneration(req.generation()); s.ok()) {
      // A parked Get holds its keys twice (the request, the parked copy) and a call.
      uint64_t waiting_bytes = kWaitingGetOverheadBytes;
      for (const auto& k : keys) waiting_bytes += 2 * k.size() + kWaitingKeyOverheadBytes;
      if (AllSet(keys)) {
        s = FillValues(keys, resp, tag, caller);
      } else if (!req.wait()) {
        s = absl::NotFoundError("rendezvous get: a key is not set");
      } else if (shutdown_) {
        s = absl::UnavailableError("rendezvous: pacerd is stopping");
      } else if (waiters_.size() >= options_.max_waiting_gets) {
        s = absl::ResourceExhaustedError("rendezvous get: " +
                                         std::to_string(options_.max_waiting_gets) +
                                         " Get calls are waiting already");
      } else if (waiters_.count(tag)) {
        s = absl::InternalError("rendezvous get: tag already waiting");
      } else if (s = waiting_budget_.Charge(caller, waiting_bytes); s.ok()) {
        waiters_.emplace(tag, Waiter{req.generation(), std::move(keys), resp, std::move(done),
                                     caller, waiting_bytes});
        UpdateGauges();
        return;
      }
    }
  }
  done(s);
}

void RendezvousServiceImpl::CancelWait(const void* tag) {
  Done done;
  {
    absl::MutexLock l(&mu_);
    auto it = waiters_.find(tag);
    if (it == waiters_.end()) return;
    done = TakeWaiter(it);
    UpdateGauges();
  }
  done(absl::CancelledError("rendezvous get: cancelled (deadline passed or client gone)"));
}

void RendezvousServiceImpl::OnHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp) {
  absl::MutexLock l(&mu_);
  if (generation_ == 0 || req.regroup_generation() >= generation_) return;
  for (const auto& [rank, m] : members_) {
    if (m.worker_id != req.worker_id() || m.incarnation != req.incarnation()) continue;
    WorkerCommand* cmd = resp->add_commands();
    cmd->set_command_id(generation_);
    RegroupCommand* r = cmd->mutable_regroup();
    r->set_generation(generation_);
    r->set_world_size(world_size_);
    r->set_rank(rank);
    return;
  }
}

RendezvousStats RendezvousServiceImpl::stats() const {
  absl::MutexLock l(&mu_);
  return RendezvousStats{generation_, regroups_, kv_.size(), waiters_.size()};
}

}  // namespace pacer
