#include "agent/node_agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <iostream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "agent/child_process.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/reconnect.h"

namespace pacer {

constexpr size_t kMaxExitsKept = 10'000;
constexpr size_t kMaxExecutedKept = 4096;

// One heartbeat RPC. `done` is set by gRPC's callback thread under `mu`, after the completion
// is posted to the loop, so ~NodeAgent can wait for a cancelled call to let go of the loop. Owned
// by in_flight_ and the loop's completion handler, never last by gRPC's thread.
struct NodeAgent::HeartbeatCall {
  grpc::ClientContext ctx;
  AgentHeartbeat req;
  AgentHeartbeatReply reply;
  size_t acks_sent = 0;
  bool final = false;
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
};

absl::Status ResolveTopology(NodeAgentOptions* o) {
  if (o->num_workers == 0) return absl::InvalidArgumentError("--workers must be at least 1");
  if (o->world_size == 0) o->world_size = o->nnodes ? o->nnodes * o->num_workers : o->num_workers;
  if (o->first_rank + o->num_workers > o->world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ranks %d..%d (--first-rank, --workers) do not fit world size %d", o->first_rank,
        o->first_rank + o->num_workers - 1, o->world_size));
  }
  if (o->nnodes == 0) o->nnodes = (o->world_size + o->num_workers - 1) / o->num_workers;
  if (o->node_rank < 0) o->node_rank = o->first_rank / o->num_workers;
  if (o->node_rank >= static_cast<int64_t>(o->nnodes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--node-rank %d must be below --nnodes %d", o->node_rank, o->nnodes));
  }
  if (o->run_id.empty()) o->run_id = o->job;
  return absl::OkStatus();
}

bool SetsMasterAddress(const NodeAgentOptions& o) {
  return o.nnodes <= 1 || (!o.master_addr.empty() && o.master_port != 0);
}

