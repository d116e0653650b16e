// pacer-ps: one parameter server of a job (worker_sdk/ps/ps_server.h).
//
//   pacer-ps --listen 127.0.0.1:0 --server-id ps0 --token-file DATA/job.token --port-file ps0.port
//            [--state-dir DIR/ps0 --snapshot-ms 5000] [--tls-cert C --tls-key K [--tls-client-ca CA]]
//
// The job token comes from --token-file or PACER_TOKEN (pacer-agent --worker-credentials inherit
// passes it); without one pacer-ps refuses to start unless --insecure-no-auth on a loopback
// --listen. Plaintext on a non-loopback address needs --tls-cert/--tls-key or --allow-insecure.
// The --max-* flags bound what clients can make it hold (ps_limits.h): RESOURCE_EXHAUSTED past one.
//
// With --state-dir the rows survive a restart: loaded at start, saved every --snapshot-ms and on
// SIGTERM/SIGINT (ps_server.h). Exit codes: 0 stopped (last snapshot saved), 1 startup error
// (e.g. a corrupt snapshot), 2 bad flags, 4 the last snapshot could not be saved.
#include <malloc.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include <boost/program_options.hpp>

#include "common/auth.h"
#include "common/flags.h"
#include "worker_sdk/ps/ps_server.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  pacer::PsServerOptions o;
  std::string token_file, port_file;
  int64_t max_threads = o.max_threads, snapshot_ms = o.snapshot_ms, reload_s = o.tls.reload_interval_s;
  int64_t keys = static_cast<int64_t>(o.limits.max_keys_per_request),
          values = static_cast<int64_t>(o.limits.max_values_per_request),
          tables = static_cast<int64_t>(o.limits.max_tables),
          table_rows = static_cast<int64_t>(o.limits.max_table_rows), table_bytes = 0,
          server_rows = static_cast<int64_t>(o.limits.max_server_rows), server_bytes = 0;
  po::options_description desc("Options");
  desc.add_options()
      ("listen", po::value(&o.listen)->default_value(o.listen), "gRPC address HOST:PORT (port 0: any)")
      ("server-id", po::value(&o.server_id)->default_value(o.server_id), "name in latency stats")
      ("token-file", po::value(&token_file), "file holding the job token (without it: $PACER_TOKEN, the token itself); calls must carry it or a credential minted from it")
      ("insecure-no-auth", po::bool_switch(&o.insecure_no_auth), "serve without a token (development; loopback --listen only)")
      ("tls-cert", po::value(&o.tls.cert_file), "server certificate (PEM); enables TLS")
      ("tls-key", po::value(&o.tls.key_file), "server private key (PEM)")
      ("tls-client-ca", po::value(&o.tls.client_ca_file), "CA for client certificates (mTLS; needs --tls-cert/--tls-key)")
      ("tls-reload-s", po::value(&reload_s)->default_value(reload_s), "re-read the TLS files this often (seconds, 1..3600)")
      ("allow-insecure", po::bool_switch(&o.tls.allow_insecure), "allow plaintext on a non-loopback address")
      ("max-keys-per-request", po::value(&keys)->default_value(keys), "keys in one Pull or Push")
      ("max-values-per-request", po::value(&values)->default_value(values), "keys x dim floats in one Pull or Push (at most 16777216)")
      ("max-tables", po::value(&tables)->default_value(tables), "tables on this server")
      ("max-table-rows", po::value(&table_rows)->default_value(table_rows), "rows stored in one table")
      ("max-table-bytes", po::value(&table_bytes)->default_value(0), "bytes of rows in one table (0: --max-server-bytes)")
      ("max-server-rows", po::value(&server_rows)->default_value(server_rows), "rows stored on this server")
      ("max-server-bytes", po::value(&server_bytes)->default_value(0),
       "bytes of rows on this server (0: a quarter of the memory limit of its cgroup, else of the RAM)")
      ("max-threads", po::value(&max_threads)->default_value(max_threads), "calls served at once (1..1024); each may hold a request of up to --max-values-per-request floats")
      ("port-file", po::value(&port_file), "write {\"port\":P} here once serving")
      ("state-dir", po::value(&o.state_dir), "keep the rows durable in DIR/ps.snapshot (one dir per server)")
      ("snapshot-ms", po::value(&snapshot_ms)->default_value(snapshot_ms),
       "with --state-dir: save this often when rows changed (and always on SIGTERM)");
  pacer::ParseFlagsOrExit(argc, argv, "Usage: pacer-ps [options]", desc);
  // Requests and replies of many MiB come and go: a fixed mmap threshold gives each one its own
  // mapping, returned to the system when freed. glibc's default raises the threshold after the
  // first such free, after which they land in the heap arenas and stay (the process grew by
  // hundreds of MiB beyond its rows under a push flood).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  auto need = [](bool ok, const std::string& what) {
    if (!ok) pacer::ExitWithError("pacer-ps", what);
  };
  need(snapshot_ms > 0, "--snapshot-ms must be > 0");
  need(reload_s >= 1 && reload_s <= 3600, "--tls-reload-s must be in 1..3600");
  need(max_threads >= 1 && max_threads <= 1024, "--max-threads must be in 1..1024");
  for (auto [v, flag] : {std::pair{keys, "--max-keys-per-request"}, {values, "--max-values-per-request"},
                         {tables, "--max-tables"}, {table_rows, "--max-table-rows"},
                         {server_rows, "--max-server-rows"}}) {
    need(v > 0, std::string(flag) + " must be > 0");
  }
  need(table_bytes >= 0 && server_bytes >= 0, "--max-table-bytes and --max-server-bytes must be >= 0 (0: automatic)");
  o.snapshot_ms = snapshot_ms;
  o.tls.reload_interval_s = static_cast<int>(reload_s);
  o.max_threads = static_cast<int>(max_threads);
  o.limits.max_keys_per_request = static_cast<uint64_t>(keys);
  o.limits.max_values_per_request = static_cast<uint64_t>(values);
  o.limits.max_tables = static_cast<uint64_t>(tables);
  o.limits.max_table_rows = static_cast<uint64_t>(table_rows);
  o.limits.max_table_bytes = static_cast<uint64_t>(table_bytes);
  o.limits.max_server_rows = static_cast<uint64_t>(server_rows);
  o.limits.max_server_bytes = static_cast<uint64_t>(server_bytes);
  if (!token_file.empty()) {
    auto t = pacer::LoadToken(token_file, /*create=*/false);
    if (!t.ok()) pacer::ExitWithError("pacer-ps", "--token-file: " + std::string(t.status().message()));
    o.job_token = *t;
  } else if (const char* t = std::getenv("PACER_TOKEN"); t != nullptr && *t != '\0') {
    o.job_token = t;
  }
  if (!o.job_token.empty() && o.insecure_no_auth) {
    pacer::ExitWithError("pacer-ps", "--insecure-no-auth with a job token: give one or the other");
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before gRPC starts its threads
  auto server = pacer::PsServer::Start(o);
  if (!server.ok()) {
    // A refused configuration is a usage error (2); anything else a startup error (1).
    const bool usage = server.status().code() == absl::StatusCode::kInvalidArgument;
    std::string why = usage ? std::string(server.status().message()) : server.status().ToString();
    if (const size_t at = why.find("pacer-ps: "); at != std::string::npos) why.erase(at, 10);  // said once
    pacer::ExitWithError("pacer-ps", why, usage ? 2 : 1);
  }
  const std::string addr = (*server)->address();
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << "{\"port\":" << addr.substr(addr.rfind(':') + 1) << "}\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::cout << "pacer-ps " << o.server_id << " serving on " << addr << std::endl;
  int sig = 0;
  sigwait(&set, &sig);
  (*server)->Shutdown();
  if (absl::Status st = (*server)->SaveSnapshot(); !st.ok()) {  // retries a failed last save
    std::cerr << "pacer-ps: the last snapshot was not saved: " << st << std::endl;
    return 4;
  }
  return 0;
}
