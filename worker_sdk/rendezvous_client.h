// RendezvousClient and PacerdStore: the worker side of pacerd's rendezvous store
// (rendezvous/rendezvous_service.h, proto/pacer/rendezvous.proto).
//
// RendezvousClient is a thin synchronous stub with the job token attached. Join, Reform, Set,
// Add and Check retry UNAVAILABLE (pacerd restarting, a network blip) with capped backoff for
// up to `retry_budget_ms` (they are idempotent, Add aside: a retried Add may count twice, so
// it is not retried); Get with wait=true waits at most `timeout_ms` and then returns
// DEADLINE_EXCEEDED, never hangs. Thread-safe (gRPC stubs are).
//
// PacerdStore adapts it to gloo::rendezvous::Store for one generation: Gloo's connectFullMesh
// exchanges the ranks' addresses through it. Gloo's Store reports errors by exceptions; the
// store throws std::runtime_error and keeps the absl::Status in last_error() (ABORTED: the
// generation was superseded while rendezvousing, so the caller should rebuild under the new
// one). Not thread-safe (one rendezvous at a time, like Gloo's own stores).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/tls.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/pacer/rendezvous.grpc.pb.h"

namespace gloo::rendezvous {
class Store;
}

namespace pacer {

struct RendezvousClientOptions {
  std::string address;  // pacerd host:port
  std::string token;    // job token
  TlsClientOptions tls;  // common/tls.h; also the server name override with `credentials`
  // Default: made from `tls` (plaintext only to loopback); when that fails every call returns
  // the error.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  int64_t rpc_timeout_ms = 10'000;     // one attempt of a non-waiting call
  int64_t retry_budget_ms = 30'000;    // UNAVAILABLE retried this long
};

class RendezvousClient {
 public:
  explicit RendezvousClient(RendezvousClientOptions options);

  absl::StatusOr<RendezvousJoinResponse> Join(const std::string& worker_id, uint64_t incarnation,
                                              int rank, uint32_t world_size);
  // Asks for a new generation because `generation`'s collective failed; returns the current
  // generation (a newer one if another rank or a restarted worker moved it already).
  absl::StatusOr<uint64_t> Reform(const std::string& worker_id, uint64_t generation);
  absl::Status Set(uint64_t generation, const std::string& key, const std::string& value);
  // Values of `keys` in order. wait=false: NOT_FOUND when one is missing. wait=true: waits up
  // to `timeout` (DEADLINE_EXCEEDED); ABORTED when the generation is superseded meanwhile.
  absl::StatusOr<std::vector<std::string>> Get(uint64_t generation,
                                               const std::vector<std::string>& keys, bool wait,
                                               std::chrono::milliseconds timeout);
  absl::StatusOr<int64_t> Add(uint64_t generation, const std::string& key, int64_t delta);
  absl::StatusOr<bool> Check(uint64_t generation, const std::vector<std::string>& keys);

 private:
  template <typename Req, typename Resp, typename Call>
  absl::Status CallWithRetry(const Req& req, Resp* resp, Call call, bool retry);

  RendezvousClientOptions options_;
  absl::Status dial_status_;  // not OK when no credentials could be made (every call returns it)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Rendezvous::Stub> stub_;
};

// Creates a gloo::rendezvous::Store over `client` for `generation`; every wait is bounded by
// `timeout`. `last_error` (optional) receives the status of the call that threw.
std::unique_ptr<gloo::rendezvous::Store> MakePacerdStore(RendezvousClient* client,
                                                         uint64_t generation,
                                                         std::chrono::milliseconds timeout,
                                                         absl::Status* last_error = nullptr);

}  // namespace pacer
