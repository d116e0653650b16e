// pacer-ps: one parameter server of a job (worker_sdk/ps/ps_server.h).
//
//   pacer-ps --listen 127.0.0.1:0 --server-id ps0 --token-file DATA/job.token --port-file ps0.port
//            [--state-dir DIR/ps0 --snapshot-ms 5000]
//
// With --state-dir the rows survive a restart: loaded at start, saved every --snapshot-ms and on
// SIGTERM/SIGINT (ps_server.h). Exit codes: 0 stopped (last snapshot saved), 1 startup error
// (e.g. a corrupt snapshot), 2 bad flags, 4 the last snapshot could not be saved.
#include <csignal>
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
  po::options_description desc("Options");
  desc.add_options()
      ("listen", po::value(&o.listen)->default_value(o.listen), "gRPC address HOST:PORT (port 0: any)")
      ("server-id", po::value(&o.server_id)->default_value(o.server_id), "name in latency stats")
      ("token-file", po::value(&token_file), "job token file; calls must carry the token")
      ("port-file", po::value(&port_file), "write {\"port\":P} here once serving")
      ("state-dir", po::value(&o.state_dir), "keep the rows durable in DIR/ps.snapshot (one dir per server)")
      ("snapshot-ms", po::value(&o.snapshot_ms)->default_value(o.snapshot_ms),
       "with --state-dir: save this often when rows changed (and always on SIGTERM)");
  pacer::ParseFlagsOrExit(argc, argv, "Usage: pacer-ps [options]", desc);
  if (!token_file.empty()) {
    std::ifstream f(token_file);
    std::getline(f, o.job_token);
    if (o.job_token.empty()) pacer::ExitWithError("pacer-ps", "cannot read a token from " + token_file);
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before gRPC starts its threads
  auto server = pacer::PsServer::Start(o);
  if (!server.ok()) pacer::ExitWithError("pacer-ps", server.status().ToString(), 1);
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
