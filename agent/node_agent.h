// NodeAgent: the body of `pacer-agent` (docs/design.md §5). One Boost.Asio event loop, run by the
// thread that calls Run(), owns all of the agent's state: the WorkerSupervisor (worker
// processes), the NodeMetricsCollector, the ContentionInjector, the outboxes of exits and
// command acks, and the heartbeat to pacerd. The only other threads are gRPC's: a heartbeat's
// completion is posted back onto the loop, so no state is shared and nothing is locked.
//
// Heartbeat protocol (see proto/pacer/agent.proto for the command walk-through):
//  1. Every interval the loop sends one AgentHeartbeat (node metrics of the last interval not
//     sent yet, every worker's state, unacknowledged exits and acks) and waits for its reply
//     before the next one: at most one call in flight.
//  2. On failure (pacerd down, timeout) the next try waits interval * 2^failures, capped at
//     heartbeat_backoff_max_ms, with +-20 % jitter. Workers keep running and being supervised;
//     exits and acks accumulate in the outboxes.
//  3. On success the acknowledged exits and the acks carried are dropped; `registered` in the
//     reply means pacerd did not know this incarnation (first contact, or pacerd restarted), and
//     the agent logs it as a (re-)registration.
//  4. Each command id is executed at most once per incarnation (a replay is acked with
//     `duplicate`); an invalid command (no action, unknown worker, bad factor, ambiguous stop)
//     is refused with a reason and changes nothing.
//  5. Migrate, plain mode: acked OK, every worker stopped, the ack goes out with the final
//     heartbeat, exit 75. Kubernetes mode: first DELETE the own pod (KubeClient, retried with
//     backoff on 5xx / transport errors); the command stays in flight meanwhile (a replay is
//     not executed twice). Deleted or already gone: as plain mode (the kubelet's SIGTERM for
//     the deleted pod joins the same exit). Refused (401/403/other 4xx, or retries exhausted):
//     acked as failed with the API's reason, the workers keep running, the agent stays.
//     With kubernetes_mark_node the node is labelled first (KubeClient::MarkNode); a refusal
//     there fails the command the same way and the pod is not deleted (its replacement could
//     land on the same node). A 401/403 is not asked again for a while (kube_client.h), so a
//     controller that keeps sending migrate does not turn into a storm of API requests.
//  6. Attach mode (--attach): the workers are a ProcessAttacher instead of a WorkerSupervisor
//     (worker_set.h); restart signals the trainer and waits for its container to start it again,
//     stop is refused, leaving leaves the trainer to the kubelet.
//
// Exit codes of Run(): 0 every worker finished (or SIGTERM/SIGINT stopped them), 3 every worker
// ended and at least one FAILED (restart limit), 75 migrated (told to leave the node).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/contention_injector.h"
#include "agent/kube_client.h"
#include "agent/node_metrics_collector.h"
#include "agent/process_attacher.h"
#include "agent/restart_backoff.h"
#include "agent/worker_supervisor.h"
#include "common/clock.h"
#include "common/tls.h"
#include "proto/pacer/agent.grpc.pb.h"

namespace pacer {

constexpr int kAgentExitOk = 0;
constexpr int kAgentExitWorkersFailed = 3;
constexpr int kAgentExitMigrated = 75;  // EX_TEMPFAIL: "run me somewhere else"

struct NodeAgentOptions {
  std::string address;   // pacerd HOST:PORT; empty = supervise only, no heartbeats
  std::string token;     // job token
  // Each launched worker gets its own credential (common/auth.h) in PACER_TOKEN, minted from the
  // job token — the chief credential for global rank 0 — instead of the job token itself. False:
  // workers inherit `token` (parameter servers, which verify the workers' credentials, need it).
  bool mint_worker_credentials = true;
  // TLS to pacerd (common/tls.h): CA, client certificate and key for mTLS, server name. The
  // workers it launches get the same files in PACER_TLS_* (and PACER_ALLOW_INSECURE when set).
  // Without TLS only a loopback pacerd is dialled unless tls.allow_insecure; main() checks
  // the files, and a failure here logs and fails closed (TLS with the system roots).
  TlsClientOptions tls;
  std::string job = "job";
  std::string node;      // required
  std::string agent_id;  // default: node
  uint32_t num_workers = 1;
  uint32_t first_rank = 0;   // global rank of local worker 0
  uint32_t world_size = 0;   // 0: nnodes * num_workers when nnodes is set, else num_workers
  std::string worker_id_prefix = "w";  // worker i is <prefix><first_rank + i>
  // torchrun's topology (ResolveTopology fills what is not given):
  uint32_t nnodes = 0;       // nodes (agents) of the job; 0: ceil(world_size / num_workers)
  int64_t node_rank = -1;    // GROUP_RANK of this node; -1: first_rank / num_workers
  std::string master_addr;   // MASTER_ADDR; "" : 127.0.0.1 on a single node
  uint32_t master_port = 0;  // MASTER_PORT; 0: a free port picked at every group (re)start
                             // (single node only: nodes cannot agree on a port picked locally)
  std::string run_id;        // TORCHELASTIC_RUN_ID and PACER_RUN_ID; "": the job name
  std::vector<std::string> worker_command;  // {worker_id}, {rank}, {local_rank} substituted
  RestartPolicy restart;
  int64_t heartbeat_interval_ms = 1000;
  int64_t heartbeat_timeout_ms = 3000;
  int64_t heartbeat_backoff_max_ms = 10'000;
  int64_t metrics_interval_ms = 1000;
  ContentionOptions contention;
  std::map<std::string, double> initial_contention;  // worker id -> factor (local demos)
  // Set: Kubernetes mode, migrate deletes the own pod through the API server (kube_client.h)
  // before the workers are stopped. Unset: plain mode, migrate only stops and exits 75.
  std::optional<KubeClientOptions> kubernetes;
  // Kubernetes mode: before deleting the own pod, label the node bad-node.pacer.dev/<job> so
  // that the replacement (whose template requires the label's absence) avoids it.
  bool kubernetes_mark_node = false;
  // Non-empty: attach mode (process_attacher.h) — one worker, the running process whose command
  // line contains this, not started by the agent; worker_command must be empty.
  std::string attach_pattern;
  int64_t attach_poll_ms = 500;
  int64_t attach_restart_timeout_ms = 120'000;
  NodeMetricsSources metrics_sources;
  int stdout_fd = 1, stderr_fd = 2;
};

// Checks and completes the topology: world_size, nnodes, node_rank, run_id (see the fields).
// INVALID_ARGUMENT names the flag when the numbers contradict each other.
absl::Status ResolveTopology(NodeAgentOptions* options);

// True when MASTER_ADDR / MASTER_PORT are set for the workers: always on a single node; on
// several only when both --master-addr and --master-port are given (the same on every node).
bool SetsMasterAddress(const NodeAgentOptions& options);

// The per-worker specs (options resolved by ResolveTopology): ids, ranks, the job environment
// over `base_env`: PACER_ADDR, PACER_JOB, PACER_WORKER_ID, PACER_TOKEN, PACER_NODE,
// PACER_RUN_ID, PACER_RANK, PACER_WORLD_SIZE, PACER_LOCAL_RANK, PACER_LOCAL_WORLD_SIZE, and
// torchrun's worker environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR (SetsMasterAddress),
// TORCHELASTIC_RUN_ID, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE=False.
// MASTER_PORT and TORCHELASTIC_RESTART_COUNT change with every start of the group and are
// added at launch (WorkerSupervisor, NodeAgent's on_group_start).
std::vector<WorkerSpec> BuildWorkerSpecs(const NodeAgentOptions& options,
                                         const std::vector<std::string>& base_env);

// A TCP port free on every IPv4 interface right now (bind port 0, read it, close): what
// torchrun does for --standalone. Another process may take it before the workers bind it.
absl::StatusOr<uint16_t> PickFreePort();

class NodeAgent {
 public:
  // Validates the options. `clock` must outlive the agent.
  static absl::StatusOr<std::unique_ptr<NodeAgent>> Create(NodeAgentOptions options,
                                                           const Clock* clock = RealClock::Get());
  ~NodeAgent();