absl::StatusOr<uint16_t> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(std::string("socket: ") + strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string err = strerror(errno);
    close(fd);
    return absl::UnavailableError("bind to port 0: " + err);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// The PACER_TOKEN a worker is launched with: its own credential, or the agent's token.
std::string WorkerToken(const NodeAgentOptions& o, const WorkerSpec& s) {
  if (!o.mint_worker_credentials || o.token.empty()) return o.token;
  auto c = MintCredential(o.token, s.rank == 0 ? CredentialKind::kChief : CredentialKind::kWorker,
                          s.worker_id);
  return c.ok() ? *c : std::string();  // Create() has checked that minting works
}

std::vector<WorkerSpec> BuildWorkerSpecs(const NodeAgentOptions& o,
                                         const std::vector<std::string>& base_env) {
  const uint32_t world = o.world_size ? o.world_size : o.num_workers;
  const std::string nnodes = std::to_string(std::max<uint32_t>(o.nnodes, 1));
  const std::string node_rank = std::to_string(std::max<int64_t>(o.node_rank, 0));
  std::vector<WorkerSpec> specs;
  for (uint32_t i = 0; i < o.num_workers; ++i) {
    WorkerSpec s;
    s.rank = o.first_rank + i;
    s.local_rank = i;
    s.worker_id = o.worker_id_prefix + std::to_string(s.rank);
    std::map<std::string, std::string> ours = {
        {"PACER_ADDR", o.address},
        {"PACER_JOB", o.job},
        {"PACER_WORKER_ID", s.worker_id},
        {"PACER_TOKEN", WorkerToken(o, s)},
        {"PACER_NODE", o.node},
        {"PACER_RUN_ID", o.run_id.empty() ? o.job : o.run_id},
        {"PACER_RANK", std::to_string(s.rank)},
        {"PACER_WORLD_SIZE", std::to_string(world)},
        {"PACER_LOCAL_RANK", std::to_string(i)},
        {"PACER_LOCAL_WORLD_SIZE", std::to_string(o.num_workers)},
        // torchrun's worker environment (torch.distributed.elastic's LocalElasticAgent).
        {"RANK", std::to_string(s.rank)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(i)},
        {"LOCAL_WORLD_SIZE", std::to_string(o.num_workers)},
        {"GROUP_RANK", node_rank},
        {"GROUP_WORLD_SIZE", nnodes},
        {"ROLE_NAME", "default"},
        {"ROLE_RANK", std::to_string(s.rank)},
        {"ROLE_WORLD_SIZE", std::to_string(world)},
        {"TORCHELASTIC_RUN_ID", o.run_id.empty() ? o.job : o.run_id},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.restart.max_restarts)},
        {"TORCHELASTIC_USE_AGENT_STORE", "False"},  // the workers' own TCPStore at MASTER_*
    };
    // TLS to pacerd: the agent's files (main() made the paths absolute).
    const std::pair<const char*, const std::string*> tls_env[] = {
        {"PACER_TLS_CA", &o.tls.ca_file}, {"PACER_TLS_CERT", &o.tls.cert_file},
        {"PACER_TLS_KEY", &o.tls.key_file}, {"PACER_TLS_SERVER_NAME", &o.tls.server_name}};
    for (const auto& [name, value] : tls_env) {
      if (!value->empty()) ours[name] = *value;
    }
    if (o.tls.allow_insecure) ours["PACER_ALLOW_INSECURE"] = "1";
    if (SetsMasterAddress(o)) {
      ours["MASTER_ADDR"] = o.master_addr.empty() ? "127.0.0.1" : o.master_addr;
    }
    for (const std::string& kv : base_env) {
      if (!ours.count(kv.substr(0, kv.find('=')))) s.env.push_back(kv);
    }
    for (const auto& [k, v] : ours) s.env.push_back(k + "=" + v);
    for (const std::string& a : o.worker_command) {
      s.argv.push_back(absl::StrReplaceAll(a, {{"{worker_id}", s.worker_id},
                                                {"{rank}", std::to_string(s.rank)},
                                                {"{local_rank}", std::to_string(i)}}));
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

std::vector<std::string> NodeAgent::GroupStartEnvironment(uint32_t restart_count) {
  if (!SetsMasterAddress(options_)) return {};
  uint16_t port = static_cast<uint16_t>(options_.master_port);
  if (port == 0) {
    auto p = PickFreePort();
    // A new group gets a new port (a survivor of the old one may still hold the old port).
    for (int i = 0; i < 8 && p.ok() && *p == last_master_port_; ++i) p = PickFreePort();
    if (p.ok()) {
      port = *p;
    } else {
      port = last_master_port_ ? last_master_port_ : 29500;  // torchrun's default port
      PACER_LOG(ERROR) << "no free port for MASTER_PORT (" << p.status().message() << "): using "
                       << port;
    }
  }
  last_master_port_ = port;
  PACER_LOG(INFO) << "group start " << restart_count << " (TORCHELASTIC_RESTART_COUNT=" << restart_count
                  << "): MASTER_ADDR=" << (options_.master_addr.empty() ? "127.0.0.1" : options_.master_addr)
                  << " MASTER_PORT=" << port;
  return {"MASTER_PORT=" + std::to_string(port)};
}

absl::StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Create(NodeAgentOptions options,
                                                              const Clock* clock) {
  if (options.node.empty()) return absl::InvalidArgumentError("node name is required");
  if (!options.attach_pattern.empty()) {
    if (!options.worker_command.empty()) {
      return absl::InvalidArgumentError("--attach and a worker command after -- exclude each other");
    }
    if (options.num_workers != 1) {
      return absl::InvalidArgumentError("--attach watches one process: --workers must be 1");
    }
    if (options.attach_poll_ms <= 0 || options.attach_restart_timeout_ms <= 0) {
      return absl::InvalidArgumentError("--attach-poll-ms and --attach-restart-timeout-ms must be > 0");
    }
    if (!options.initial_contention.empty()) {
      return absl::InvalidArgumentError("--contention at start is for launched workers, not --attach");
    }
  } else if (options.worker_command.empty()) {
    return absl::InvalidArgumentError("no worker command (or --attach PATTERN)");
  }
  if (options.kubernetes_mark_node) {
    if (!options.kubernetes) return absl::InvalidArgumentError("--k8s-mark-node needs --kubernetes");
    if (absl::Status s = BadNodeLabelKey(options.job).status(); !s.ok()) {
      return absl::InvalidArgumentError("--k8s-mark-node: " + std::string(s.message()));
    }
    if (options.kubernetes->node_name.empty()) {
      return absl::InvalidArgumentError(
          "--k8s-mark-node: no node name: set NODE_NAME from the downward API (fieldRef "
          "spec.nodeName) or pass --k8s-node-name");
    }
  }
  if (options.num_workers == 0) return absl::InvalidArgumentError("need at least one worker");
  if (absl::Status s = ResolveTopology(&options); !s.ok()) return s;
  if (options.master_port > 65535) {
    return absl::InvalidArgumentError("--master-port must be in 1..65535");
  }
  if (options.heartbeat_interval_ms <= 0 || options.metrics_interval_ms <= 0) {
    return absl::InvalidArgumentError("intervals must be > 0");
  }
  if (!options.address.empty() && options.token.empty()) {
    return absl::InvalidArgumentError("a job token is required to talk to pacerd");
  }
  if (options.mint_worker_credentials && !options.token.empty()) {
    if (IsCredential(options.token)) {
      return absl::InvalidArgumentError(
          "--worker-credentials mint needs the job token, and this agent holds a credential: "
          "give it the job token, or pass --worker-credentials inherit");
    }
    if (absl::Status s = MintCredential(options.token, CredentialKind::kWorker,
                                        options.worker_id_prefix + "0").status();
        !s.ok()) {
      return absl::InvalidArgumentError("--worker-id-prefix: " + std::string(s.message()));
    }
  }
  if (options.agent_id.empty()) options.agent_id = options.node;
  std::unique_ptr<NodeAgent> a(new NodeAgent(std::move(options), clock));
  for (const auto& [id, factor] : a->options_.initial_contention) {
    if (!a->supervisor_->Has(id)) return absl::InvalidArgumentError("--contention: unknown worker '" + id + "'");
    if (!(factor > 1.0 && factor <= 100.0)) {
      return absl::InvalidArgumentError("--contention: factor must be in (1, 100]");
    }
  }
  return a;
}

NodeAgent::NodeAgent(NodeAgentOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      // Grows with each start (ms since epoch), with a random low part against equal starts.
      incarnation_(static_cast<uint64_t>(clock->NowMs()) * 1000 + (getpid() % 1000)),
      rng_(static_cast<uint64_t>(clock->MonotonicNs()) ^ static_cast<uint64_t>(getpid())),
      signals_(io_),
      heartbeat_timer_(io_),
      metrics_timer_(io_) {
  collector_ = std::make_unique<NodeMetricsCollector>(options_.node, clock_, options_.metrics_sources);
  injector_ = std::make_unique<ContentionInjector>(options_.contention);
  WorkerSupervisor::Listener listener;
  listener.on_exit = [this](const WorkerExit& e) {
    exits_outbox_.push_back(e);
    if (exits_outbox_.size() > kMaxExitsKept) exits_outbox_.pop_front();
  };
  listener.on_group_start = [this](uint32_t restart_count) {
    return GroupStartEnvironment(restart_count);
  };
  listener.on_launch = [this](const std::string& id, pid_t pid) {
    recent_cores_.erase(id);  // a new process: its CPU history starts now
    if (absl::Status s = injector_->Reapply(id, pid); !s.ok()) {
      PACER_LOG(WARNING) << "contention on relaunched worker " << id << ": " << s.message();
    }
    supervisor_->SetContentionFactor(id, injector_->FactorOf(id).value_or(0));
  };
  if (!options_.attach_pattern.empty()) {
    AttachOptions a;
    a.worker_id = options_.worker_id_prefix + std::to_string(options_.first_rank);
    a.rank = options_.first_rank;
    a.pattern = options_.attach_pattern;
    a.poll_ms = options_.attach_poll_ms;
    a.stop_grace_ms = options_.restart.stop_grace_ms;
    a.restart_timeout_ms = options_.attach_restart_timeout_ms;
    ProcessAttacher::Listener al;
    al.on_exit = listener.on_exit;
    al.on_found = listener.on_launch;
    supervisor_ = std::make_unique<ProcessAttacher>(io_, clock_, std::move(a), std::move(al));
  } else {
    supervisor_ = std::make_unique<WorkerSupervisor>(
        io_, clock_, options_.restart, BuildWorkerSpecs(options_, CurrentEnvironment()),
        std::move(listener), options_.stdout_fd, options_.stderr_fd);
  }
  if (!options_.address.empty()) {
    grpc::ChannelArguments args;
    // Reconnect quickly once pacerd is back (gRPC's default backoff grows to 2 minutes).
    SetReconnectBackoff(&args, 200, 1000);
    ApplyTlsChannelArgs(options_.tls, &args);
    std::shared_ptr<grpc::ChannelCredentials> creds;
    std::string target = options_.address;
    if (auto t = PrepareTarget(options_.address, &args); t.ok()) {
      target = *t;
    } else {
      PACER_LOG(ERROR) << "--addr: " << t.status().message();
    }
    if (auto c = MakeChannelCredentials(options_.tls, target); c.ok()) {
      creds = *c;
    } else {
      PACER_LOG(ERROR) << "TLS to pacerd: " << c.status().message();
      creds = grpc::SslCredentials(grpc::SslCredentialsOptions());  // fails closed, never plaintext
    }
    stub_ = AgentService::NewStub(grpc::CreateCustomChannel(target, creds, args));
  }
  if (options_.kubernetes) kube_ = std::make_unique<KubeClient>(io_, *options_.kubernetes);
}

NodeAgent::~NodeAgent() {
  if (in_flight_) {
    in_flight_->ctx.TryCancel();
    absl::MutexLock l(&in_flight_->mu);
    in_flight_->mu.Await(absl::Condition(&in_flight_->done));
  }
  kube_.reset();        // cancels a pod deletion in flight
  injector_.reset();    // removes groups, kills hogs
  supervisor_.reset();  // SIGKILLs whatever still runs
}

int NodeAgent::Run() {
  signals_.add(SIGCHLD);
  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  std::function<void(const boost::system::error_code&, int)> on_signal;
  on_signal = [this, &on_signal](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    OnSignal(sig);
    if (!done_) signals_.async_wait(on_signal);
  };
  signals_.async_wait(on_signal);

  injector_->RemoveStaleGroups();
  PACER_LOG(INFO) << "agent " << options_.agent_id << " on node " << options_.node
                  << " (incarnation " << incarnation_ << "): " << options_.num_workers
                  << " worker(s), pacerd " << (options_.address.empty() ? "none" : options_.address);
  PACER_LOG(INFO) << "ranks " << options_.first_rank << ".." << options_.first_rank + options_.num_workers - 1
                  << " of " << options_.world_size << ", node " << options_.node_rank << " of "
                  << options_.nnodes << ", run id " << options_.run_id << ", restart scope "
                  << (options_.restart.scope == RestartScope::kGroup ? "group" : "worker")
                  << ", max restarts " << options_.restart.max_restarts;
  if (!SetsMasterAddress(options_)) {
    PACER_LOG(WARNING) << options_.nnodes << " nodes but no --master-addr and --master-port: "
                       << "MASTER_ADDR / MASTER_PORT are not set for the workers (torch's env:// "
                       << "init needs them; pass the same pair to every node's agent)";
  }
  supervisor_->StartAll();
  for (const auto& [id, factor] : options_.initial_contention) {
    std::vector<pid_t> others;
    for (const std::string& o : supervisor_->WorkerIds()) {
      if (o != id && supervisor_->Pid(o) > 0) others.push_back(supervisor_->Pid(o));
    }
    absl::Status s = injector_->Apply(id, supervisor_->Pid(id), factor, 0, others);
    if (!s.ok()) {
      PACER_LOG(ERROR) << "--contention " << id << ": " << s.message();
    }
    supervisor_->SetContentionFactor(id, injector_->FactorOf(id).value_or(0));
  }
  CollectMetrics();  // the first sample starts the first interval
  ScheduleMetrics();
  if (stub_) ScheduleHeartbeat(0);
  io_.run();
  return exit_code_.value_or(kAgentExitOk);
}

void NodeAgent::OnSignal(int sig) {
  if (sig == SIGCHLD) {
    ReapChildren();
    return;
  }
  PACER_LOG(INFO) << "signal " << sig << ": stopping workers";
  BeginExit(kAgentExitOk, strsignal(sig));
}

void NodeAgent::ReapChildren() {
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    if (supervisor_->OnChildExit(pid, status)) continue;
    if (injector_->OnChildExit(pid)) continue;
  }
  CheckFinished();
}

void NodeAgent::CheckFinished() {
  if (exit_code_ || !supervisor_->AllFinished()) return;
  const bool failed = supervisor_->AnyFailed();
  if (failed) {
    PACER_LOG(ERROR) << "giving up: " << supervisor_->FailureReason();
    std::cerr << "pacer-agent: giving up: " << supervisor_->FailureReason() << std::endl;
  }
  BeginExit(failed ? kAgentExitWorkersFailed : kAgentExitOk,
            failed ? "every worker ended, some failed: " + supervisor_->FailureReason()
                   : "every worker finished");
}

void NodeAgent::BeginExit(int code, const std::string& why) {
  if (exit_code_) return;
  exit_code_ = code;
  PACER_LOG(INFO) << "agent leaving (" << why << "), exit code " << code;
  stopping_workers_ = true;
  supervisor_->StopAll([this](absl::Status) {
    stopping_workers_ = false;
    injector_->ClearAll();
    CollectMetrics();
    if (!stub_) return FinishExit();
    heartbeat_timer_.cancel();
    if (!in_flight_) SendHeartbeat(/*final=*/true);
    // else: OnHeartbeatDone sends the final one when the current call ends.
  });
}

void NodeAgent::FinishExit() {
  if (done_) return;
  done_ = true;
  heartbeat_timer_.cancel();
  metrics_timer_.cancel();
  signals_.cancel();
  io_.stop();
}

void NodeAgent::ScheduleMetrics() {
  metrics_timer_.expires_after(std::chrono::milliseconds(options_.metrics_interval_ms));
  metrics_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || done_) return;
    CollectMetrics();
    ScheduleMetrics();
  });
}

