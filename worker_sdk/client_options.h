// ClientOptions: how a worker finds its job's pacerd, from flags or the environment the node
// agent sets (docs/design.md §5): PACER_ADDR, PACER_JOB, PACER_WORKER_ID, PACER_TOKEN, PACER_NODE,
// PACER_RUN_ID.
//
// Precedence: an explicit field (a flag) wins over the environment, which wins over defaults.
// A token may come from a file (`token_file`, 0600, as pacerd writes <data_dir>/job.token).
//
// torchrun's environment is the fallback for the identity (the same for every SDK language,
// since the Python and C bindings resolve through here):
//   worker_id  PACER_WORKER_ID, else "w<RANK>" from torchrun's global RANK. "w<rank>" is the
//              name pacer-agent gives rank <rank> by default (--worker-id-prefix w), so a script
//              has the same worker ids (pacerctl contention w1 ...) under torchrun and the agent.
//              RANK must be a non-negative integer; LOCAL_RANK / GROUP_RANK are not used.
//   job        PACER_JOB, else TORCHELASTIC_RUN_ID (only names the job in log lines).
//   run_id     PACER_RUN_ID, else TORCHELASTIC_RUN_ID. torchrun's default run id "none" (no
//              --rdzv-id and no --standalone) names no run and is ignored.
// The token has no torchrun counterpart: without PACER_TOKEN / a token file Resolve() refuses,
// also for a pacerd on loopback (pacerd checks the token on every call; nothing is weakened).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "common/tls.h"

namespace boost::program_options {
class options_description;
}

namespace pacer {

// Fault injection for tests (never set in production): asked before every attempt of a call
// that leases a shard (its request id, the attempt from 1) how that attempt's reply is lost.
// kTinyDeadline gives the attempt a 10 µs deadline (pacerd may or may not commit the lease
// before the client gives up on the reply); kDropReply sends it normally, then discards a
// successful reply as if the network had lost it (DEADLINE_EXCEEDED): the lease is committed
// and never seen. See ShardingClient.
enum class LoseReply { kNone, kTinyDeadline, kDropReply };
using LoseReplyHook = std::function<LoseReply(uint64_t request_id, int attempt)>;

struct ClientOptions {
  std::string address;     // host:port of pacerd; PACER_ADDR; default 127.0.0.1:7070
  std::string job;         // PACER_JOB; names the job in log lines (pacerd serves one job)
  std::string worker_id;   // PACER_WORKER_ID; required
  std::string token;       // PACER_TOKEN; required (or token_file)
  std::string token_file;  // read when `token` is empty
  std::string node;        // PACER_NODE; the node (host, pod) this worker runs on
  std::string run_id;      // PACER_RUN_ID or TORCHELASTIC_RUN_ID; empty when neither is set

  int64_t rpc_timeout_ms = 10'000;      // one attempt of one RPC
  int64_t connect_budget_ms = 60'000;   // Connect retries an unreachable pacerd this long
  int64_t call_budget_ms = 120'000;     // background calls (fetch, heartbeat) per attempt cycle
  int64_t heartbeat_interval_ms = 0;    // 0: the interval pacerd returns at registration
  bool report_steps = true;             // send StepTimer reports to the monitor
  // The trainer carries out exclusion (Client::excluded(): weight 0 in the all-reduce, leases
  // handed back with ShardReader::ReleaseAll, speed still measured on a probe batch). pacerd
  // excludes a worker only while every live worker of the job says so.
  bool honors_exclusion = false;

  // The batch plan in force until the controller sends one (see batch_plan.h).
  uint32_t initial_micro_batch = 32;
  uint32_t initial_accumulation_steps = 1;
  // The largest micro-batch that fits this worker's memory; the controller's batch plans stay
  // at or under it (sent in every heartbeat). 0: unknown, no cap.
  uint32_t max_local_batch = 0;

  // TLS to pacerd (common/tls.h): --tls-ca/--tls-cert/--tls-key/--tls-server-name or
  // PACER_TLS_CA/_CERT/_KEY/_SERVER_NAME; without TLS only a loopback address is dialled unless
  // allow_insecure (--allow-insecure, PACER_ALLOW_INSECURE=1).
  TlsClientOptions tls;
  // Set by Resolve() from `tls` when empty; a caller may set its own (then `tls` only adds the
  // server name override).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  LoseReplyHook test_lose_lease_reply;  // tests only (above)

  // Fills empty fields from the environment (PACER_*, then torchrun's, above), then reads
  // token_file when the token is still empty. INVALID_ARGUMENT names what is missing or
  // unreadable, by its environment variable (what every SDK language reads) and, after it,
  // the C++ tools' flag. Then makes `credentials` from `tls` (INVALID_ARGUMENT for plaintext to
  // a non-loopback address, or a TLS file that is missing or wrong).
  absl::Status Resolve();
};

// Adds --addr, --job, --worker-id, --token, --token-file, --node, --heartbeat-ms and the TLS
// flags (AddTlsClientFlags: --tls-ca, --tls-cert, --tls-key, --tls-server-name,
// --allow-insecure) to `desc`,
// writing into `options` (flags override the environment; call Resolve() after parsing).
void AddClientFlags(boost::program_options::options_description& desc, ClientOptions* options);

}  // namespace pacer
