// Pacerd: the per-job control-plane server, embeddable (tests, the demo) or run by main.cc.
//
// Owns the data dir's identity (data_dir_identity.h), the sharding service, the monitor, the agent registry, the controller's reconcile
// loop, the rendezvous store of the collective backends (soft state), their gRPC
// server, the metrics endpoint and a housekeeping thread that expires silent workers' leases,
// closes monitor windows and reconciles. Start() binds (port 0 = the OS picks) and returns once
// serving; Shutdown() (or the destructor) stops accepting, finishes in-flight calls and flushes
// the journal.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_registry.h"
#include "agent/grpc_agent_service.h"
#include "cmd/pacerd/contention_switch_service.h"
#include "cmd/pacerd/data_dir_identity.h"
#include "cmd/pacerd/reconciler_sources.h"
#include "cmd/pacerd/worker_session_service.h"
#include "cmd/pacerd/pacerd_action_sink.h"
#include "cmd/pacerd/pacerd_metrics.h"
#include "cmd/pacerd/pacerd_worker_directory.h"
#include "cmd/pacerd/operator_service.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/net.h"
#include "common/tls.h"
#include "controller/grpc_controller_service.h"
#include "controller/reconciler.h"
#include "journal/etcd_client.h"
#include "journal/etcd_election.h"
#include "journal/journal_metrics.h"
#include "monitor/grpc_monitor_service.h"
#include "monitor/monitor_service.h"
#include "rendezvous/grpc_rendezvous_service.h"
#include "rendezvous/rendezvous_service.h"
#include "sharding_service/grpc_sharding_service.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

struct PacerdOptions {
  std::string data_dir = "pacer-data";
  std::string listen = "127.0.0.1:7070";
  std::string metrics_listen = "127.0.0.1:9470";  // empty: no metrics endpoint
  std::string job_token;    // empty: read or create <data_dir>/job.token
  std::string admin_token;  // empty: read or create <data_dir>/admin.token
  std::string tls_cert, tls_key, tls_client_ca;  // TLS when cert+key are set; mTLS with a CA
  int tls_reload_s = 10;  // the TLS files are re-read this often (common/tls.h), >= 1
  bool allow_insecure = false;  // plaintext on a non-loopback address
  ShardingServiceOptions sharding;
  MonitorOptions monitor;     // detection thresholds are taken from the policy
  std::string policy_file;    // empty: the "none" policy (observe, never act)
  ReconcilerOptions reconciler;
  AgentRegistryOptions agents;
  RendezvousOptions rendezvous;  // the store's limits
  // The housekeeping thread: HousekeepingStep() on a real-time timer. Tests that drive a
  // SimulatedClock turn it off and call HousekeepingStep() themselves, so nothing races their
  // script (tests/testing/pacerd_harness.h).
  bool housekeeping = true;
  // The housekeeping thread's period; 0: lease_timeout_ms / 8, within [50 ms, 1 s]. A
  // classification change does not wait for it: the thread reconciles at once.
  int64_t housekeeping_period_ms = 0;
  // The operator knowingly accepts a data loss (--accept-data-loss): a damaged or missing journal
  // or controller store that the data dir's IDENTITY says existed, or a journal shorter than its
  // high-water mark, is accepted instead of refused; logged at WARNING, audited (`pacerctl
  // actions`, policy "operator"), appended to <data-dir>/DATA-LOSS-ACCEPTED and counted in
  // pacer_data_loss_accepted_total. See docs/journal-integrity.md.
  bool accept_data_loss = false;
  // How often the housekeeping thread tries to reopen a failed journal (a full disk).
  int64_t journal_retry_ms = 1000;
  // Where both journals live. Empty: RocksDB in data_dir, one pacerd per job.
  // "etcd://host:port[,host:port...]/PREFIX" (etcds:// with TLS): in etcd under PREFIX, and
  // several pacerds of the job elect one leader there; the others wait as standbys and take over
  // when it fails (docs/ha.md). `etcd` holds TLS and authentication (its endpoints come from here).
  std::string journal;
  EtcdClientOptions etcd;
  std::string advertise;       // the address the leader names to others (default: where it serves)
  int64_t election_ttl_s = 2;  // the leader's lease TTL in etcd (>= 2)
  // Called once when this pacerd stops leading (its lease lapsed, or a write was fenced: another
  // leads). Null: pacerd logs and ends the process at once (exit code 75), so that a deposed
  // leader serves nothing more and its supervisor starts it again as a standby.
  std::function<void(const std::string& why)> on_leadership_lost;
  // An embedder's sink told of every action pacerd carried out, after pacerd's own sink and
  // with the same context; null: none. The differential test's model carries pacerd's decisions
  // out through it (tests/testing/pacerd_control_plane.h). Must outlive pacerd.
  ActionSink* also_carry = nullptr;
};

