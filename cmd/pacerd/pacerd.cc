#include "cmd/pacerd/pacerd.h"

#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cmd/pacerd/data_dir_identity.h"
#include "common/grpc_errors.h"
#include "common/log.h"
#include "common/net.h"
#include "common/status.h"
#include "common/tls.h"
#include "controller/policy_loader.h"

namespace pacer {

absl::StatusOr<std::unique_ptr<Pacerd>> Pacerd::Start(PacerdOptions options, const Clock* clock) {
  std::unique_ptr<Pacerd> d(new Pacerd());
  d->options_ = options;
  d->clock_ = clock;
  ASSIGN_OR_RETURN(HostPort listen, ParseHostPort(options.listen));
  d->host_ = listen.host;

  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::UnavailableError("cannot create data dir '" + options.data_dir +
                                  "': " + ec.message());
  }
  d->job_token_ = options.job_token;
  if (d->job_token_.empty()) {
    ASSIGN_OR_RETURN(d->job_token_, LoadToken(options.data_dir + "/job.token", true));
  }
  d->admin_token_ = options.admin_token;
  if (d->admin_token_.empty()) {
    ASSIGN_OR_RETURN(d->admin_token_, LoadToken(options.data_dir + "/admin.token", true));
  }
  d->auth_ = std::make_unique<Authenticator>(d->job_token_, d->admin_token_);
  // Which stores this data dir must hold (none yet: a fresh dir, or one from before identities).
  auto identity = ReadDataDirIdentity(options.data_dir);
  if (!identity.ok() && !options.accept_data_loss) return identity.status();
  std::vector<std::string> accepted;  // losses the operator accepted, in words
  if (!identity.ok()) {
    accepted.push_back(std::string(identity.status().message()) + ": written anew");
    identity = std::optional<DataDirIdentity>();
  }
  const bool has_identity = identity->has_value();
  auto listed = [&](const char* store) { return has_identity && (*identity)->Has(store); };

