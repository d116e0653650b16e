#include "cmd/pacerd/pacerd.h"

#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cmd/pacerd/data_dir_identity.h"
#include "common/grpc_errors.h"
#include "common/log.h"
#include "common/net.h"
#include "common/status.h"
#include "common/tls.h"
#include "controller/policy_loader.h"
#include "journal/etcd_log.h"

namespace pacer {

absl::StatusOr<std::unique_ptr<Pacerd>> Pacerd::Start(PacerdOptions options, const Clock* clock) {
  std::unique_ptr<Pacerd> d(new Pacerd());
  d->options_ = options;
  d->clock_ = clock;
  ASSIGN_OR_RETURN(HostPort listen, ParseHostPort(options.listen));
  d->host_ = listen.host;
  ASSIGN_OR_RETURN(DataDir dir, d->OpenDataDir());
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                   MakeServerCredentials(TlsOptionsOf(options), listen.host, "pacerd"));
  RETURN_IF_ERROR(d->Elect(listen));
  ASSIGN_OR_RETURN(Policy policy, d->OpenComponents(dir));
  RETURN_IF_ERROR(d->BuildControlLoop(policy.config, options));
  RETURN_IF_ERROR(d->OpenControllerStore(&dir, policy.text));
  RETURN_IF_ERROR(d->RecordIdentityAndLosses(&dir));
  d->WireWorkerSessions();
  PACER_LOG(INFO) << "policy '" << policy.config.name << "' (" << policy.config.policy << ")"
                  << (policy.config.dry_run ? " in dry-run" : "");
  if (d->election_) {
    d->operator_grpc_->set_server_info([p = d.get()](GetServerResponse* resp) { p->ServerInfo(resp); });
  }
  RETURN_IF_ERROR(d->Serve(listen, creds));
  d->Proclaim();
  d->CheckJournal();
  if (options.housekeeping) d->housekeeping_ = std::thread([p = d.get()] { p->Housekeeping(); });
  return d;
}

// TLS from files gRPC re-reads every tls_reload_s (rotation without a restart); plaintext only
// on loopback unless --allow-insecure (common/tls.h).
TlsServerOptions Pacerd::TlsOptionsOf(const PacerdOptions& options) {
  TlsServerOptions tls;
  tls.cert_file = options.tls_cert;
  tls.key_file = options.tls_key;
  tls.client_ca_file = options.tls_client_ca;
  tls.allow_insecure = options.allow_insecure;
  tls.reload_interval_s = options.tls_reload_s;
  return tls;
}

