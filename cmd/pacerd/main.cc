// pacerd: one per job (or, with --journal etcd://, a leader and standbys). Serves the sharding
// service, the monitor and the controller over gRPC, with its state journaled in --data-dir or
// in etcd.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/synchronization/mutex.h"
#include "cmd/pacerd/pacerd.h"
#include "controller/policy_loader.h"
#include "common/flags.h"
#include "common/log.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  pacer::SetLogProgramName("pacerd");
  pacer::PacerdOptions o;
  std::string port_file, job_token_file, admin_token_file, etcd_password_file;
  po::options_description desc("Options");
  desc.add_options()
      ("data-dir", po::value(&o.data_dir)->default_value(o.data_dir),
       "durable state (journal, snapshots, tokens)")
      ("listen", po::value(&o.listen)->default_value(o.listen), "gRPC address HOST:PORT (port 0: any)")
      ("metrics-listen", po::value(&o.metrics_listen)->default_value(o.metrics_listen),
       "Prometheus /metrics address HOST:PORT; empty to disable")
      ("policy", po::value(&o.policy_file), "controller policy file (YAML, see policies/); default: observe only")
      ("job-mode", po::value<std::string>()->default_value("sync"), "sync (all-reduce) or async (parameter server)")
      ("restart-cost-s", po::value(&o.reconciler.restart_cost_s)->default_value(o.reconciler.restart_cost_s),
       "time one worker relaunch costs, for the restart cost model")
      ("reconcile-interval-ms", po::value(&o.reconciler.interval_ms)->default_value(o.reconciler.interval_ms),
       "controller reconcile period (also runs early on monitor events)")
      ("job-token-file", po::value(&job_token_file), "job token (workers, agents); default DATA_DIR/job.token")
      ("admin-token-file", po::value(&admin_token_file), "admin token (pacerctl); default DATA_DIR/admin.token")
      ("tls-cert", po::value(&o.tls_cert), "server certificate (PEM); enables TLS")
      ("tls-key", po::value(&o.tls_key), "server private key (PEM)")
      ("tls-client-ca", po::value(&o.tls_client_ca), "CA for client certificates (mTLS; needs --tls-cert/--tls-key)")
      ("tls-reload-s", po::value(&o.tls_reload_s)->default_value(o.tls_reload_s),
       "re-read the TLS files this often (seconds, 1..3600): a rotated certificate is served without a restart")
      ("allow-insecure", po::bool_switch(&o.allow_insecure), "allow plaintext on a non-loopback address")
      ("lease-timeout-ms", po::value(&o.sharding.lease_timeout_ms)->default_value(o.sharding.lease_timeout_ms),
       "a worker silent this long loses its leases")
      ("worker-timeout-ms", po::value(&o.sharding.worker_timeout_ms)->default_value(o.sharding.worker_timeout_ms),
       "a worker silent this long is declared lost")
      ("heartbeat-interval-ms", po::value(&o.sharding.heartbeat_interval_ms)->default_value(o.sharding.heartbeat_interval_ms),
       "heartbeat interval suggested to workers")
      ("snapshot-every", po::value(&o.sharding.snapshot_every)->default_value(o.sharding.snapshot_every),
       "journal updates between snapshots")
      ("max-datasets", po::value(&o.sharding.max_datasets)->default_value(o.sharding.max_datasets),
       "datasets a job may register (1..1024)")
      ("max-files", po::value(&o.sharding.max_files_total)->default_value(o.sharding.max_files_total),
       "files over every dataset of the job (1..2000000; their bytes count against --max-dataset-bytes)")
      ("max-workers", po::value(&o.sharding.max_workers)->default_value(o.sharding.max_workers),
       "workers a job may register (1..65536)")
      ("max-dataset-bytes", po::value(&o.sharding.max_dataset_bytes)->default_value(o.sharding.max_dataset_bytes),
       "bytes of memory every registered dataset's spec and partitions may hold, in all "
       "(1048576..68719476736; docs/security.md)")
      ("accept-data-loss", po::bool_switch(&o.accept_data_loss),
       "start although the journal or controller store is damaged, missing or shorter than "
       "acknowledged: accept the loss (logged, audited, recorded in DATA_DIR/DATA-LOSS-ACCEPTED)")
      ("port-file", po::value(&port_file), "write {\"port\":P,\"metrics_port\":M} here once serving")
      ("journal", po::value(&o.journal),
       "where the journals live: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// with TLS) for a "
       "replicated journal with a leader elected among the job's pacerds (docs/ha.md); default: "
       "RocksDB in --data-dir")
      ("etcd-cacert", po::value(&o.etcd.cacert), "CA of etcd's certificates (etcds://)")
      ("etcd-cert", po::value(&o.etcd.cert), "client certificate for etcd (PEM)")
      ("etcd-key", po::value(&o.etcd.key), "client private key for etcd (PEM)")
      ("etcd-user", po::value(&o.etcd.user), "etcd user (etcd authentication)")
      ("etcd-password-file", po::value(&etcd_password_file), "file holding the etcd user's password")
      ("etcd-timeout-ms", po::value(&o.etcd.request_timeout_ms)->default_value(o.etcd.request_timeout_ms),
       "deadline of one etcd request, retries on other members included")
      ("advertise", po::value(&o.advertise),
       "address this pacerd names as leader to the others (default: the address it serves on)")
      ("election-ttl-s", po::value(&o.election_ttl_s)->default_value(o.election_ttl_s),
       "the leader's lease TTL in etcd: a failed leader is replaced within about this (>= 2)");
  auto flags = pacer::ParseFlagsOrExit(
      argc, argv, "Usage: pacerd [options]\n\nThe Pacer control plane of one training job.", desc);
  if (o.tls_reload_s < 1 || o.tls_reload_s > 3600) pacer::ExitWithError("pacerd", "--tls-reload-s must be in 1..3600");
  const std::string mode = flags.vm["job-mode"].as<std::string>();
  if (mode != "sync" && mode != "async") pacer::ExitWithError("pacerd", "--job-mode must be sync or async");
  o.reconciler.mode = mode == "sync" ? pacer::JobMode::kSync : pacer::JobMode::kAsync;
  if (!o.policy_file.empty()) {
    auto policy = pacer::LoadPolicyFile(o.policy_file);
    if (!policy.ok()) pacer::ExitWithError("pacerd", std::string(policy.status().message()));
  }
  if (o.sharding.snapshot_every == 0) pacer::ExitWithError("pacerd", "--snapshot-every must be > 0");
  if (o.sharding.max_datasets == 0 || o.sharding.max_datasets > pacer::kMaxDatasets) {
    pacer::ExitWithError("pacerd", "--max-datasets must be in 1.." + std::to_string(pacer::kMaxDatasets));
  }
  if (o.sharding.max_files_total == 0 || o.sharding.max_files_total > pacer::kMaxFilesTotal) {
    pacer::ExitWithError("pacerd", "--max-files must be in 1.." + std::to_string(pacer::kMaxFilesTotal));
  }
  if (o.sharding.max_dataset_bytes < (uint64_t{1} << 20) || o.sharding.max_dataset_bytes > (uint64_t{1} << 36)) {
    pacer::ExitWithError("pacerd", "--max-dataset-bytes must be in 1048576..68719476736");
  }
  if (o.sharding.max_workers == 0 || o.sharding.max_workers > pacer::kMaxWorkers) {
    pacer::ExitWithError("pacerd", "--max-workers must be in 1.." + std::to_string(pacer::kMaxWorkers));
  }
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"lease-timeout-ms", o.sharding.lease_timeout_ms},
                                    {"worker-timeout-ms", o.sharding.worker_timeout_ms},
                                    {"heartbeat-interval-ms", o.sharding.heartbeat_interval_ms},
                                    {"reconcile-interval-ms", o.reconciler.interval_ms}}) {
    if (value <= 0 || value > 24LL * 3600 * 1000) {
      pacer::ExitWithError("pacerd", std::string("--") + flag + " must be in 1..86400000 (ms), not " +
                                         std::to_string(value));
    }
  }
  if (o.sharding.heartbeat_interval_ms >= o.sharding.lease_timeout_ms) {
    pacer::ExitWithError("pacerd", "--heartbeat-interval-ms must be below --lease-timeout-ms");
  }
  if (o.reconciler.restart_cost_s < 0) pacer::ExitWithError("pacerd", "--restart-cost-s must be >= 0");
  if (!o.tls_client_ca.empty() && (o.tls_cert.empty() || o.tls_key.empty())) {
    pacer::ExitWithError("pacerd", "--tls-client-ca needs --tls-cert and --tls-key (mTLS is TLS "
                                   "with client certificates; it cannot serve plaintext)");
  }
  if (!port_file.empty()) {
    // Checked before serving: a port file that cannot be written would leave its reader waiting.
    const std::filesystem::path dir = std::filesystem::path(port_file).parent_path();
    std::error_code ec;
    if (!dir.empty() && !std::filesystem::is_directory(dir, ec)) {
      pacer::ExitWithError("pacerd", "--port-file: directory '" + dir.string() + "' does not exist");
    }
  }
  if (!job_token_file.empty()) {
    auto t = pacer::LoadToken(job_token_file, false);
    if (!t.ok()) pacer::ExitWithError("pacerd", std::string(t.status().message()));
    o.job_token = *t;
  }
  if (!admin_token_file.empty()) {
    auto t = pacer::LoadToken(admin_token_file, false);
    if (!t.ok()) pacer::ExitWithError("pacerd", std::string(t.status().message()));
    o.admin_token = *t;
  }

  if (!etcd_password_file.empty()) {
    std::ifstream in(etcd_password_file);
    std::string password;
    if (!in || !std::getline(in, password)) {
      pacer::ExitWithError("pacerd", "--etcd-password-file: cannot read '" + etcd_password_file + "'");
    }
    o.etcd.password = password;
  }
  if (!o.etcd.user.empty() && o.etcd.password.empty()) {
    pacer::ExitWithError("pacerd", "--etcd-user needs --etcd-password-file");
  }

  // Signals are taken by sigwait in one thread. Before pacerd serves (a standby waiting to lead,
  // or a journal being replayed) a signal ends the process at once: it holds nothing to hand over.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::Mutex signal_mu;
  int signalled = 0;
  bool serving = false;
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    absl::MutexLock l(&signal_mu);
    if (!serving) {
      PACER_LOG(INFO) << "signal " << sig << " before serving: exiting";
      std::_Exit(0);
    }
    signalled = sig;
  });
  signal_thread.detach();

  auto pacerd = pacer::Pacerd::Start(o);
  if (!pacerd.ok()) {
    // One line; damage says DATA_LOSS (the file and what is missing are in the message).
    const absl::Status& s = pacerd.status();
    std::string line = s.code() == absl::StatusCode::kDataLoss
                           ? "DATA_LOSS: " + std::string(s.message())
                           : std::string(s.message());
    std::replace(line.begin(), line.end(), '\n', ' ');
    pacer::ExitWithError("pacerd", line, 1);
  }
  {
    absl::MutexLock l(&signal_mu);
    serving = true;  // from now on a signal shuts down cleanly (a leader resigns)
  }
  PACER_LOG(INFO) << "serving on " << (*pacerd)->address() << ", metrics on port "
                  << (*pacerd)->metrics_port() << ", data dir " << o.data_dir;
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    bool written = false;
    {
      std::ofstream out(tmp);
      out << "{\"port\":" << (*pacerd)->port() << ",\"metrics_port\":" << (*pacerd)->metrics_port()
          << "}\n";
      written = static_cast<bool>(out.flush());
    }
    std::error_code ec;
    if (written) std::filesystem::rename(tmp, port_file, ec);
    if (!written || ec) {
      PACER_LOG(ERROR) << "cannot write the port file '" << port_file << "'"
                       << (ec ? ": " + ec.message() : std::string()) << "; shutting down";
      (*pacerd)->Shutdown();
      return 1;
    }
  }
  int sig = 0;
  {
    absl::MutexLock l(&signal_mu);
    signal_mu.Await(absl::Condition(+[](int* s) { return *s != 0; }, &signalled));
    sig = signalled;
  }
  PACER_LOG(INFO) << "signal " << sig << ": shutting down";
  (*pacerd)->Shutdown();
  return 0;
}