class Pacerd {
 public:
  static absl::StatusOr<std::unique_ptr<Pacerd>> Start(PacerdOptions options,
                                                       const Clock* clock = RealClock::Get());
  ~Pacerd();

  void Shutdown();
  void Wait();  // until Shutdown()
  // A housekeeping step (tests without the thread call it too): publishes the journal's health
  // on gRPC health (grpc.health.v1: NOT_SERVING while updates are refused) and both journals'
  // metrics (pacer_journal_*{journal="sharding"|"controller"}), and reopens a failed sharding
  // journal at most every journal_retry_ms, so a full disk resumes by itself once space returns
  // (the controller reopens its own before its next decision: controller/reconciler.h).
  void CheckJournal();
  // One round of housekeeping, what the thread runs every period: CheckJournal, the expiry of
  // silent workers' leases (returns how many expired), the leases of workers their agents gave
  // up on (LoseAbandonedWorkers), the monitor's window close (Tick), a
  // reconcile when due (or poked), metrics and the operator timeline's sample, and every
  // kHeapReleaseIntervalMs the heap's free pages handed back to the system (ReleaseFreeHeap).
  int HousekeepingStep();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const;
  const std::string& job_token() const { return job_token_; }
  const std::string& admin_token() const { return admin_token_; }
  ShardingServiceImpl* sharding() { return sharding_.get(); }
  // What a worker's sharding requests reach (the gRPC adapter serves it): heartbeats and
  // registrations answered with the control plane's part. In-process drivers call this one.
  WorkerSessionService* worker_sessions() { return worker_sessions_.get(); }
  MonitorServiceImpl* monitor() { return monitor_.get(); }
  Reconciler* reconciler() { return reconciler_.get(); }
  WorkerSessions* sessions() { return sessions_.get(); }
  AgentRegistry* agents() { return agents_.get(); }
  RendezvousServiceImpl* rendezvous() { return rendezvous_.get(); }
  MetricsRegistry* metrics() { return &metrics_; }
  // With --journal etcd://: the election this pacerd won (null otherwise).
  EtcdElection* election() { return election_.get(); }

 private:
  Pacerd() = default;
  void Housekeeping();

  // Start's stages, in order.
  struct DataDir {
    std::optional<DataDirIdentity> identity;  // none: a fresh dir, or one from before identities
    std::vector<std::string> accepted;        // losses the operator accepted, in words
    bool Lists(const char* store) const { return identity && identity->Has(store); }
  };
  struct Policy {
    PolicyConfig config;  // default: "none"
    std::string text;     // the --policy file's text (identifies it for the controller store)
  };
  static TlsServerOptions TlsOptionsOf(const PacerdOptions& options);
  // The data dir, the tokens and the data dir's identity.
  absl::StatusOr<DataDir> OpenDataDir();
  // With --journal etcd://: connects to etcd and campaigns, blocking as a standby until this
  // pacerd leads; then both journals open in etcd, fenced by the election.
  absl::Status Elect(const HostPort& listen);
  // After Serve: the leader's address in the election, now that the port is known.
  void Proclaim();
  // Operator.GetServer: the journal's home, the leader and the standbys.
  void ServerInfo(GetServerResponse* resp);
  // A hot standby caught up to `applied` (`behind` updates in that round): gauges and its
  // progress key in etcd.
  void Followed(uint64_t applied, uint64_t behind);
  // Metrics, the sharding service (its journal replayed), the policy, the monitor, the agent
  // registry, rendezvous and their gRPC services.
  absl::StatusOr<Policy> OpenComponents(const DataDir& dir);
  // The controller, the worker sessions, the action sink and the reconciler.
  absl::Status BuildControlLoop(const PolicyConfig& policy, const PacerdOptions& options);
  // The controller's journal, restored into the reconciler.
  absl::Status OpenControllerStore(DataDir* dir, const std::string& policy_text);
  // IDENTITY for a data dir without one; the losses accepted, recorded and audited.
  absl::Status RecordIdentityAndLosses(DataDir* dir);
  // The worker-session service (heartbeat replies, registrations, audit) and the sharding
  // service's gRPC adapter on it; the monitor's step and event observers.
  void WireWorkerSessions();
  absl::Status Serve(const HostPort& listen, const std::shared_ptr<grpc::ServerCredentials>& creds);