void NodeAgent::CollectMetrics() {
  std::map<std::string, pid_t> pids;
  for (const std::string& id : supervisor_->WorkerIds()) pids[id] = supervisor_->Pid(id);
  auto sample = collector_->Sample(pids, injector_->CpuStatPaths());
  if (!sample.ok()) {
    PACER_LOG(WARNING) << "node metrics: " << sample.status().message();
    return;
  }
  if (!sample->has_value()) return;
  for (const auto& [id, cores] : (*sample)->worker_cores) {
    supervisor_->SetCpuCores(id, cores);
    if (pids[id] <= 0) continue;
    auto& recent = recent_cores_[id];
    recent.push_back(cores);
    const size_t keep = static_cast<size_t>(std::max<int64_t>(1, 2000 / options_.metrics_interval_ms));
    while (recent.size() > keep) recent.pop_front();
  }
  injector_->Regulate((*sample)->worker_cores);  // cpu-hog contention: steer toward the factor
  unsent_metrics_ = std::move((*sample)->metrics);
}

void NodeAgent::ScheduleHeartbeat(int64_t delay_ms) {
  heartbeat_timer_.expires_after(std::chrono::milliseconds(delay_ms));
  heartbeat_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || done_ || exit_code_) return;
    SendHeartbeat(/*final=*/false);
  });
}

