#include "rendezvous/rendezvous_service.h"

#include <charconv>

namespace pacer {

RendezvousServiceImpl::RendezvousServiceImpl(RendezvousOptions options, MetricsRegistry* metrics)
    : options_(options),
      own_metrics_(metrics ? nullptr : std::make_unique<MetricsRegistry>()),
      metrics_(metrics ? metrics : own_metrics_.get()) {}

void RendezvousServiceImpl::UpdateGauges() {
  metrics_.generation.Get().Set(static_cast<double>(generation_));
  metrics_.keys.Get().Set(static_cast<double>(kv_.size()));
  metrics_.waiting.Get().Set(static_cast<double>(waiters_.size()));
}

RendezvousServiceImpl::~RendezvousServiceImpl() {
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    for (auto& [tag, w] : waiters_) {
      out.emplace_back(std::move(w.done), absl::CancelledError("rendezvous: shutting down"));
    }
    waiters_.clear();
  }
  Run(out);
}

void RendezvousServiceImpl::Shutdown() {
  std::vector<Completion> out;
  {
    absl::MutexLock l(&mu_);
    shutdown_ = true;
    for (auto& [tag, w] : waiters_) {
      out.emplace_back(std::move(w.done), absl::UnavailableError("rendezvous: pacerd is stopping"));
    }
    waiters_.clear();
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
  bytes_ = 0;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.generation < generation_) {
      out->emplace_back(std::move(it->second.done),
                        absl::AbortedError("rendezvous: generation " +
                                           std::to_string(it->second.generation) +
                                           " was superseded by " + std::to_string(generation_) +
                                           " while waiting: regroup"));
      it = waiters_.erase(it);
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

absl::Status RendezvousServiceImpl::Set(const RendezvousSetRequest& req, RendezvousSetResponse*) {
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
    auto it = kv_.find(req.key());
    const size_t old = it == kv_.end() ? 0 : it->first.size() + it->second.size();
    const size_t now = req.key().size() + req.value().size();
    if (bytes_ - old + now > options_.max_bytes) {
      return absl::ResourceExhaustedError("rendezvous set: the store is over " +
                                          std::to_string(options_.max_bytes) + " bytes");
    }
    bytes_ = bytes_ - old + now;
    kv_[req.key()] = req.value();
    WakeReady(&out);
    UpdateGauges();
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Add(const RendezvousAddRequest& req, RendezvousAddResponse* resp) {
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
      const std::string& v = it->second;
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
    const std::string value = std::to_string(sum);
    const size_t old = it == kv_.end() ? 0 : it->first.size() + it->second.size();
    const size_t now = req.key().size() + value.size();
    if (bytes_ - old + now > options_.max_bytes) {
      return absl::ResourceExhaustedError("rendezvous add: the store is over " +
                                          std::to_string(options_.max_bytes) + " bytes");
    }
    bytes_ = bytes_ - old + now;
    kv_[req.key()] = value;
    resp->set_value(sum);
    WakeReady(&out);
    UpdateGauges();
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RendezvousServiceImpl::Check(const RendezvousCheckRequest& req,
                                          RendezvousCheckResponse* resp) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = CheckGeneration(req.generation()); !s.ok()) return s;
  resp->set_all_set(AllSet({req.keys().begin(), req.keys().end()}));
  return absl::OkStatus();
}

bool RendezvousServiceImpl::AllSet(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!kv_.count(k)) return false;
  }
  return true;
}

void RendezvousServiceImpl::FillValues(const std::vector<std::string>& keys,
                                       RendezvousGetResponse* resp) const {
  resp->clear_values();
  for (const auto& k : keys) resp->add_values(kv_.at(k));
}

void RendezvousServiceImpl::WakeReady(std::vector<Completion>* out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (AllSet(it->second.keys)) {
      FillValues(it->second.keys, it->second.resp);
      out->emplace_back(std::move(it->second.done), absl::OkStatus());
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void RendezvousServiceImpl::Get(const RendezvousGetRequest& req, RendezvousGetResponse* resp,
                                const void* tag, Done done) {
  absl::Status s;
  {
    absl::MutexLock l(&mu_);
    std::vector<std::string> keys(req.keys().begin(), req.keys().end());
    if (keys.empty() || keys.size() > options_.max_keys_per_get) {
      s = absl::InvalidArgumentError("rendezvous get: between 1 and " +
                                     std::to_string(options_.max_keys_per_get) + " keys");
    } else if (s = CheckGeneration(req.generation()); s.ok()) {
      if (AllSet(keys)) {
        FillValues(keys, resp);
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
      } else {
        waiters_.emplace(tag, Waiter{req.generation(), std::move(keys), resp, std::move(done)});
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
    done = std::move(it->second.done);
    waiters_.erase(it);
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
