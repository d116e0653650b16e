// pacer-agent: the node agent (docs/design.md §5). Launches and supervises the worker processes of
// one node, reports node metrics and worker states to pacerd, and carries out its commands.
//
//   pacer-agent --addr HOST:PORT --token-file F --node N --workers 2 -- python train.py
//
// Exit codes: 0 workers finished (or SIGTERM), 1 startup error, 2 bad flags, 3 workers failed
// (restart limit), 75 migrated (pacerd told the agent to leave this node; with --kubernetes only
// after the own pod was deleted).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "agent/node_agent.h"
#include "agent/proc_stats.h"
#include "common/auth.h"
#include "common/flags.h"
#include "common/log.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  pacer::SetLogProgramName("pacer-agent");
  pacer::NodeAgentOptions o;
  std::string token_file, method = "auto";
  std::vector<std::string> contention;
  bool kubernetes = false, mark_node = false;
  int64_t attach_poll_ms = o.attach_poll_ms, attach_restart_timeout_ms = o.attach_restart_timeout_ms;
  int64_t kube_refusal_hold_ms = 60'000;
  pacer::KubeFlags kube;
  int64_t kube_timeout_ms = 10'000, kube_backoff_ms = 500;
  int kube_attempts = 6;
  int64_t workers = o.num_workers, first_rank = 0, world_size = 0, nnodes = 0, node_rank = -1,
          master_port = 0, max_restarts = o.restart.max_restarts;
  std::string scope = "group";
  std::string worker_credentials = "mint";
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  o.node = host;
  if (const char* n = std::getenv("PACER_NODE"); n && *n) o.node = n;
  if (const char* a = std::getenv("PACER_ADDR"); a && *a) o.address = a;
  if (const char* t = std::getenv("PACER_TOKEN"); t && *t) o.token = t;

  po::options_description desc("Options");
  desc.add_options()
      ("addr", po::value(&o.address), "pacerd HOST:PORT (default $PACER_ADDR); empty: no pacerd")
      ("token-file", po::value(&token_file), "file holding the job token (without it: $PACER_TOKEN, the token itself)")
      ("job", po::value(&o.job)->default_value(o.job), "job name (PACER_JOB for workers)")
      ("node", po::value(&o.node)->default_value(o.node), "node name (default $PACER_NODE or the host name)")
      ("agent-id", po::value(&o.agent_id), "agent id (default: the node name)")
      ("workers", po::value(&workers)->default_value(workers),
       "worker processes on this node (torchrun's --nproc-per-node)")
      ("first-rank", po::value(&first_rank)->default_value(first_rank),
       "global rank of local worker 0 (default: --node-rank x --workers)")
      ("world-size", po::value(&world_size)->default_value(world_size),
       "workers in the job (0: --nnodes x --workers, else --workers)")
      ("nnodes", po::value(&nnodes)->default_value(nnodes),
       "nodes (agents) in the job, GROUP_WORLD_SIZE (0: world size / --workers, rounded up)")
      ("node-rank", po::value(&node_rank)->default_value(node_rank),
       "this node's index, GROUP_RANK (-1: --first-rank / --workers)")
      ("master-addr", po::value(&o.master_addr),
       "MASTER_ADDR for torch.distributed (default 127.0.0.1 on a single node)")
      ("master-port", po::value(&master_port)->default_value(master_port),
       "MASTER_PORT (0: a free port picked at every start of the group; single node only)")
      ("run-id", po::value(&o.run_id),
       "TORCHELASTIC_RUN_ID and PACER_RUN_ID (default $PACER_RUN_ID, else --job); the same on every node")
      ("worker-id-prefix", po::value(&o.worker_id_prefix)->default_value(o.worker_id_prefix),
       "worker i is PREFIX<rank>")
      ("restart-scope", po::value(&scope)->default_value(scope),
       "what a crash restarts: group (every local worker, torchrun's model, for synchronous "
       "training) or worker (only the crashed one: asynchronous workers, parameter servers)")
      ("worker-credentials", po::value(&worker_credentials)->default_value(worker_credentials),
       "mint: each worker gets its own credential in PACER_TOKEN, minted from the job token "
       "(rank 0 the chief's); inherit: workers get the agent's token (parameter servers, which "
       "verify the workers' credentials)")
      ("max-restarts", po::value(&max_restarts)->default_value(max_restarts),
       "crash restarts (of the group, or per worker with --restart-scope worker) before giving up")
      ("backoff-initial-ms", po::value(&o.restart.backoff_initial_ms)->default_value(o.restart.backoff_initial_ms),
       "delay before the first relaunch after a crash (doubles per crash in a row)")
      ("backoff-max-ms", po::value(&o.restart.backoff_max_ms)->default_value(o.restart.backoff_max_ms),
       "longest relaunch delay")
      ("reset-after-ms", po::value(&o.restart.reset_after_ms)->default_value(o.restart.reset_after_ms),
       "a worker that ran this long before crashing starts a new backoff streak")
      ("stop-grace-ms", po::value(&o.restart.stop_grace_ms)->default_value(o.restart.stop_grace_ms),
       "SIGTERM, then SIGKILL after this")
      ("heartbeat-ms", po::value(&o.heartbeat_interval_ms)->default_value(o.heartbeat_interval_ms),
       "heartbeat interval (pacerd may suggest another)")
      ("heartbeat-timeout-ms", po::value(&o.heartbeat_timeout_ms)->default_value(o.heartbeat_timeout_ms),
       "deadline of one heartbeat")
      ("heartbeat-backoff-max-ms", po::value(&o.heartbeat_backoff_max_ms)->default_value(o.heartbeat_backoff_max_ms),
       "longest wait between heartbeats while pacerd is unreachable")
      ("metrics-ms", po::value(&o.metrics_interval_ms)->default_value(o.metrics_interval_ms),
       "node metrics interval")
      ("contention", po::value(&contention)->composing(),
       "WORKER:FACTOR, slow WORKER down FACTOR times with real CPU contention from the start "
       "(local demos; repeatable)")
      ("contention-method", po::value(&method)->default_value(method),
       "auto (cgroup v1 cpu quota where writable, else a pinned CPU hog), cgroup or cpu-hog")
      ("cgroup-root", po::value(&o.contention.cgroup_root)->default_value(o.contention.cgroup_root),
       "cgroup mount root")
      ("worker-cpu-limit", po::value(&o.contention.worker_cpu_limit_cores)->default_value(0),
       "cores each worker may use (own cgroup, like a container's CPU limit); 0: no limit")
      ("contention-period-us", po::value(&o.contention.cfs_period_us)->default_value(o.contention.cfs_period_us),
       "CFS period of the cgroup contention method (µs; widened if the quota would fall under 1 ms)")
      ("no-nvml", "do not try NVML for GPU utilisation")
      ("attach", po::value(&o.attach_pattern),
       "sidecar form: do not launch a worker; watch the running process whose command line "
       "contains this (e.g. train.py; a pod with shareProcessNamespace), restart it by signal")
      ("attach-poll-ms", po::value(&attach_poll_ms)->default_value(attach_poll_ms),
       "how often --attach looks for the process in /proc")
      ("attach-restart-timeout-ms", po::value(&attach_restart_timeout_ms)->default_value(attach_restart_timeout_ms),
       "a restart under --attach fails when no new process appears within this")
      ("kubernetes", po::bool_switch(&kubernetes),
       "Kubernetes mode: migrate deletes the own pod through the API server (see README)")
      ("k8s-api-url", po::value(&kube.api_url),
       "API server https://HOST[:PORT] (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
      ("k8s-token-file", po::value(&kube.token_file),
       "service account token (default <sa>/token, sa = /var/run/secrets/kubernetes.io/serviceaccount)")
      ("k8s-ca-file", po::value(&kube.ca_file), "CA bundle to verify the API server (default <sa>/ca.crt)")
      ("k8s-namespace", po::value(&kube.namespace_name), "own namespace (default $POD_NAMESPACE, else <sa>/namespace)")
      ("k8s-pod-name", po::value(&kube.pod_name), "own pod name (default $POD_NAME, from the downward API)")
      ("k8s-pod-uid", po::value(&kube.pod_uid),
       "own pod uid (default $POD_UID): delete only this pod, never a replacement with the same name")
      ("k8s-allow-http", po::bool_switch(&kube.allow_insecure_http), "accept an http:// API URL (tests only)")
      ("k8s-mark-node", po::bool_switch(&mark_node),
       "on migrate, label the own node bad-node.pacer.dev/<job> before deleting the pod, so the "
       "replacement avoids it (needs patch on nodes: deploy/node-marking)")
      ("k8s-node-name", po::value(&kube.node_name), "own node name (default $NODE_NAME, downward API spec.nodeName)")
      ("k8s-refusal-hold-ms", po::value(&kube_refusal_hold_ms)->default_value(kube_refusal_hold_ms),
       "after a 401/403 from the API server, ask nothing more for this long (0: no hold)")
      ("k8s-request-timeout-ms", po::value(&kube_timeout_ms)->default_value(kube_timeout_ms),
       "deadline of one API request (connect, TLS, reply)")
      ("k8s-max-attempts", po::value(&kube_attempts)->default_value(kube_attempts),
       "API attempts on 5xx / connection errors before the migrate command fails")
      ("k8s-backoff-initial-ms", po::value(&kube_backoff_ms)->default_value(kube_backoff_ms),
       "delay before the first API retry (doubles per retry, at most 8 s)");
  pacer::AddTlsClientFlags(desc, &o.tls);  // --tls-ca/--tls-cert/--tls-key/--tls-server-name/--allow-insecure
  auto flags = pacer::ParseFlagsOrExit(
      argc, argv,
      "Usage: pacer-agent [options] -- <worker command ...>\n\n"
      "Runs and supervises this node's worker processes for pacerd.\n"
      "In the worker command, {worker_id}, {rank} and {local_rank} are replaced per worker.\n"
      "Exit codes: 0 workers finished or SIGTERM, 1 startup error, 2 bad flags, 3 workers failed,\n"
      "75 migrated (told to leave this node).",
      desc);
  auto refuse_below = [](const char* flag, int64_t v, int64_t min) {
    if (v < min) {
      pacer::ExitWithError("pacer-agent", "--" + std::string(flag) + " must be at least " +
                                              std::to_string(min) + ", not " + std::to_string(v));
    }
  };
  constexpr int64_t kMaxRank = 1 << 24;
  refuse_below("workers", workers, 1);
  refuse_below("first-rank", first_rank, 0);
  refuse_below("world-size", world_size, 0);
  refuse_below("nnodes", nnodes, 0);
  refuse_below("node-rank", node_rank, -1);
  refuse_below("master-port", master_port, 0);
  refuse_below("max-restarts", max_restarts, 0);
  refuse_below("stop-grace-ms", o.restart.stop_grace_ms, 0);
  refuse_below("backoff-initial-ms", o.restart.backoff_initial_ms, 0);
  refuse_below("backoff-max-ms", o.restart.backoff_max_ms, 0);
  for (auto [flag, v] : {std::pair{"workers", workers}, {"first-rank", first_rank},
                         {"world-size", world_size}, {"nnodes", nnodes}, {"node-rank", node_rank},
                         {"max-restarts", max_restarts}}) {
    if (v > kMaxRank) pacer::ExitWithError("pacer-agent", "--" + std::string(flag) + " " + std::to_string(v) + " is too large");
  }
  if (master_port > 65535) pacer::ExitWithError("pacer-agent", "--master-port must be in 0..65535");
  if (nnodes > 0 && node_rank >= nnodes) {
    pacer::ExitWithError("pacer-agent", "--node-rank " + std::to_string(node_rank) +
                                            " must be below --nnodes " + std::to_string(nnodes));
  }
  if (worker_credentials == "mint" || worker_credentials == "inherit") {
    o.mint_worker_credentials = worker_credentials == "mint";
  } else {
    pacer::ExitWithError("pacer-agent", "--worker-credentials must be mint or inherit, not '" +
                                            worker_credentials + "'");
  }
  if (scope == "group") {
    o.restart.scope = pacer::RestartScope::kGroup;
  } else if (scope == "worker") {
    o.restart.scope = pacer::RestartScope::kWorker;
  } else {
    pacer::ExitWithError("pacer-agent", "--restart-scope must be group or worker, not '" + scope + "'");
  }
  if (node_rank >= 0 && flags.vm["first-rank"].defaulted()) first_rank = node_rank * workers;
  o.num_workers = static_cast<uint32_t>(workers);
  o.first_rank = static_cast<uint32_t>(first_rank);
  o.world_size = static_cast<uint32_t>(world_size);
  o.nnodes = static_cast<uint32_t>(nnodes);
  o.node_rank = node_rank;
  o.master_port = static_cast<uint32_t>(master_port);
  o.restart.max_restarts = static_cast<uint32_t>(max_restarts);
  if (o.run_id.empty()) {
    if (const char* r = std::getenv("PACER_RUN_ID"); r && *r) o.run_id = r;
  }
  o.worker_command = flags.passthrough;
  if (o.worker_command.empty() && o.attach_pattern.empty()) {
    pacer::ExitWithError("pacer-agent", "no worker command after -- (or --attach PATTERN)");
  }
  if (!o.worker_command.empty() && !o.attach_pattern.empty()) {
    pacer::ExitWithError("pacer-agent", "--attach and a worker command after -- exclude each other");
  }
  refuse_below("attach-poll-ms", attach_poll_ms, 1);
  refuse_below("attach-restart-timeout-ms", attach_restart_timeout_ms, 1);
  refuse_below("k8s-refusal-hold-ms", kube_refusal_hold_ms, 0);
  o.attach_poll_ms = attach_poll_ms;
  o.attach_restart_timeout_ms = attach_restart_timeout_ms;
  if (mark_node && !kubernetes) pacer::ExitWithError("pacer-agent", "--k8s-mark-node needs --kubernetes");
  o.kubernetes_mark_node = mark_node;
  if (!pacer::ParseContentionMethod(method, &o.contention.method)) {
    pacer::ExitWithError("pacer-agent", "--contention-method must be auto, cgroup or cpu-hog");
  }
  o.metrics_sources.cgroup_root = o.contention.cgroup_root;
  o.metrics_sources.use_nvml = !flags.vm.count("no-nvml");
  for (const std::string& c : contention) {
    const size_t colon = c.rfind(':');
    double factor = 0;
    if (colon == std::string::npos || !absl::SimpleAtod(c.substr(colon + 1), &factor)) {
      pacer::ExitWithError("pacer-agent", "--contention wants WORKER:FACTOR, not '" + c + "'");
    }
    o.initial_contention[c.substr(0, colon)] = factor;
  }
  if (!token_file.empty()) {
    auto t = pacer::LoadToken(token_file, false);
    if (!t.ok()) pacer::ExitWithError("pacer-agent", std::string(t.status().message()));
    o.token = *t;
  }
  o.tls.FillFromEnvironment();
  for (std::string* f : {&o.tls.ca_file, &o.tls.cert_file, &o.tls.key_file}) {
    if (!f->empty()) *f = std::filesystem::absolute(*f).string();  // workers may run elsewhere
  }
  if (!o.address.empty()) {  // the files and plaintext off loopback, checked before anything starts
    if (auto c = pacer::MakeChannelCredentials(o.tls, o.address); !c.ok()) {
      pacer::ExitWithError("pacer-agent", std::string(c.status().message()));
    }
  }
  if (kubernetes) {
    auto k = pacer::ResolveKubeClientOptions(kube, pacer::KubeEnvironment());
    if (!k.ok()) pacer::ExitWithError("pacer-agent", "--kubernetes: " + std::string(k.status().message()), 1);
    if (kube_timeout_ms <= 0 || kube_attempts <= 0 || kube_backoff_ms < 0) {
      pacer::ExitWithError("pacer-agent", "--k8s-request-timeout-ms and --k8s-max-attempts must be > 0");
    }
    k->attempt_timeout_ms = kube_timeout_ms;
    k->max_attempts = kube_attempts;
    k->backoff_initial_ms = kube_backoff_ms;
    k->refusal_hold_ms = kube_refusal_hold_ms;
    o.kubernetes = *k;
  }
  auto agent = pacer::NodeAgent::Create(std::move(o));
  if (!agent.ok()) pacer::ExitWithError("pacer-agent", std::string(agent.status().message()));
  return (*agent)->Run();
}