void NodeAgent::SendHeartbeat(bool final) {
  auto call = std::make_shared<HeartbeatCall>();
  call->final = final;
  if (final) final_heartbeat_sent_ = true;
  AgentHeartbeat& r = call->req;
  r.set_job(options_.job);
  r.set_node(options_.node);
  r.set_agent_id(options_.agent_id);
  r.set_incarnation(incarnation_);
  r.set_leaving(exit_code_.has_value());
  if (unsent_metrics_) *r.mutable_node_metrics() = *unsent_metrics_;
  for (WorkerProcess& w : supervisor_->Snapshot()) *r.add_workers() = std::move(w);
  for (const WorkerExit& e : exits_outbox_) *r.add_exits() = e;
  for (const CommandAck& a : acks_outbox_) *r.add_acks() = a;
  call->acks_sent = acks_outbox_.size();
  AttachToken(&call->ctx, options_.token);
  call->ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(options_.heartbeat_timeout_ms));
  in_flight_ = call;
  // The callback hands its reference to the loop: gRPC's thread must never drop the last one,
  // or the call's ClientContext could be destroyed there while the process exits (gRPC then
  // aborted the agent at exit: "ref_counted.h: assertion failed: prior > 0"). The loop's handler
  // takes `mu` first, so it runs on only after this thread let go of the call.
  HeartbeatCall* raw = call.get();
  stub_->async()->Heartbeat(&raw->ctx, &raw->req, &raw->reply,
                            [this, call = std::move(call)](grpc::Status status) mutable {
                              HeartbeatCall* c = call.get();
                              absl::MutexLock l(&c->mu);
                              boost::asio::post(io_, [this, call = std::move(call), status] {
                                { absl::MutexLock released(&call->mu); }
                                OnHeartbeatDone(call, status);
                              });
                              c->done = true;
                            });
}