  // TLS from files gRPC re-reads every tls_reload_s (rotation without a restart); plaintext
  // only on loopback unless --allow-insecure (common/tls.h).
  TlsServerOptions tls;
  tls.cert_file = options.tls_cert;
  tls.key_file = options.tls_key;
  tls.client_ca_file = options.tls_client_ca;
  tls.allow_insecure = options.allow_insecure;
  tls.reload_interval_s = options.tls_reload_s;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                   MakeServerCredentials(tls, listen.host, "pacerd"));

  d->pacerd_metrics_ = std::make_unique<PacerdMetrics>(&d->metrics_, RealClock::Get()->NowSeconds());
  if (!options.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(d->metrics_port_, d->metrics_.Serve(options.metrics_listen));
  }
  options.sharding.data_dir = options.data_dir + "/journal";
  options.sharding.journal.must_exist = listed("journal");
  options.sharding.journal.accept_data_loss = options.accept_data_loss;
  ASSIGN_OR_RETURN(d->sharding_, ShardingServiceImpl::Open(options.sharding, clock, &d->metrics_));
  PolicyConfig policy;  // default: "none"
  std::string policy_text;  // identifies the --policy file for the controller store
  if (!options.policy_file.empty()) {
    ASSIGN_OR_RETURN(policy, LoadPolicyFile(options.policy_file));
    std::ifstream in(options.policy_file);
    policy_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const MonitorOptions monitor_options = MonitorOptionsFromPolicy(policy.detection, options.monitor);
  ASSIGN_OR_RETURN(d->monitor_, MonitorServiceImpl::Create(monitor_options, clock, &d->metrics_));
  d->agents_ = std::make_unique<AgentRegistry>(options.agents, clock, &d->metrics_);
  // What the identity rules read of a worker (common/identity_rules.h): its registration, its agent.
  d->directory_ = std::make_unique<PacerdWorkerDirectory>(d->sharding_.get(), d->agents_.get());
  d->sharding_grpc_ =
      std::make_unique<GrpcShardingService>(d->sharding_.get(), d->auth_.get(), d->directory_.get());
  d->monitor_grpc_ = std::make_unique<GrpcMonitorService>(d->monitor_.get(), d->auth_.get(), d->directory_.get());
  d->agents_->SetNodeMetricsSink([m = d->monitor_.get()](const NodeMetrics& nm) {
    ReportNodeRequest req;
    *req.mutable_metrics() = nm;
    ReportNodeResponse resp;
    if (absl::Status s = m->ReportNode(req, &resp); !s.ok()) {
      PACER_LOG(WARNING) << "node metrics from agent: " << s;
    }
  });
  d->agents_grpc_ = std::make_unique<GrpcAgentService>(d->agents_.get(), d->auth_.get(), d->directory_.get());
  d->contention_grpc_ =
      std::make_unique<ContentionSwitchService>(d->agents_.get(), d->auth_.get());
  ASSIGN_OR_RETURN(std::unique_ptr<Controller> controller, Controller::Create(policy));
  ReconcilerOptions ro = options.reconciler;
  ro.heartbeat_interval_s = options.sharding.heartbeat_interval_ms / 1000.0;
  d->sessions_ = std::make_unique<WorkerSessions>();
  d->sink_ = std::make_unique<PacerdActionSink>(d->sessions_.get(), d->sharding_.get(), d->agents_.get(),
                                                options.also_carry);
  ReconcilerParts parts;
  parts.monitor = d->monitor_.get();
  parts.sharding = d->sharding_.get();
  parts.sessions = d->sessions_.get();
  parts.agents = d->agents_.get();
  parts.sink = d->sink_.get();
  d->reconciler_ = std::make_unique<Reconciler>(std::move(controller), parts, clock, ro);
  d->controller_grpc_ = std::make_unique<GrpcControllerService>(d->reconciler_.get(), d->auth_.get());
  d->operator_grpc_ = std::make_unique<OperatorService>(d->agents_.get(), d->monitor_.get(),
                                                       d->sharding_.get(), d->reconciler_.get(),
                                                       d->auth_.get(), clock);
  // Hot reload reaches the monitor: thresholds and K-of-W from the next window; a policy that
  // changes window_s is refused (it needs a restart with that --policy file).
  d->reconciler_->SetPolicyListener([m = d->monitor_.get(), base = options.monitor](const PolicyConfig& p) {
    return m->UpdateDetection(MonitorOptionsFromPolicy(p.detection, base));
  });
  {
    const std::string controller_dir = options.data_dir + "/controller";
    // The controller's journal accepts what it can recover past itself (as the sharding
    // journal does); damage it cannot open even so is set aside and the store starts empty.
    auto store = ControllerStore::Open(controller_dir, listed("controller"), options.accept_data_loss);
    if (!store.ok() && options.accept_data_loss &&
        store.status().code() == absl::StatusCode::kDataLoss) {
      // Accepted: the old folder is kept aside, the store starts empty.
      accepted.push_back(std::string(store.status().message()) + ": started empty");
      std::error_code ec;
      if (std::filesystem::exists(controller_dir, ec)) {
        std::filesystem::rename(controller_dir,
                                controller_dir + ".lost-" + std::to_string(RealClock::Get()->NowMs()), ec);
      }
      store = ControllerStore::Open(controller_dir, false, /*accept_data_loss=*/true);
    }
    if (!store.ok()) return store.status();
    if (const std::string lost = (*store)->recovery().accepted_loss; !lost.empty()) {
      accepted.push_back("controller store: " + lost);
    }
    RETURN_IF_ERROR(d->reconciler_->AttachStore(std::move(*store), policy_text));
  }
  // Both stores are open: a data dir without an identity gets one now (adopted when it held a
  // journal already), so from now on a missing store is refused instead of recreated empty.
  const JournalRecovery recovered = d->sharding_->journal_recovery();
  if (!has_identity) {
    RETURN_IF_ERROR(WriteDataDirIdentity(
        options.data_dir,
        NewDataDirIdentity(RealClock::Get()->NowMs(), {"journal", "controller"})));
    if (!recovered.created) {
      PACER_LOG(INFO) << "data dir '" << options.data_dir << "' adopted: IDENTITY written, journal "
                      << "high-water mark set to the recovered update " << recovered.recovered_seq;
    }
  }
  if (!recovered.accepted_loss.empty()) accepted.insert(accepted.begin(), recovered.accepted_loss);
  d->journal_healthy_ = &d->pacerd_metrics_->own().journal_healthy.Get();
  d->journal_recoveries_ = &d->pacerd_metrics_->own().journal_recoveries.Get();
  prometheus::Counter& losses = d->pacerd_metrics_->own().data_loss_accepted.Get();
  if (!accepted.empty()) {
    std::string what;
    for (const auto& a : accepted) what += (what.empty() ? "" : "; ") + a;
    const std::string line = "pacerd started with --accept-data-loss and accepted: " + what;
    PACER_LOG(WARNING) << "DATA LOSS ACCEPTED: " << line;
    if (absl::Status s = RecordAcceptedDataLoss(options.data_dir,
                                                std::to_string(RealClock::Get()->NowMs()) + " " + line);
        !s.ok()) {
      PACER_LOG(ERROR) << "the accepted data loss could not be recorded in the data dir: " << s;
    }
    d->reconciler_->RecordOperatorEvent(line);
    losses.Increment();
  } else if (options.accept_data_loss) {
    PACER_LOG(WARNING) << "--accept-data-loss given, but nothing was lost: the data dir is intact";
  }
  Reconciler* reconciler = d->reconciler_.get();
  d->rendezvous_ = std::make_unique<RendezvousServiceImpl>(d->options_.rendezvous, &d->metrics_);
  d->rendezvous_grpc_ =
      std::make_unique<GrpcRendezvousService>(d->rendezvous_.get(), d->auth_.get(), d->directory_.get());
  d->replies_ = std::make_unique<HeartbeatReplyBuilder>(reconciler, d->sessions_.get(),
                                                        d->rendezvous_.get());
  d->sharding_->SetHeartbeatCommands(d->replies_.get());
  // A worker process that starts may begin a new run of the job (controller/run_tracker.h).
  d->sharding_->SetRegisterHook([reconciler](const RegisterWorkerRequest& req,
                                             const RegisterWorkerResponse&) {
    reconciler->OnRegister(req);
  });
  // Operator acts on the sharding state (pacerctl datasets delete|reset) go in the audit trail.
  d->sharding_->SetAuditHook([reconciler](const std::string& what) {
    reconciler->RecordOperatorEvent(what);
  });
  // Accepted step reports feed the controller's per-step burst rule.
  d->monitor_->SetStepObserver(reconciler);
  d->monitor_->SetEventListener(
      [reconciler](const std::vector<ClassificationEvent>&) { reconciler->Poke(); });
  PACER_LOG(INFO) << "policy '" << policy.name << "' (" << policy.policy << ")"
                  << (policy.dry_run ? " in dry-run" : "");

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen.ToString(), creds, &d->port_);
  builder.RegisterService(d->sharding_grpc_.get());
  builder.RegisterService(d->monitor_grpc_.get());
  builder.RegisterService(d->controller_grpc_.get());
  builder.RegisterService(d->agents_grpc_.get());
  builder.RegisterService(d->contention_grpc_.get());
  builder.RegisterService(d->operator_grpc_.get());
  builder.RegisterService(d->rendezvous_grpc_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.experimental().SetInterceptorCreators(UnparsableRequestInterceptors());
  d->server_ = builder.BuildAndStart();
  if (!d->server_ || d->port_ == 0) {
    return absl::UnavailableError("cannot listen on '" + options.listen + "'");
  }
  d->CheckJournal();
  if (options.housekeeping) d->housekeeping_ = std::thread([p = d.get()] { p->Housekeeping(); });
  return d;
}