absl::Status Pacerd::Elect(const HostPort& listen) {
  if (options_.journal.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(EtcdUrl url, ParseEtcdUrl(options_.journal));
  if (options_.election_ttl_s < 2) {
    return absl::InvalidArgumentError("--election-ttl-s must be >= 2 (etcd's minimum lease TTL)");
  }
  if (options_.job_token.empty() || options_.admin_token.empty()) {
    return absl::InvalidArgumentError(
        "with --journal etcd://, every pacerd of the job must use the same tokens: give "
        "--job-token-file and --admin-token-file");
  }
  EtcdClientOptions eo = options_.etcd;
  eo.endpoints = url.endpoints;
  eo.allow_insecure = eo.allow_insecure || options_.allow_insecure;
  if (url.tls && eo.cacert.empty()) {
    return absl::InvalidArgumentError("etcds:// needs --etcd-cacert (the CA that signs etcd's certificates)");
  }
  if (!url.tls && !eo.cacert.empty()) {
    return absl::InvalidArgumentError("--etcd-cacert given with etcd://: use etcds:// for TLS to etcd");
  }
  ASSIGN_OR_RETURN(etcd_, EtcdClient::Connect(eo));
  etcd_prefix_ = url.prefix;
  EtcdElectionOptions el;
  el.name = url.prefix + "/leader";
  el.value = options_.advertise.empty() ? listen.ToString() : options_.advertise;
  el.ttl_s = options_.election_ttl_s;
  election_ = std::make_unique<EtcdElection>(etcd_.get(), el);
  election_->set_on_lost([fn = options_.on_leadership_lost](const std::string& why) {
    if (fn) {
      fn(why);
      return;
    }
    PACER_LOG(ERROR) << "no longer the leader (" << why << "): exiting so that nothing more is served";
    std::_Exit(75);
  });
  PACER_LOG(INFO) << "campaigning for '" << el.name << "' in etcd (" << absl::StrJoin(url.endpoints, ",")
                  << ") as " << el.value;
  // The campaign runs beside the journals' open: a standby follows the journal (a hot standby)
  // until this campaign wins, then the open finishes and pacerd serves.
  std::promise<absl::Status> elected;
  elected_ = elected.get_future().share();
  campaign_ = std::thread([this, elected = std::move(elected)]() mutable {
    absl::Status s = election_->Campaign([](const std::string& leader) {
      PACER_LOG(INFO) << "standby: pacerd at " << leader << " leads; waiting to take over";
    });
    if (s.ok()) won_s_ = static_cast<double>(RealClock::Get()->MonotonicNs()) / 1e9;
    elected.set_value(s);
  });
  auto opener = [this](const std::string& journal, bool hot) {
    return [this, hot, prefix = etcd_prefix_ + "/" + journal + "/"](
               const JournalOptions& o, const DurableLogReplay& replay) -> absl::StatusOr<std::unique_ptr<DurableLog>> {
      EtcdLogOptions e;
      e.client = etcd_.get();
      e.prefix = prefix;
      e.format = o.format;
      e.must_exist = o.must_exist;
      EtcdElection* election = election_.get();
      e.fence = [election] { return election->fence(); };
      e.on_fenced = [election](const std::string& why) { election->Lost(why); };
      e.wait_promoted = [this](int64_t wait_ms) -> absl::StatusOr<bool> {
        if (elected_.wait_for(std::chrono::milliseconds(wait_ms)) != std::future_status::ready) return false;
        const absl::Status s = elected_.get();
        if (!s.ok()) return s;
        return true;
      };
      if (hot) e.on_follow = [this](uint64_t applied, uint64_t behind) { Followed(applied, behind); };
      return OpenEtcdLog(std::move(e), replay);
    };
  };
  options_.sharding.journal.open_log = opener("sharding", true);
  controller_open_log_ = opener("controller", false);
  return absl::OkStatus();
}

void Pacerd::Followed(uint64_t applied, uint64_t behind) {
  PacerdMetricSeries& m = pacerd_metrics_->own();
  m.ha_standby_applied.Get().Set(static_cast<double>(applied));
  m.ha_standby_behind.Get().Set(static_cast<double>(behind));
  // Where the leader sees it (pacerctl status): a key on this standby's own lease, so that it
  // goes when the standby does. At most once a second.
  const int64_t now_ms = RealClock::Get()->MonotonicNs() / 1'000'000;
  const int64_t lease = election_->lease_id();
  if (lease == 0 || now_ms - last_follow_put_ms_ < 1000) return;
  last_follow_put_ms_ = now_ms;
  absl::StatusOr<etcdserverpb::PutResponse> put =
      etcd_->Put(absl::StrFormat("%s/standby/%x", etcd_prefix_, lease), std::to_string(applied), lease);
  if (!put.ok()) PACER_LOG(WARNING) << "standby: publishing progress: " << put.status().message();
}

void Pacerd::ServerInfo(GetServerResponse* resp) {
  if (!election_) return;
  resp->set_journal("etcd");
  resp->set_etcd_endpoints(absl::StrJoin(etcd_->options().endpoints, ","));
  resp->set_etcd_prefix(etcd_prefix_);
  const EtcdFence fence = election_->fence();
  resp->set_leader(options_.advertise.empty() ? address() : options_.advertise);
  resp->set_fencing_revision(fence.rev);
  resp->set_lease_remaining_ms(std::max<int64_t>(0, election_->remaining_ms()));
  resp->set_takeover_seconds(takeover_s_);
  // The other campaign keys under the election's name: the standbys, oldest (next) first.
  etcdserverpb::RangeRequest req;
  const std::string name = etcd_prefix_ + "/leader/";
  req.set_key(name);
  req.set_range_end(EtcdPrefixEnd(name));
  req.set_sort_target(etcdserverpb::RangeRequest::CREATE);
  req.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  auto r = etcd_->Range(req);
  if (!r.ok()) return;
  // Each hot standby's progress (Followed), by lease.
  std::map<std::string, uint64_t> applied;
  const std::string progress = etcd_prefix_ + "/standby/";
  etcdserverpb::RangeRequest preq;
  preq.set_key(progress);
  preq.set_range_end(EtcdPrefixEnd(progress));
  if (auto pr = etcd_->Range(preq); pr.ok()) {
    for (const mvccpb::KeyValue& kv : pr->kvs()) {
      uint64_t seq = 0;
      if (absl::SimpleAtoi(kv.value(), &seq)) applied[kv.key().substr(progress.size())] = seq;
    }
  }
  const uint64_t durable = sharding_->stats().journal.durable_seq;
  for (const mvccpb::KeyValue& kv : r->kvs()) {
    if (kv.key() == fence.key) continue;
    ServerStandby* sb = resp->add_standbys();
    sb->set_address(kv.value());
    sb->set_revision(kv.create_revision());
    const auto it = applied.find(kv.key().substr(name.size()));  // the lease, in hex
    if (it != applied.end()) {
      sb->set_hot(true);
      sb->set_applied_seq(it->second);
      sb->set_behind(durable > it->second ? durable - it->second : 0);
    }
  }
}

void Pacerd::Proclaim() {
  if (!election_) return;
  PacerdMetricSeries& m = pacerd_metrics_->own();
  const double takeover_s = static_cast<double>(RealClock::Get()->MonotonicNs()) / 1e9 - won_s_;
  takeover_s_ = takeover_s;
  m.ha_leader.Get().Set(1);
  m.ha_fencing_revision.Get().Set(static_cast<double>(election_->fence().rev));
  m.ha_takeover.Get().Set(takeover_s);
  PACER_LOG(INFO) << "leading: serving " << takeover_s << " s after winning the election";
  if (!options_.advertise.empty()) return;
  const EtcdFence fence = election_->fence();
  absl::Status s = etcd_->Proclaim(etcd_prefix_ + "/leader", fence.key, fence.rev, election_->lease_id(), address());
  if (!s.ok()) PACER_LOG(WARNING) << "could not publish this leader's address: " << s.message();
}

absl::StatusOr<Pacerd::DataDir> Pacerd::OpenDataDir() {
  const PacerdOptions& options = options_;
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::UnavailableError("cannot create data dir '" + options.data_dir +
                                  "': " + ec.message());
  }
  job_token_ = options.job_token;
  if (job_token_.empty()) {
    ASSIGN_OR_RETURN(job_token_, LoadToken(options.data_dir + "/job.token", true));
  }
  admin_token_ = options.admin_token;
  if (admin_token_.empty()) {
    ASSIGN_OR_RETURN(admin_token_, LoadToken(options.data_dir + "/admin.token", true));
  }
  auth_ = std::make_unique<Authenticator>(job_token_, admin_token_);
  // Which stores this data dir must hold (none yet: a fresh dir, or one from before identities).
  DataDir dir;
  auto identity = ReadDataDirIdentity(options.data_dir);
  if (!identity.ok() && !options.accept_data_loss) return identity.status();
  if (!identity.ok()) {
    dir.accepted.push_back(std::string(identity.status().message()) + ": written anew");
  } else {
    dir.identity = std::move(*identity);
  }
  return dir;
}

