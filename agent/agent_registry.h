// AgentRegistry: pacerd's side of the node agents (docs/design.md §5), the service layer behind the
// thin gRPC adapter (grpc_agent_service.h).
//
// Owns, in memory: every agent incarnation that has sent a heartbeat, the worker processes each
// one reports, the recent worker exits, and the command queue per agent with each command's
// outcome. Nothing is journaled: after a pacerd restart the agents re-register with their next
// heartbeat (the first heartbeat of an unknown incarnation registers it) and resend every exit
// not yet acknowledged, so the view is complete again within one interval. Commands queued but
// not acknowledged before a pacerd restart are lost with it (the controller re-decides).
//
// Command protocol: see the walk-through at the top of proto/pacer/agent.proto. Command ids are
// "<nonce>-<seq>": the nonce is drawn once per registry (options.id_nonce, injected for tests),
// so ids never repeat across pacerd restarts and an agent never mistakes a new command for a
// replay.
//
// Validation: a malformed heartbeat (empty node / agent id, zero incarnation, duplicate or
// empty worker ids, an unknown state, a worker id held by another live agent) is refused with
// INVALID_ARGUMENT or FAILED_PRECONDITION and changes nothing; a heartbeat from an incarnation
// older than the known one (a zombie agent) is refused with FAILED_PRECONDITION. Controller
// calls for unknown workers / nodes are refused with NOT_FOUND, bad arguments with
// INVALID_ARGUMENT; neither queues anything.
//
// Thread-safety: all methods are thread-safe (one mutex). The node-metrics sink runs on the
// calling RPC thread after the mutex is released, one call per heartbeat that carries metrics.
// Time comes from the injected Clock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "proto/pacer/agent.pb.h"

namespace pacer {

struct AgentRegistryOptions {
  uint32_t heartbeat_interval_ms = 1000;  // suggested to agents in every reply
  int64_t agent_timeout_ms = 10'000;      // an agent silent this long is reported lost
  uint64_t id_nonce = 0;                  // 0: drawn from /dev/urandom
  size_t max_exits_kept = 4096;           // recent exits kept for Exits()
  size_t max_finished_commands_kept = 4096;
  // Limits a heartbeat can reach (RESOURCE_EXHAUSTED / INVALID_ARGUMENT past them). When the table
  // is full, a new agent takes the place of a lost one with no pending command, if there is one.
  size_t max_agents = 4096;
  size_t max_workers_per_agent = 1024;
  size_t max_exits_per_heartbeat = 4096;
  size_t max_acks_per_heartbeat = 4096;
};

enum class CommandState { kPending, kDone, kRefused };
const char* CommandStateName(CommandState s);

struct CommandStatus {
  std::string command_id;
  std::string agent_id;
  AgentCommand command;
  CommandState state = CommandState::kPending;
  std::string reason;       // from the agent's ack when refused or failed
  bool duplicate_ack = false;
  int64_t queued_ms = 0;
  int64_t delivered_ms = 0;  // first handed out in a reply; 0 = not yet
  int64_t acked_ms = 0;
  uint32_t deliveries = 0;   // replies that carried it
};

struct AgentView {
  std::string agent_id;
  std::string node;
  std::string job;
  uint64_t incarnation = 0;
  int64_t registered_ms = 0;  // first heartbeat of this incarnation
  int64_t last_heartbeat_ms = 0;
  bool lost = false;          // silent for longer than agent_timeout_ms
  bool leaving = false;
  uint64_t heartbeats = 0;
  uint32_t registrations = 0; // how many times this agent id (re)registered with this registry
  std::vector<WorkerProcess> workers;
  std::optional<NodeMetrics> last_metrics;
  size_t pending_commands = 0;
};

class AgentRegistry {
 public:
  using NodeMetricsSink = std::function<void(const NodeMetrics&)>;

  // `clock` must outlive the registry; `metrics` may be null.
  AgentRegistry(AgentRegistryOptions options, const Clock* clock, MetricsRegistry* metrics = nullptr);
  ~AgentRegistry();