  PacerdOptions options_;
  const Clock* clock_ = nullptr;
  MetricsRegistry metrics_;
  std::unique_ptr<PacerdMetrics> pacerd_metrics_;  // before the components: its help texts win
  std::string job_token_, admin_token_;
  std::unique_ptr<Authenticator> auth_;
  // Before the journals that write through them (destroyed after them).
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<EtcdElection> election_;
  std::string etcd_prefix_;
  std::thread campaign_;                        // the election, beside the journals' open
  std::shared_future<absl::Status> elected_;    // its outcome
  std::atomic<double> won_s_{0};  // when the election was won (monotonic seconds)
  int64_t last_follow_put_ms_ = 0;
  std::atomic<double> takeover_s_{0};  // from winning to serving (read by Operator.GetServer)
  decltype(JournalOptions::open_log) controller_open_log_;  // the controller's journal in etcd
  std::unique_ptr<ShardingServiceImpl> sharding_;
  std::unique_ptr<GrpcShardingService> sharding_grpc_;
  std::unique_ptr<MonitorServiceImpl> monitor_;
  std::unique_ptr<GrpcMonitorService> monitor_grpc_;
  std::unique_ptr<AgentRegistry> agents_;  // feeds the monitor: destroyed before it
  std::unique_ptr<PacerdWorkerDirectory> directory_;  // reads sharding_ and agents_
  std::unique_ptr<GrpcAgentService> agents_grpc_;
  std::unique_ptr<ContentionSwitchService> contention_grpc_;  // admin: pacerctl contention
  std::unique_ptr<WorkerSessions> sessions_;   // the controller's side of each heartbeat
  std::unique_ptr<PlannedFetchRates> planned_rates_;  // sessions_' plans, to sharding_'s fetches
  std::unique_ptr<PacerdActionSink> sink_;     // carries out the reconciler's actions
  // What the reconciler reads: the monitor, the sharding service and the agents as its sources.
  std::unique_ptr<MonitorSpeedSource> speeds_;
  std::unique_ptr<ShardingLeaseSource> leases_;
  std::unique_ptr<AgentRestartSource> restarts_;
  std::unique_ptr<Reconciler> reconciler_;
  std::unique_ptr<StepsToReconciler> steps_to_reconciler_;  // the monitor's step observer
  // Heartbeats and registrations (the sharding part, then the control plane's), the gRPC
  // sharding service's implementation.
  std::unique_ptr<WorkerSessionService> worker_sessions_;
  std::unique_ptr<GrpcControllerService> controller_grpc_;
  std::unique_ptr<OperatorService> operator_grpc_;  // pacerctl status / agents / report
  std::unique_ptr<RendezvousServiceImpl> rendezvous_;
  std::unique_ptr<GrpcRendezvousService> rendezvous_grpc_;
  std::unique_ptr<grpc::Server> server_;
  std::string host_;
  int port_ = 0;
  int metrics_port_ = 0;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A classification changed: the housekeeping thread reconciles now.
  bool reconcile_wanted_ ABSL_GUARDED_BY(mu_) = false;
  std::thread housekeeping_;
  // The journals' series (journal/journal_metrics.h): the sharding core's and the controller's.
  std::unique_ptr<JournalMetrics> journal_metrics_;
  std::unique_ptr<JournalObserver> sharding_journal_, controller_journal_;
  absl::Mutex journal_check_mu_;  // CheckJournal() may run on the thread and in a test
  int64_t last_journal_retry_ms_ ABSL_GUARDED_BY(journal_check_mu_) = 0;
  bool journal_was_healthy_ ABSL_GUARDED_BY(journal_check_mu_) = true;
  // Returns the allocator's free pages to the system (malloc_trim), at most once an interval.
  void ReleaseFreeHeap();
  // A worker its agent reports FAILED (crashed past the restart limit: nothing will start it
  // again), or EXITED with no process by an agent that is leaving (it gave up on the group, or
  // migrates), is lost at once if it still holds leases, their records back in the queue
  // (ShardingServiceImpl::LoseGoneWorker), instead of holding them until they expire. Once per
  // failure: keyed by the agent's incarnation and the worker's restart counts.
  void LoseAbandonedWorkers();
  absl::Mutex abandoned_mu_;
  // worker -> the failure handled
  std::map<std::string, std::string> abandoned_handled_ ABSL_GUARDED_BY(abandoned_mu_);
  static constexpr int64_t kHeapReleaseIntervalMs = 10'000;
  std::atomic<int64_t> last_heap_release_ms_{0};
};

}  // namespace pacer