absl::StatusOr<Pacerd::Policy> Pacerd::OpenComponents(const DataDir& dir) {
  PacerdOptions& options = options_;
  pacerd_metrics_ = std::make_unique<PacerdMetrics>(&metrics_, RealClock::Get()->NowSeconds());
  if (!options.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(metrics_port_, metrics_.Serve(options.metrics_listen));
  }
  ShardingServiceOptions sharding = options.sharding;
  sharding.data_dir = options.data_dir + "/journal";
  sharding.journal.must_exist = dir.Lists("journal");
  sharding.journal.accept_data_loss = options.accept_data_loss;
  ASSIGN_OR_RETURN(sharding_, ShardingServiceImpl::Open(sharding, clock_, &metrics_));
  Policy policy;  // default: "none"
  if (!options.policy_file.empty()) {
    ASSIGN_OR_RETURN(policy.config, LoadPolicyFile(options.policy_file));
    std::ifstream in(options.policy_file);
    policy.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const MonitorOptions monitor_options = MonitorOptionsFromPolicy(policy.config, options.monitor);
  ASSIGN_OR_RETURN(monitor_, MonitorServiceImpl::Create(monitor_options, clock_, &metrics_));
  agents_ = std::make_unique<AgentRegistry>(options.agents, clock_, &metrics_);
  // What the identity rules read of a worker (common/identity_rules.h): its registration, its agent.
  directory_ = std::make_unique<PacerdWorkerDirectory>(sharding_.get(), agents_.get());
  monitor_grpc_ = std::make_unique<GrpcMonitorService>(monitor_.get(), auth_.get(), directory_.get());
  agents_->SetNodeMetricsSink([m = monitor_.get()](const NodeMetrics& nm) {
    ReportNodeRequest req;
    *req.mutable_metrics() = nm;
    ReportNodeResponse resp;
    if (absl::Status s = m->ReportNode(req, &resp); !s.ok()) {
      PACER_LOG(WARNING) << "node metrics from agent: " << s;
    }
  });
  agents_grpc_ = std::make_unique<GrpcAgentService>(agents_.get(), auth_.get(), directory_.get());
  contention_grpc_ = std::make_unique<ContentionSwitchService>(agents_.get(), auth_.get());
  rendezvous_ = std::make_unique<RendezvousServiceImpl>(options.rendezvous, &metrics_);
  rendezvous_grpc_ = std::make_unique<GrpcRendezvousService>(rendezvous_.get(), auth_.get(), directory_.get());
  journal_metrics_ = std::make_unique<JournalMetrics>(&metrics_);
  sharding_journal_ = std::make_unique<JournalObserver>(journal_metrics_.get(), "sharding");
  controller_journal_ = std::make_unique<JournalObserver>(journal_metrics_.get(), "controller");
  return policy;
}

absl::Status Pacerd::BuildControlLoop(const PolicyConfig& policy, const PacerdOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Controller> controller, Controller::Create(policy));
  ReconcilerOptions ro = options.reconciler;
  ro.heartbeat_interval_s = options.sharding.heartbeat_interval_ms / 1000.0;
  sessions_ = std::make_unique<WorkerSessions>();
  // An epoch's end is shared by the batch plan in force (docs/sharding.md, even epoch ends).
  planned_rates_ = std::make_unique<PlannedFetchRates>(sessions_.get());
  sharding_->SetFetchRatesSource([rates = planned_rates_.get()] { return rates->Get(); });
  sink_ = std::make_unique<PacerdActionSink>(sessions_.get(), sharding_.get(), agents_.get(),
                                             options.also_carry);
  speeds_ = std::make_unique<MonitorSpeedSource>(monitor_.get());
  leases_ = std::make_unique<ShardingLeaseSource>(sharding_.get());
  restarts_ = std::make_unique<AgentRestartSource>(agents_.get());
  ReconcilerParts parts;
  parts.speeds = speeds_.get();
  parts.leases = leases_.get();
  parts.restarts = restarts_.get();
  parts.sessions = sessions_.get();
  parts.sink = sink_.get();
  reconciler_ = std::make_unique<Reconciler>(std::move(controller), parts, clock_, ro);
  controller_grpc_ = std::make_unique<GrpcControllerService>(reconciler_.get(), auth_.get());
  operator_grpc_ = std::make_unique<OperatorService>(agents_.get(), monitor_.get(), sharding_.get(),
                                                     reconciler_.get(), auth_.get(), clock_);
  // Hot reload reaches the monitor: thresholds and K-of-W from the next window; a policy that
  // changes window_s is refused (it needs a restart with that --policy file).
  reconciler_->SetPolicyListener([m = monitor_.get(), base = options.monitor](const PolicyConfig& p) {
    return m->UpdateDetection(MonitorOptionsFromPolicy(p, base));
  });
  return absl::OkStatus();
}