  // Starts the workers and runs the loop until the agent exits; returns the exit code. Call
  // once, from the thread that will live as long as the workers (their parent-death signal is
  // tied to it). Blocks SIGTERM/SIGINT/SIGCHLD handling into the loop via asio::signal_set.
  int Run();

 private:
  struct HeartbeatCall;
  struct Executed {
    bool finished = false;
    CommandAck ack;
  };

  NodeAgent(NodeAgentOptions options, const Clock* clock);
  void OnSignal(int sig);
  void ReapChildren();
  void CollectMetrics();
  void ScheduleMetrics();
  void ScheduleHeartbeat(int64_t delay_ms);
  void SendHeartbeat(bool final);
  void OnHeartbeatDone(const std::shared_ptr<HeartbeatCall>& call, const grpc::Status& status);
  void HandleCommand(const AgentCommand& cmd);
  // Validates a command against the current workers; the reason when it must be refused.
  std::optional<std::string> Refusal(const AgentCommand& cmd) const;
  void Execute(const AgentCommand& cmd);
  void Acknowledge(const std::string& command_id, absl::Status outcome);
  void CheckFinished();
  // Stops every worker, sends a last heartbeat (leaving) and ends Run() with `code`.
  void BeginExit(int code, const std::string& why);
  void FinishExit();
  void DeleteOwnPod(const std::string& command_id, const std::string& why);
  // The environment of a (re)start of the group: MASTER_PORT (fresh unless --master-port).
  std::vector<std::string> GroupStartEnvironment(uint32_t restart_count);

  NodeAgentOptions options_;
  const Clock* clock_;
  uint64_t incarnation_;
  std::mt19937_64 rng_;

  boost::asio::io_context io_;  // declared first: destroyed last
  boost::asio::signal_set signals_;
  boost::asio::steady_timer heartbeat_timer_;
  boost::asio::steady_timer metrics_timer_;
  std::unique_ptr<NodeMetricsCollector> collector_;
  std::unique_ptr<ContentionInjector> injector_;
  std::unique_ptr<WorkerSet> supervisor_;  // a WorkerSupervisor, or a ProcessAttacher (--attach)
  std::unique_ptr<AgentService::Stub> stub_;
  std::unique_ptr<KubeClient> kube_;  // Kubernetes mode only

  std::deque<WorkerExit> exits_outbox_;
  std::vector<CommandAck> acks_outbox_;
  std::map<std::string, Executed> executed_;  // by command id
  std::deque<std::string> executed_order_;    // for bounding executed_
  std::optional<NodeMetrics> unsent_metrics_;
  // CPU cores each worker used in the last few metrics intervals (~2 s): the baseline a
  // contention factor applies to.
  std::map<std::string, std::deque<double>> recent_cores_;
  double RecentCores(const std::string& worker_id) const;

  std::shared_ptr<HeartbeatCall> in_flight_;
  uint32_t heartbeat_failures_ = 0;
  uint32_t registrations_ = 0;
  bool connected_ = false;

  uint16_t last_master_port_ = 0;

  std::optional<int> exit_code_;  // set once the agent is leaving
  bool stopping_workers_ = false;
  bool final_heartbeat_sent_ = false;
  bool done_ = false;
};

}  // namespace pacer