void NodeAgent::OnHeartbeatDone(const std::shared_ptr<HeartbeatCall>& call,
                                const grpc::Status& status) {
  if (in_flight_ == call) in_flight_.reset();
  if (done_) return;
  if (status.ok()) {
    if (!connected_ || heartbeat_failures_ > 0) {
      PACER_LOG(INFO) << "pacerd " << options_.address << " reachable"
                      << (heartbeat_failures_ ? absl::StrFormat(" again after %d failed heartbeats",
                                                                heartbeat_failures_)
                                              : "");
    }
    connected_ = true;
    heartbeat_failures_ = 0;
    if (call->reply.registered()) {
      ++registrations_;
      PACER_LOG(INFO) << (registrations_ == 1 ? "registered" : "re-registered") << " with pacerd as "
                      << options_.agent_id << " (incarnation " << incarnation_ << ")";
    }
    if (call->req.has_node_metrics() && unsent_metrics_ &&
        unsent_metrics_->time_ms() == call->req.node_metrics().time_ms()) {
      unsent_metrics_.reset();
    }
    acks_outbox_.erase(acks_outbox_.begin(),
                       acks_outbox_.begin() + std::min(call->acks_sent, acks_outbox_.size()));
    while (!exits_outbox_.empty() && exits_outbox_.front().seq() <= call->reply.exits_acked_through()) {
      exits_outbox_.pop_front();
    }
    if (!exit_code_) {
      for (const AgentCommand& c : call->reply.commands()) HandleCommand(c);
    }
  } else {
    ++heartbeat_failures_;
    if (heartbeat_failures_ == 1 || heartbeat_failures_ % 10 == 0) {
      PACER_LOG(WARNING) << "heartbeat to " << options_.address << " failed ("
                         << heartbeat_failures_ << " in a row): " << status.error_message()
                         << "; workers keep running";
    }
  }
  if (exit_code_) {
    if (call->final) return FinishExit();  // sent or not: the agent leaves either way
    if (!stopping_workers_) SendHeartbeat(/*final=*/true);
    return;
  }
  int64_t delay = options_.heartbeat_interval_ms;
  if (status.ok() && call->reply.heartbeat_interval_ms() > 0) {
    delay = call->reply.heartbeat_interval_ms();
  }
  if (heartbeat_failures_ > 0) {
    const double backoff = static_cast<double>(options_.heartbeat_interval_ms) *
                           std::pow(2.0, std::min<uint32_t>(heartbeat_failures_ - 1, 20));
    const double jitter = std::uniform_real_distribution<double>(0.8, 1.2)(rng_);
    delay = static_cast<int64_t>(
        std::min(backoff, static_cast<double>(options_.heartbeat_backoff_max_ms)) * jitter);
  }
  ScheduleHeartbeat(delay);
}