absl::Status Pacerd::OpenControllerStore(DataDir* dir, const std::string& policy_text) {
  const PacerdOptions& options = options_;
  const std::string controller_dir = options.data_dir + "/controller";
  // The controller's journal accepts what it can recover past itself (as the sharding journal
  // does); damage it cannot open even so is set aside and the store starts empty. Both journals
  // share one file system (options.sharding.journal.fs; tests inject faults).
  const auto& fs = options.sharding.journal.fs;
  auto store = ControllerStore::Open(controller_dir, dir->Lists("controller"), options.accept_data_loss, fs,
                                     controller_open_log_);
  if (!store.ok() && options.accept_data_loss && store.status().code() == absl::StatusCode::kDataLoss) {
    // Accepted: the old folder is kept aside, the store starts empty.
    dir->accepted.push_back(std::string(store.status().message()) + ": started empty");
    std::error_code ec;
    if (std::filesystem::exists(controller_dir, ec)) {
      std::filesystem::rename(controller_dir,
                              controller_dir + ".lost-" + std::to_string(RealClock::Get()->NowMs()), ec);
    }
    store = ControllerStore::Open(controller_dir, false, /*accept_data_loss=*/true, fs);
  }
  if (!store.ok()) return store.status();
  if (const std::string lost = (*store)->recovery().accepted_loss; !lost.empty()) {
    dir->accepted.push_back("controller store: " + lost);
  }
  return reconciler_->AttachStore(std::move(*store), policy_text);
}