Pacerd::~Pacerd() { Shutdown(); }

std::string Pacerd::address() const { return HostPort{host_, port_}.ToString(); }

void Pacerd::Housekeeping() {
  const auto period = std::chrono::milliseconds(
      std::clamp<int64_t>(options_.sharding.lease_timeout_ms / 8, 50, 1000));
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    cv_.wait_for(l, period);  // a timer, not synchronisation: wakes early on Shutdown()
    if (stopping_) break;
    l.unlock();
    HousekeepingStep();
    l.lock();
  }
}

int Pacerd::HousekeepingStep() {
  CheckJournal();
  const int expired = sharding_->ExpireOverdue();
  LoseAbandonedWorkers();
  monitor_->Tick();
  reconciler_->MaybeDecideBursts();
  reconciler_->MaybeReconcile();
  pacerd_metrics_->Publish(*agents_, *reconciler_, *monitor_, clock_->NowMs());
  operator_grpc_->Sample();
  ReleaseFreeHeap();
  return expired;
}

void Pacerd::LoseAbandonedWorkers() {
  std::lock_guard<std::mutex> l(abandoned_mu_);
  for (const AgentView& agent : agents_->Agents()) {
    for (const WorkerProcess& p : agent.workers) {
      // Given up on; or stopped by an agent that is leaving (it gave up on the group, or
      // migrates): no process of that agent will hold the worker's leases again.
      const bool gone = p.state() == WORKER_STATE_FAILED ||
                        (agent.leaving && p.pid() == 0 && p.state() == WORKER_STATE_EXITED);
      if (!gone) continue;
      const std::string failure = absl::StrCat(agent.agent_id, "#", agent.incarnation, " after ",
                                               p.restarts(), " restarts (", p.crash_restarts(), " after crashes)");
      auto it = abandoned_handled_.find(p.worker_id());
      if (it != abandoned_handled_.end() && it->second == failure) continue;
      const std::optional<int> ended = sharding_->LoseGoneWorker(
          p.worker_id(), p.state() == WORKER_STATE_FAILED
                             ? absl::StrCat("its agent ", agent.agent_id, " on node ", agent.node,
                                            " gave up on it (crashed past its restart limit)")
                             : absl::StrCat("its agent ", agent.agent_id, " on node ", agent.node,
                                            " stopped it and is leaving"));
      if (ended) abandoned_handled_[p.worker_id()] = failure;  // nullopt: ask again next round
    }
  }
}