std::optional<std::string> NodeAgent::Refusal(const AgentCommand& cmd) const {
  auto known = [&](const std::string& id) -> std::optional<std::string> {
    if (id.empty()) return "malformed: worker_id is empty";
    if (!supervisor_->Has(id)) return "unknown worker '" + id + "' on node " + options_.node;
    return std::nullopt;
  };
  switch (cmd.action_case()) {
    case AgentCommand::kRestartWorker:
      return known(cmd.restart_worker().worker_id());
    case AgentCommand::kStop:
      if (!options_.attach_pattern.empty()) {
        return "attach mode: the agent did not start its worker and cannot keep it stopped (its "
               "container would be restarted); use restart, or migrate";
      }
      if (cmd.stop().all() == !cmd.stop().worker_id().empty()) {
        return "malformed: stop needs exactly one of worker_id / all";
      }
      return cmd.stop().all() ? std::nullopt : known(cmd.stop().worker_id());
    case AgentCommand::kMigrate:
      return std::nullopt;
    case AgentCommand::kSetContention: {
      if (auto r = known(cmd.set_contention().worker_id())) return r;
      const double f = cmd.set_contention().factor();
      if (!(f > 1.0 && f <= 100.0)) {
        return absl::StrFormat("malformed: contention factor must be in (1, 100], not %g", f);
      }
      return std::nullopt;
    }
    case AgentCommand::kClearContention:
      if (cmd.clear_contention().worker_id().empty()) return std::nullopt;
      return known(cmd.clear_contention().worker_id());
    case AgentCommand::ACTION_NOT_SET:
      return "malformed: command has no action";
  }
  return "malformed: unknown action";
}