absl::Status Pacerd::RecordIdentityAndLosses(DataDir* dir) {
  const PacerdOptions& options = options_;
  // Both stores are open: a data dir without an identity gets one now (adopted when it held a
  // journal already), so from now on a missing store is refused instead of recreated empty.
  const JournalRecovery recovered = sharding_->journal_recovery();
  if (!dir->identity.has_value()) {
    RETURN_IF_ERROR(WriteDataDirIdentity(
        options.data_dir, NewDataDirIdentity(RealClock::Get()->NowMs(), {"journal", "controller"})));
    if (!recovered.created && options.journal.empty()) {
      PACER_LOG(INFO) << "data dir '" << options.data_dir << "' adopted: IDENTITY written, journal "
                      << "high-water mark set to the recovered update " << recovered.recovered_seq;
    }
  }
  std::vector<std::string>& accepted = dir->accepted;
  if (!recovered.accepted_loss.empty()) accepted.insert(accepted.begin(), recovered.accepted_loss);
  if (accepted.empty()) {
    if (options.accept_data_loss) {
      PACER_LOG(WARNING) << "--accept-data-loss given, but nothing was lost: the data dir is intact";
    }
    return absl::OkStatus();
  }
  std::string what;
  for (const auto& a : accepted) what += (what.empty() ? "" : "; ") + a;
  const std::string line = "pacerd started with --accept-data-loss and accepted: " + what;
  PACER_LOG(WARNING) << "DATA LOSS ACCEPTED: " << line;
  if (absl::Status s = RecordAcceptedDataLoss(options.data_dir,
                                              std::to_string(RealClock::Get()->NowMs()) + " " + line);
      !s.ok()) {
    PACER_LOG(ERROR) << "the accepted data loss could not be recorded in the data dir: " << s;
  }
  reconciler_->RecordOperatorEvent(line);
  pacerd_metrics_->own().data_loss_accepted.Get().Increment();
  return absl::OkStatus();
}

void Pacerd::WireWorkerSessions() {
  Reconciler* reconciler = reconciler_.get();
  worker_sessions_ = std::make_unique<WorkerSessionService>(sharding_.get(), reconciler, sessions_.get(),
                                                            rendezvous_.get(), monitor_.get());
  sharding_grpc_ = std::make_unique<GrpcShardingService>(worker_sessions_.get(), auth_.get(), directory_.get());
  // Accepted step reports feed the controller's per-step burst rule.
  steps_to_reconciler_ = std::make_unique<StepsToReconciler>(reconciler);
  monitor_->SetStepObserver(steps_to_reconciler_.get());
  // A classification change (a straggler flagged, or persistent now) is what the controller
  // acts on: it reconciles at once on the housekeeping thread, not at the next round (up to
  // a housekeeping period, 1 s, later), as the simulator's controller does at window close.
  monitor_->SetEventListener([this, reconciler](const std::vector<ClassificationEvent>&) {
    reconciler->Poke();
    {
      absl::MutexLock l(&mu_);
      reconcile_wanted_ = true;
    }
  });
}

