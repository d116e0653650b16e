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

// torchrun's run id; its default "none" (no --rdzv-id, no --standalone) names no run.
std::string TorchRunId() {
  const char* v = std::getenv("TORCHELASTIC_RUN_ID");
  if (v == nullptr || *v == '\0' || std::string(v) == "none") return "";
  return v;
}

}  // namespace

absl::Status ClientOptions::Resolve() {
  FromEnv(address, "PACER_ADDR");
  FromEnv(job, "PACER_JOB");
  FromEnv(worker_id, "PACER_WORKER_ID");
  FromEnv(token, "PACER_TOKEN");
  FromEnv(node, "PACER_NODE");
  FromEnv(run_id, "PACER_RUN_ID");
  if (run_id.empty()) run_id = TorchRunId();
  if (job.empty()) job = TorchRunId();
  if (address.empty()) address = "127.0.0.1:7070";
  if (worker_id.empty()) {
    const char* rank = std::getenv("RANK");
    if (rank != nullptr && *rank != '\0') {
      const std::string r = rank;
      if (r.size() > 9 || r.find_first_not_of("0123456789") != std::string::npos) {
        return absl::InvalidArgumentError(
            "worker id missing: PACER_WORKER_ID is not set and RANK='" + r +
            "' is not a rank (a non-negative integer); set PACER_WORKER_ID");
      }
      worker_id = "w" + std::to_string(std::stoul(r));  // "007" -> "w7", as the agent names it
    }
  }
  if (worker_id.empty()) {
    return absl::InvalidArgumentError(
        "worker id missing: set PACER_WORKER_ID (or run under torchrun / pacer-agent, which set "
        "RANK); the C++ tools also take --worker-id");
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
        "job token missing: set PACER_TOKEN to the job token (pacerd writes it to "
        "<data_dir>/job.token; pacer-agent passes it on); the C++ tools also take --token / "
        "--token-file");
  }
  if (initial_micro_batch == 0 || initial_accumulation_steps == 0) {
    return absl::InvalidArgumentError("initial micro batch and accumulation steps must be > 0");
  }
  tls.FillFromEnvironment();
  if (credentials == nullptr) {
    auto creds = MakeChannelCredentials(tls, address);
    if (!creds.ok()) return creds.status();
    credentials = *creds;
  }
  return absl::OkStatus();
}

void AddClientFlags(boost::program_options::options_description& desc, ClientOptions* o) {
  namespace po = boost::program_options;
  desc.add_options()
      ("addr", po::value(&o->address), "pacerd address host:port (default $PACER_ADDR or 127.0.0.1:7070)")
      ("job", po::value(&o->job), "job name (default $PACER_JOB)")
      ("worker-id", po::value(&o->worker_id), "worker id (default $PACER_WORKER_ID, else w$RANK)")
      ("token", po::value(&o->token), "job token (default $PACER_TOKEN)")
      ("token-file", po::value(&o->token_file), "file holding the job token")
      ("node", po::value(&o->node), "node name (default $PACER_NODE)")
      ("heartbeat-ms", po::value(&o->heartbeat_interval_ms),
       "heartbeat interval (default: the one pacerd gives at registration)")
      ("connect-budget-ms", po::value(&o->connect_budget_ms),
       "how long to retry an unreachable pacerd at start");
  AddTlsClientFlags(desc, &o->tls);
}

}  // namespace pacer