void Pacerd::ReleaseFreeHeap() {
#ifdef __GLIBC__
  // glibc keeps what is freed in the arena it came from (one per thread, up to 8 per core: 16
  // here, with gRPC's threads), so every arena stays as large as the biggest burst it saw — a
  // snapshot's copy, a backlog of in-flight calls. Measured at 4 096 workers after 7 minutes:
  // 250 MB held from the system, 102 MB in use (docs/benchmarks.md, "pacerd under load").
  // Handing the free pages back every kHeapReleaseIntervalMs bounds RSS by the live heap plus
  // what was freed since; it takes a few ms, one arena lock at a time.
  const int64_t now = clock_->NowMs();
  if (now - last_heap_release_ms_.load() < kHeapReleaseIntervalMs) return;
  last_heap_release_ms_ = now;
  malloc_trim(0);
#endif
}

void Pacerd::CheckJournal() {
  std::lock_guard<std::mutex> l(journal_check_mu_);
  absl::Status health = sharding_->journal_health();
  if (!health.ok()) {
    const int64_t now = RealClock::Get()->NowMs();
    if (now - last_journal_retry_ms_ >= options_.journal_retry_ms) {
      last_journal_retry_ms_ = now;
      if (absl::Status s = sharding_->RecoverJournal(); s.ok()) {
        journal_recoveries_->Increment();
        PACER_LOG(WARNING) << "journal reopened: updates are accepted again";
      } else if (s.code() == absl::StatusCode::kDataLoss) {
        PACER_LOG(ERROR) << "journal cannot be reopened: " << s;
      }
      health = sharding_->journal_health();
    }
  }
  const bool healthy = health.ok();
  if (healthy != journal_was_healthy_ && !healthy) {
    PACER_LOG(ERROR) << "updates refused until the journal recovers: " << health.message();
  }
  journal_was_healthy_ = healthy;
  journal_healthy_->Set(healthy ? 1 : 0);
  if (server_ && server_->GetHealthCheckService()) {
    server_->GetHealthCheckService()->SetServingStatus(healthy);
    server_->GetHealthCheckService()->SetServingStatus("pacer.ShardingService", healthy);
  }
}

void Pacerd::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (housekeeping_.joinable()) housekeeping_.join();
  if (rendezvous_) rendezvous_->Shutdown();  // parked Gets would hold up the server's shutdown
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (sharding_) (void)sharding_->Flush();
}

void Pacerd::Wait() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return stopping_; });
}

}  // namespace pacer