absl::Status Pacerd::Serve(const HostPort& listen, const std::shared_ptr<grpc::ServerCredentials>& creds) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen.ToString(), creds, &port_);
  builder.RegisterService(sharding_grpc_.get());
  builder.RegisterService(monitor_grpc_.get());
  builder.RegisterService(controller_grpc_.get());
  builder.RegisterService(agents_grpc_.get());
  builder.RegisterService(contention_grpc_.get());
  builder.RegisterService(operator_grpc_.get());
  builder.RegisterService(rendezvous_grpc_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.experimental().SetInterceptorCreators(UnparsableRequestInterceptors());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) return absl::UnavailableError("cannot listen on '" + options_.listen + "'");
  return absl::OkStatus();
}

Pacerd::~Pacerd() { Shutdown(); }

std::string Pacerd::address() const { return HostPort{host_, port_}.ToString(); }

void Pacerd::Housekeeping() {
  const auto period = std::chrono::milliseconds(
      options_.housekeeping_period_ms > 0
          ? options_.housekeeping_period_ms
          : std::clamp<int64_t>(options_.sharding.lease_timeout_ms / 8, 50, 1000));
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || reconcile_wanted_; };
  absl::MutexLock l(&mu_);
  auto next = std::chrono::steady_clock::now() + period;
  while (!stopping_) {
    // A timer, not synchronisation: wakes early on Shutdown() and when the monitor's
    // classification changed (reconcile now; the rest of the round stays on the timer).
    mu_.AwaitWithTimeout(absl::Condition(&woken),
                         absl::FromChrono(std::max(next - std::chrono::steady_clock::now(),
                                                   std::chrono::steady_clock::duration::zero())));
    if (stopping_) break;
    const bool round = std::chrono::steady_clock::now() >= next;
    reconcile_wanted_ = false;
    mu_.Unlock();
    if (round) {
      HousekeepingStep();
      next = std::chrono::steady_clock::now() + period;
    } else {
      reconciler_->MaybeReconcile();
    }
    mu_.Lock();
  }
}

int Pacerd::HousekeepingStep() {
  CheckJournal();
  const int expired = sharding_->ExpireOverdue();
  LoseAbandonedWorkers();
  monitor_->Tick();
  reconciler_->MaybeDecideBursts();
  reconciler_->MaybeReconcile();
  pacerd_metrics_->Publish(*agents_, *reconciler_, *speeds_, clock_->NowMs());
  if (election_) {
    pacerd_metrics_->own().ha_lease_remaining.Get().Set(
        std::max<double>(0, static_cast<double>(election_->remaining_ms()) / 1000.0));
  }
  operator_grpc_->Sample();
  ReleaseFreeHeap();
  return expired;
}

void Pacerd::LoseAbandonedWorkers() {
  absl::MutexLock l(&abandoned_mu_);
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
  absl::MutexLock l(&journal_check_mu_);
  absl::Status health = sharding_->journal_health();
  if (!health.ok()) {
    const int64_t now = RealClock::Get()->NowMs();
    if (now - last_journal_retry_ms_ >= options_.journal_retry_ms) {
      last_journal_retry_ms_ = now;
      if (absl::Status s = sharding_->RecoverJournal(); s.ok()) {
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
  sharding_journal_->Observe(sharding_->stats().journal, health);
  if (auto controller = reconciler_->JournalState()) controller_journal_->Observe(controller->first, controller->second);
  if (server_ && server_->GetHealthCheckService()) {
    server_->GetHealthCheckService()->SetServingStatus(healthy);
    server_->GetHealthCheckService()->SetServingStatus("pacer.ShardingService", healthy);
  }
}

void Pacerd::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (housekeeping_.joinable()) housekeeping_.join();
  if (rendezvous_) rendezvous_->Shutdown();  // parked Gets would hold up the server's shutdown
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (sharding_) {
    (void)sharding_->Flush();
    sharding_->SetFetchRatesSource(nullptr);  // planned_rates_ and sessions_ go first
  }
  if (election_) {
    // Hand over at once: a standby need not wait for the lease to lapse.
    election_->Stop();
    if (campaign_.joinable()) campaign_.join();
    absl::Status s = election_->Resign();
    if (!s.ok()) PACER_LOG(WARNING) << "resigning the leadership: " << s.message();
  }
}

void Pacerd::Wait() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(&stopping_));
}

}  // namespace pacer