  // ---- RPC ----
  // `left_out`: listed workers the agent may not supervise yet (for an agent credential, those
  // not registered on its node: the gRPC adapter's rule, docs/security.md). The heartbeat is
  // validated whole, then recorded without them: they neither count as supervised nor keep
  // another agent from listing them.
  absl::Status Heartbeat(const AgentHeartbeat& req, AgentHeartbeatReply* reply,
                         const std::set<std::string>& left_out = {});

  // ---- in-process API (pacerd, controller) ----
  // Each queues one command for the agent that supervises the worker / runs on the node and
  // returns its id.
  absl::StatusOr<std::string> RestartWorker(const std::string& worker_id);
  absl::StatusOr<std::string> StopWorker(const std::string& worker_id);
  absl::StatusOr<std::string> StopAllWorkers(const std::string& node);
  absl::StatusOr<std::string> Migrate(const std::string& node, const std::string& reason);
  absl::StatusOr<std::string> SetContention(const std::string& worker_id, double factor);
  // Empty worker_id: every worker of `node`.
  absl::StatusOr<std::string> ClearContention(const std::string& node,
                                              const std::string& worker_id);

  // Receives each heartbeat's node metrics (replaces any previous sink; null removes it).
  void SetNodeMetricsSink(NodeMetricsSink sink);

  absl::StatusOr<CommandStatus> Command(const std::string& command_id) const;
  std::vector<AgentView> Agents() const;
  absl::StatusOr<AgentView> AgentForNode(const std::string& node) const;
  // The agent currently supervising `worker_id` and the worker's last reported state.
  absl::StatusOr<WorkerProcess> Worker(const std::string& worker_id) const;
  // The node of the live agent (not lost, not leaving) whose last heartbeat lists the worker;
  // nullopt when none does.
  std::optional<std::string> LiveAgentNodeOf(const std::string& worker_id) const;
  // Recent exits in arrival order (bounded by max_exits_kept).
  std::vector<WorkerExit> Exits() const;

 private:
  struct AgentEntry {
    AgentView view;
    uint64_t exits_acked_through = 0;     // of the current incarnation
    std::vector<std::string> pending;     // command ids not yet acknowledged, in queue order
  };
  struct Metrics;

  absl::StatusOr<std::string> Enqueue(const std::string& agent_id, AgentCommand command)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateHeartbeat(const AgentHeartbeat& req, const std::set<std::string>& left_out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The live agent that lists `worker_id`; NOT_FOUND otherwise.
  absl::StatusOr<AgentEntry*> AgentOfWorker(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<AgentEntry*> AgentOnNode(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsLost(const AgentView& v) const;
  void RecordAck(AgentEntry& agent, const CommandAck& ack) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Replaces the workers `agent_id` lists in supervisors_ (old list → new list).
  void IndexWorkers(const std::string& agent_id, const std::vector<WorkerProcess>& old_workers,
                    const std::vector<WorkerProcess>& new_workers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a table slot: forgets one lost agent with no pending command. False when none is.
  bool EvictOneLost() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AgentRegistryOptions options_;
  const Clock* clock_;
  uint64_t nonce_;
  std::unique_ptr<Metrics> metrics_;

  mutable absl::Mutex mu_;
  std::map<std::string, AgentEntry> agents_ ABSL_GUARDED_BY(mu_);  // by agent id
  // worker id → the agents whose last heartbeat lists it (a stale one may still, after a
  // migration): keeps heartbeat validation and AgentOfWorker logarithmic in the table size.
  std::map<std::string, std::set<std::string>> supervisors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CommandStatus> commands_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_order_ ABSL_GUARDED_BY(mu_);  // for trimming commands_
  std::deque<WorkerExit> exits_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;

  absl::Mutex sink_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  NodeMetricsSink sink_ ABSL_GUARDED_BY(sink_mu_);
};

}  // namespace pacer
