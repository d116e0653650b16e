#include "agent/agent_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <set>

#include "absl/strings/str_format.h"
#include "agent/agent_metrics.h"
#include "common/log.h"
#include "common/status.h"

namespace pacer {

const char* CommandStateName(CommandState s) {
  switch (s) {
    case CommandState::kPending: return "pending";
    case CommandState::kDone: return "done";
    case CommandState::kRefused: return "refused";
  }
  return "?";
}

// The series are declared in agent/agent_metrics.h (PACER_AGENT_METRICS); these are the ones the
// registry counts, looked up once.
struct AgentRegistry::Metrics {
  explicit Metrics(MetricsRegistry* r)
      : declared(r),
        heartbeats(declared.heartbeats.Get()),
        rejected(declared.rejected.Get()),
        registrations(declared.registrations.Get()),
        queued(declared.commands.With({"queued"})),
        done(declared.commands.With({"done"})),
        refused(declared.commands.With({"refused"})),
        exits(declared.exits.Get()) {}
  std::unique_ptr<MetricsRegistry> own;  // set after construction; destroyed last
  AgentMetrics declared;
  prometheus::Counter& heartbeats;
  prometheus::Counter& rejected;
  prometheus::Counter& registrations;
  prometheus::Counter& queued;
  prometheus::Counter& done;
  prometheus::Counter& refused;
  prometheus::Counter& exits;
};

namespace {

uint64_t RandomNonce() {
  uint64_t v = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &v, sizeof(v)) != static_cast<ssize_t>(sizeof(v))) v = 0;
    close(fd);
  }
  return v != 0 ? v : static_cast<uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull;
}

bool ValidState(int s) {
  return s >= WORKER_STATE_RUNNING && s <= WORKER_STATE_STOPPING &&
         WorkerProcessState_IsValid(s);
}

}  // namespace

AgentRegistry::AgentRegistry(AgentRegistryOptions options, const Clock* clock,
                             MetricsRegistry* metrics)
    : options_(options), clock_(clock), nonce_(options.id_nonce ? options.id_nonce : RandomNonce()) {
  std::unique_ptr<MetricsRegistry> own;
  if (metrics == nullptr) {
    own = std::make_unique<MetricsRegistry>();
    metrics = own.get();
  }
  metrics_ = std::make_unique<Metrics>(metrics);
  metrics_->own = std::move(own);
}

AgentRegistry::~AgentRegistry() = default;

bool AgentRegistry::IsLost(const AgentView& v) const {
  return clock_->NowMs() - v.last_heartbeat_ms > options_.agent_timeout_ms;
}

absl::Status AgentRegistry::ValidateHeartbeat(const AgentHeartbeat& req,
                                              const std::set<std::string>& left_out) const {
  if (req.agent_id().empty()) return absl::InvalidArgumentError("agent_id is required");
  if (req.node().empty()) return absl::InvalidArgumentError("node is required");
  if (req.incarnation() == 0) return absl::InvalidArgumentError("incarnation must be > 0");
  if (req.has_node_metrics() && !req.node_metrics().node().empty() &&
      req.node_metrics().node() != req.node()) {
    return absl::InvalidArgumentError("node_metrics.node '" + req.node_metrics().node() +
                                      "' differs from node '" + req.node() + "'");
  }
  auto known = agents_.find(req.agent_id());
  if (known != agents_.end() && req.incarnation() < known->second.view.incarnation) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "agent '%s' incarnation %d is older than the registered %d (a zombie agent)",
        req.agent_id(), req.incarnation(), known->second.view.incarnation));
  }
  if (static_cast<size_t>(req.workers_size()) > options_.max_workers_per_agent) {
    return absl::InvalidArgumentError(absl::StrFormat("%d workers listed; at most %d per agent",
                                                      req.workers_size(), options_.max_workers_per_agent));
  }
  if (static_cast<size_t>(req.exits_size()) > options_.max_exits_per_heartbeat ||
      static_cast<size_t>(req.acks_size()) > options_.max_acks_per_heartbeat) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d exits and %d acks in one heartbeat; at most %d and %d", req.exits_size(), req.acks_size(),
        options_.max_exits_per_heartbeat, options_.max_acks_per_heartbeat));
  }
  std::set<std::string> ids;
  for (const WorkerProcess& w : req.workers()) {
    if (w.worker_id().empty()) return absl::InvalidArgumentError("workers[].worker_id is empty");
    if (!ids.insert(w.worker_id()).second) {
      return absl::InvalidArgumentError("worker '" + w.worker_id() + "' listed twice");
    }
    if (!ValidState(w.state())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("worker '%s' has an invalid state %d", w.worker_id(), w.state()));
    }
    if (left_out.count(w.worker_id())) continue;  // not claimed by this heartbeat
    auto sup = supervisors_.find(w.worker_id());
    if (sup == supervisors_.end()) continue;
    for (const std::string& other_id : sup->second) {
      if (other_id == req.agent_id()) continue;
      const AgentEntry& other = agents_.at(other_id);
      if (other.view.leaving || IsLost(other.view)) continue;
      return absl::FailedPreconditionError("worker '" + w.worker_id() +
                                           "' is supervised by live agent '" + other_id + "'");
    }
  }
  uint64_t prev = 0;
  for (const WorkerExit& e : req.exits()) {
    if (e.seq() == 0 || e.seq() <= prev) {
      return absl::InvalidArgumentError("exits[].seq must be > 0 and increasing");
    }
    if (e.worker_id().empty()) return absl::InvalidArgumentError("exits[].worker_id is empty");
    prev = e.seq();
  }
  for (const CommandAck& a : req.acks()) {
    if (a.command_id().empty()) return absl::InvalidArgumentError("acks[].command_id is empty");
  }
  return absl::OkStatus();
}