void NodeAgent::HandleCommand(const AgentCommand& cmd) {
  if (cmd.command_id().empty()) {
    PACER_LOG(WARNING) << "ignoring a command without an id (cannot be acknowledged): "
                       << cmd.ShortDebugString();
    return;
  }
  auto it = executed_.find(cmd.command_id());
  if (it != executed_.end()) {
    if (it->second.finished) {  // a replay: acknowledge again, do not execute
      CommandAck ack = it->second.ack;
      ack.set_duplicate(true);
      acks_outbox_.push_back(ack);
      PACER_LOG(INFO) << "command " << cmd.command_id() << " replayed: acknowledged, not executed again";
    }
    return;  // still running: its ack comes when it ends
  }
  executed_[cmd.command_id()] = Executed{};
  executed_order_.push_back(cmd.command_id());
  while (executed_order_.size() > kMaxExecutedKept) {
    executed_.erase(executed_order_.front());
    executed_order_.pop_front();
  }
  if (auto reason = Refusal(cmd)) {
    PACER_LOG(WARNING) << "refusing command " << cmd.command_id() << ": " << *reason;
    Acknowledge(cmd.command_id(), absl::InvalidArgumentError(*reason));
    return;
  }
  PACER_LOG(INFO) << "executing command " << cmd.ShortDebugString();
  Execute(cmd);
}

