#include "worker_sdk/client_options.h"

#include <boost/program_options.hpp>
#include <cstdlib>

#include "common/auth.h"

namespace pacer {
namespace {

void FromEnv(std::string& field, const char* name) {
  if (!field.empty()) return;
  if (const char* v = std::getenv(name); v != nullptr && *v != '\0') field = v;
}

}  // namespace

absl::Status ClientOptions::Resolve() {
  FromEnv(address, "PACER_ADDR");
  FromEnv(job, "PACER_JOB");
  FromEnv(worker_id, "PACER_WORKER_ID");
  FromEnv(token, "PACER_TOKEN");
  FromEnv(node, "PACER_NODE");
  if (address.empty()) address = "127.0.0.1:7070";
  if (worker_id.empty()) {
    return absl::InvalidArgumentError("worker id missing: pass --worker-id or set PACER_WORKER_ID");
  }
  if (token.empty() && !token_file.empty()) {
    auto t = LoadToken(token_file, /*create=*/false);
    if (!t.ok()) {
      return absl::InvalidArgumentError("token file '" + token_file +
                                        "': " + std::string(t.status().message()));
    }
    token = *t;
  }
  if (token.empty()) {
    return absl::InvalidArgumentError(
        "job token missing: pass --token / --token-file or set PACER_TOKEN");
  }
  if (initial_micro_batch == 0 || initial_accumulation_steps == 0) {
    return absl::InvalidArgumentError("initial micro batch and accumulation steps must be > 0");
  }
  return absl::OkStatus();
}

void AddClientFlags(boost::program_options::options_description& desc, ClientOptions* o) {
  namespace po = boost::program_options;
  desc.add_options()
      ("addr", po::value(&o->address), "pacerd address host:port (default $PACER_ADDR or 127.0.0.1:7070)")
      ("job", po::value(&o->job), "job name (default $PACER_JOB)")
      ("worker-id", po::value(&o->worker_id), "worker id (default $PACER_WORKER_ID)")
      ("token", po::value(&o->token), "job token (default $PACER_TOKEN)")
      ("token-file", po::value(&o->token_file), "file holding the job token")
      ("node", po::value(&o->node), "node name (default $PACER_NODE)")
      ("heartbeat-ms", po::value(&o->heartbeat_interval_ms),
       "heartbeat interval (default: the one pacerd gives at registration)")
      ("connect-budget-ms", po::value(&o->connect_budget_ms),
       "how long to retry an unreachable pacerd at start");
}

}  // namespace pacer