void AgentRegistry::RecordAck(AgentEntry& agent, const CommandAck& ack) {
  auto it = commands_.find(ack.command_id());
  if (it == commands_.end() || it->second.agent_id != agent.view.agent_id) return;  // not ours
  CommandStatus& c = it->second;
  if (c.state != CommandState::kPending) return;  // a repeated ack changes nothing
  c.state = ack.ok() ? CommandState::kDone : CommandState::kRefused;
  c.reason = ack.reason();
  c.duplicate_ack = ack.duplicate();
  c.acked_ms = clock_->NowMs();
  (ack.ok() ? metrics_->done : metrics_->refused).Increment();
  std::erase(agent.pending, ack.command_id());
  finished_order_.push_back(ack.command_id());
  if (!ack.ok()) {
    PACER_LOG(WARNING) << "agent " << agent.view.agent_id << " refused command "
                       << ack.command_id() << ": " << ack.reason();
  }
}

void AgentRegistry::TrimFinished() {
  while (finished_order_.size() > options_.max_finished_commands_kept) {
    commands_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
}

absl::Status AgentRegistry::Heartbeat(const AgentHeartbeat& req, AgentHeartbeatReply* reply,
                                     const std::set<std::string>& left_out) {
  std::optional<NodeMetrics> metrics;
  {
    absl::MutexLock l(&mu_);
    if (absl::Status s = ValidateHeartbeat(req, left_out); !s.ok()) {
      metrics_->rejected.Increment();
      return s;
    }
    const int64_t now = clock_->NowMs();
    if (!agents_.count(req.agent_id()) && agents_.size() >= options_.max_agents && !EvictOneLost()) {
      metrics_->rejected.Increment();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%d agents are registered and none is lost: the table is full", agents_.size()));
    }
    auto [it, inserted] = agents_.try_emplace(req.agent_id());
    AgentEntry& a = it->second;
    const bool registered = inserted || req.incarnation() > a.view.incarnation;
    if (registered) {
      a.view.agent_id = req.agent_id();
      a.view.incarnation = req.incarnation();
      a.view.registered_ms = now;
      a.view.registrations++;
      a.exits_acked_through = 0;
      metrics_->registrations.Increment();
      PACER_LOG(INFO) << "agent " << req.agent_id() << " on node " << req.node()
                      << " registered (incarnation " << req.incarnation() << ", "
                      << req.workers_size() << " workers)";
    }
    a.view.node = req.node();
    a.view.job = req.job();
    a.view.last_heartbeat_ms = now;
    a.view.heartbeats++;
    a.view.leaving = req.leaving();
    std::vector<WorkerProcess> listed;
    listed.reserve(req.workers_size());
    for (const WorkerProcess& w : req.workers()) {
      if (!left_out.count(w.worker_id())) listed.push_back(w);
    }
    IndexWorkers(req.agent_id(), a.view.workers, listed);
    a.view.workers = std::move(listed);
    if (req.has_node_metrics()) {
      metrics = req.node_metrics();
      metrics->set_node(req.node());
      a.view.last_metrics = metrics;
    }
    for (const WorkerExit& e : req.exits()) {
      if (e.seq() <= a.exits_acked_through) continue;  // already recorded (a resend)
      exits_.push_back(e);
      if (exits_.size() > options_.max_exits_kept) exits_.pop_front();
      a.exits_acked_through = e.seq();
      metrics_->exits.Increment();
    }
    for (const CommandAck& ack : req.acks()) RecordAck(a, ack);
    TrimFinished();
    metrics_->heartbeats.Increment();

    reply->set_registered(registered);
    reply->set_exits_acked_through(a.exits_acked_through);
    reply->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
    for (const std::string& id : a.pending) {
      CommandStatus& c = commands_.at(id);
      if (c.delivered_ms == 0) c.delivered_ms = now;
      c.deliveries++;
      *reply->add_commands() = c.command;
    }
    a.view.pending_commands = a.pending.size();
  }
  if (metrics) {
    absl::MutexLock l(&sink_mu_);
    if (sink_) sink_(*metrics);
  }
  return absl::OkStatus();
}

void AgentRegistry::IndexWorkers(const std::string& agent_id,
                                 const std::vector<WorkerProcess>& old_workers,
                                 const std::vector<WorkerProcess>& new_workers) {
  for (const WorkerProcess& w : old_workers) {
    auto it = supervisors_.find(w.worker_id());
    if (it == supervisors_.end()) continue;
    it->second.erase(agent_id);
    if (it->second.empty()) supervisors_.erase(it);
  }
  for (const WorkerProcess& w : new_workers) supervisors_[w.worker_id()].insert(agent_id);
}

bool AgentRegistry::EvictOneLost() {
  // A lost agent with nothing pending first; else the one silent longest, whose pending commands
  // are refused (it would never have received them).
  auto victim = agents_.end();
  for (auto it = agents_.begin(); it != agents_.end(); ++it) {
    if (!IsLost(it->second.view)) continue;
    if (it->second.pending.empty()) {
      victim = it;
      break;
    }
    if (victim == agents_.end() ||
        it->second.view.last_heartbeat_ms < victim->second.view.last_heartbeat_ms) {
      victim = it;
    }
  }
  if (victim == agents_.end()) return false;
  PACER_LOG(INFO) << "agent table full: forgetting lost agent " << victim->first << " ("
                  << victim->second.pending.size() << " pending commands refused)";
  for (const std::string& id : victim->second.pending) {
    CommandStatus& c = commands_.at(id);
    c.state = CommandState::kRefused;
    c.reason = "the agent was lost and forgotten (agent table full)";
    c.acked_ms = clock_->NowMs();
    metrics_->refused.Increment();
    finished_order_.push_back(id);
  }
  IndexWorkers(victim->first, victim->second.view.workers, {});
  agents_.erase(victim);
  TrimFinished();
  return true;
}

absl::StatusOr<AgentRegistry::AgentEntry*> AgentRegistry::AgentOfWorker(
    const std::string& worker_id) {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker_id is required");
  AgentEntry* found = nullptr;
  if (auto sup = supervisors_.find(worker_id); sup != supervisors_.end()) {
    for (const std::string& id : sup->second) {
      AgentEntry& a = agents_.at(id);
      // Prefer a live agent when a stale one still lists the worker (after a migration).
      if (found == nullptr || (IsLost(found->view) && !IsLost(a.view))) found = &a;
    }
  }
  if (found == nullptr) {
    return absl::NotFoundError("no agent supervises worker '" + worker_id + "'");
  }
  return found;
}

absl::StatusOr<AgentRegistry::AgentEntry*> AgentRegistry::AgentOnNode(const std::string& node) {
  if (node.empty()) return absl::InvalidArgumentError("node is required");
  AgentEntry* found = nullptr;
  for (auto& [id, a] : agents_) {
    if (a.view.node != node) continue;
    if (found == nullptr || (IsLost(found->view) && !IsLost(a.view))) found = &a;
  }
  if (found == nullptr) return absl::NotFoundError("no agent on node '" + node + "'");
  return found;
}

absl::StatusOr<std::string> AgentRegistry::Enqueue(const std::string& agent_id,
                                                   AgentCommand command) {
  const std::string id = absl::StrFormat("%016x-%d", nonce_, next_seq_++);
  command.set_command_id(id);
  CommandStatus c;
  c.command_id = id;
  c.agent_id = agent_id;
  c.command = command;
  c.queued_ms = clock_->NowMs();
  commands_[id] = std::move(c);
  AgentEntry& a = agents_.at(agent_id);
  a.pending.push_back(id);
  a.view.pending_commands = a.pending.size();
  metrics_->queued.Increment();
  PACER_LOG(INFO) << "queued command " << id << " for agent " << agent_id << ": "
                  << command.ShortDebugString();
  return id;
}

absl::StatusOr<std::string> AgentRegistry::RestartWorker(const std::string& worker_id) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(AgentEntry * a, AgentOfWorker(worker_id));
  AgentCommand c;
  c.mutable_restart_worker()->set_worker_id(worker_id);
  return Enqueue(a->view.agent_id, std::move(c));
}