void NodeAgent::Execute(const AgentCommand& cmd) {
  const std::string id = cmd.command_id();
  auto done = [this, id](absl::Status s) { Acknowledge(id, s); };
  switch (cmd.action_case()) {
    case AgentCommand::kRestartWorker:
      (void)supervisor_->Restart(cmd.restart_worker().worker_id(), done);
      return;
    case AgentCommand::kStop:
      if (cmd.stop().all()) {
        supervisor_->StopAll(done);
      } else {
        (void)supervisor_->Stop(cmd.stop().worker_id(), done);
      }
      return;
    case AgentCommand::kMigrate: {
      const std::string why = "migrate: " + cmd.migrate().reason();
      if (!kube_) {
        // The ack goes out with the final heartbeat, after every worker stopped.
        Acknowledge(id, absl::OkStatus());
        BeginExit(kAgentExitMigrated, why);
        return;
      }
      if (!options_.kubernetes_mark_node) return DeleteOwnPod(id, why);
      const std::string key = *BadNodeLabelKey(options_.job);  // checked by Create()
      PACER_LOG(INFO) << "migrate: labelling node " << kube_->options().node_name << " " << key
                      << " so that the replacement pod avoids it";
      kube_->MarkNode(key, std::to_string(clock_->NowMs() / 1000),
                      [this, id, why](absl::StatusOr<PodDeletion> r) {
                        if (done_) return;
                        if (!r.ok()) {
                          PACER_LOG(ERROR) << "migrate: node not marked, pod not deleted, workers keep "
                                           << "running: " << r.status().message();
                          Acknowledge(id, absl::Status(r.status().code(),
                                                       absl::StrCat("node not marked (pod not deleted): ",
                                                                    r.status().message())));
                          return;
                        }
                        DeleteOwnPod(id, why);
                      });
      return;
    }
    case AgentCommand::kSetContention: {
      const std::string& w = cmd.set_contention().worker_id();
      std::vector<pid_t> others;
      for (const std::string& o : supervisor_->WorkerIds()) {
        if (o != w && supervisor_->Pid(o) > 0) others.push_back(supervisor_->Pid(o));
      }
      // Under a CPU limit a busy worker's CPU is its limit (RecentCores counts its main
      // process only, not the loader processes a trainer starts).
      const double limit = options_.contention.worker_cpu_limit_cores;
      done(injector_->Apply(w, supervisor_->Pid(w), cmd.set_contention().factor(),
                            limit > 0 ? std::max(limit, RecentCores(w)) : RecentCores(w), others));
      supervisor_->SetContentionFactor(w, injector_->FactorOf(w).value_or(0));
      return;
    }
    case AgentCommand::kClearContention: {
      const std::string& w = cmd.clear_contention().worker_id();
      if (w.empty()) {
        injector_->ClearAll();
      } else {
        (void)injector_->Clear(w);
      }
      for (const std::string& wid : supervisor_->WorkerIds()) {
        supervisor_->SetContentionFactor(wid, injector_->FactorOf(wid).value_or(0));
      }
      done(absl::OkStatus());
      return;
    }
    case AgentCommand::ACTION_NOT_SET:
      break;
  }
  done(absl::InvalidArgumentError("malformed: command has no action"));
}

void NodeAgent::DeleteOwnPod(const std::string& id, const std::string& why) {
  const KubeClientOptions& k = kube_->options();
  PACER_LOG(INFO) << "migrate: deleting the own pod " << k.namespace_name << "/" << k.pod_name
                  << " so that it is rescheduled on another node";
  kube_->DeletePod([this, id, why](absl::StatusOr<PodDeletion> r) {
    if (done_) return;
    if (!r.ok()) {
      PACER_LOG(ERROR) << "migrate: pod not deleted, workers keep running: " << r.status().message();
      Acknowledge(id, absl::Status(r.status().code(), absl::StrCat("pod not deleted: ", r.status().message())));
      return;
    }
    PACER_LOG(INFO) << "migrate: pod " << (r->already_gone ? "already gone" : "deleted") << " (HTTP "
                    << r->http_status << ", " << r->attempts << " attempt(s)); stopping workers";
    Acknowledge(id, absl::OkStatus());
    BeginExit(kAgentExitMigrated, why);
  });
}

double NodeAgent::RecentCores(const std::string& worker_id) const {
  auto it = recent_cores_.find(worker_id);
  if (it == recent_cores_.end() || it->second.empty()) return 0;
  double sum = 0;
  for (double c : it->second) sum += c;
  return sum / static_cast<double>(it->second.size());
}

void NodeAgent::Acknowledge(const std::string& command_id, absl::Status outcome) {
  CommandAck ack;
  ack.set_command_id(command_id);
  ack.set_ok(outcome.ok());
  ack.set_reason(std::string(outcome.message()));
  if (auto it = executed_.find(command_id); it != executed_.end()) {
    it->second.finished = true;
    it->second.ack = ack;
  }
  acks_outbox_.push_back(std::move(ack));
}

}  // namespace pacer