absl::StatusOr<std::string> AgentRegistry::StopWorker(const std::string& worker_id) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(AgentEntry * a, AgentOfWorker(worker_id));
  AgentCommand c;
  c.mutable_stop()->set_worker_id(worker_id);
  return Enqueue(a->view.agent_id, std::move(c));
}

absl::StatusOr<std::string> AgentRegistry::StopAllWorkers(const std::string& node) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(AgentEntry * a, AgentOnNode(node));
  AgentCommand c;
  c.mutable_stop()->set_all(true);
  return Enqueue(a->view.agent_id, std::move(c));
}

absl::StatusOr<std::string> AgentRegistry::Migrate(const std::string& node,
                                                   const std::string& reason) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(AgentEntry * a, AgentOnNode(node));
  AgentCommand c;
  c.mutable_migrate()->set_reason(reason);
  return Enqueue(a->view.agent_id, std::move(c));
}

absl::StatusOr<std::string> AgentRegistry::SetContention(const std::string& worker_id,
                                                         double factor) {
  if (!(factor > 1.0 && factor <= 100.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("contention factor must be in (1, 100], not %g", factor));
  }
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(AgentEntry * a, AgentOfWorker(worker_id));
  AgentCommand c;
  c.mutable_set_contention()->set_worker_id(worker_id);
  c.mutable_set_contention()->set_factor(factor);
  return Enqueue(a->view.agent_id, std::move(c));
}

absl::StatusOr<std::string> AgentRegistry::ClearContention(const std::string& node,
                                                           const std::string& worker_id) {
  absl::MutexLock l(&mu_);
  AgentEntry* a = nullptr;
  if (!worker_id.empty()) {
    ASSIGN_OR_RETURN(a, AgentOfWorker(worker_id));
    if (!node.empty() && a->view.node != node) {
      return absl::InvalidArgumentError("worker '" + worker_id + "' is not on node '" + node + "'");
    }
  } else {
    ASSIGN_OR_RETURN(a, AgentOnNode(node));
  }
  AgentCommand c;
  c.mutable_clear_contention()->set_worker_id(worker_id);
  return Enqueue(a->view.agent_id, std::move(c));
}

void AgentRegistry::SetNodeMetricsSink(NodeMetricsSink sink) {
  absl::MutexLock l(&sink_mu_);
  sink_ = std::move(sink);
}

absl::StatusOr<CommandStatus> AgentRegistry::Command(const std::string& command_id) const {
  absl::MutexLock l(&mu_);
  auto it = commands_.find(command_id);
  if (it == commands_.end()) return absl::NotFoundError("unknown command '" + command_id + "'");
  return it->second;
}

std::vector<AgentView> AgentRegistry::Agents() const {
  absl::MutexLock l(&mu_);
  std::vector<AgentView> out;
  for (const auto& [id, a] : agents_) {
    out.push_back(a.view);
    out.back().lost = IsLost(a.view);
  }
  return out;
}

absl::StatusOr<AgentView> AgentRegistry::AgentForNode(const std::string& node) const {
  auto* self = const_cast<AgentRegistry*>(this);  // AgentOnNode only reads
  absl::MutexLock l(&self->mu_);
  ASSIGN_OR_RETURN(AgentEntry * a, self->AgentOnNode(node));
  AgentView v = a->view;
  v.lost = IsLost(v);
  return v;
}

absl::StatusOr<WorkerProcess> AgentRegistry::Worker(const std::string& worker_id) const {
  auto* self = const_cast<AgentRegistry*>(this);  // AgentOfWorker only reads
  absl::MutexLock l(&self->mu_);
  ASSIGN_OR_RETURN(AgentEntry * a, self->AgentOfWorker(worker_id));
  for (const WorkerProcess& w : a->view.workers) {
    if (w.worker_id() == worker_id) return w;
  }
  return absl::NotFoundError("worker '" + worker_id + "'");
}

std::optional<std::string> AgentRegistry::LiveAgentNodeOf(const std::string& worker_id) const {
  absl::MutexLock l(&mu_);
  auto sup = supervisors_.find(worker_id);
  if (sup == supervisors_.end()) return std::nullopt;
  for (const std::string& id : sup->second) {
    const AgentView& a = agents_.at(id).view;
    if (!a.leaving && !IsLost(a)) return a.node;
  }
  return std::nullopt;
}

std::vector<WorkerExit> AgentRegistry::Exits() const {
  absl::MutexLock l(&mu_);
  return {exits_.begin(), exits_.end()};
}

}  // namespace pacer
