// PsClient: a worker's view of the pacer-ps servers of its job (proto/pacer/ps.proto).
//
// Rows are spread over the servers by PsServerFor(table, key, n): every worker must list the
// servers in the same order. Pull and Push split the keys by server and call all servers in
// parallel; PushAsync returns at once with a future, so a trainer can compute the next batch
// while its gradients travel (asynchronous training: a pull may not see a push still in
// flight). Dense tensors are tables too: PullDense/PushDense map a flat vector of n floats to
// rows 0..ceil(n/dim)-1.
//
// Every call is timed per server; TakeLatency() returns, per server, the requests, mean and p99
// latency since the previous call, as the ServerLatency messages the monitor takes in
// ReportSteps (ReportLatency sends them).
//
// A call the server turns away for want of a thread (pacer-ps --max-threads; gRPC answers
// RESOURCE_EXHAUSTED "Server Threadpool Exhausted" before any handler runs, so nothing of it
// was applied) is made again after a short jittered pause, within rpc_timeout_ms: an
// overloaded server slows its callers down instead of failing them. Every other error,
// a limit of the server's store (RESOURCE_EXHAUSTED naming its --max-* flag) included, is
// returned at once.
//
// Thread-safe. Tables must be created (CreateTable, idempotent) through this client before use
// so it knows their row width.
#pragma once

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tls.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/ps.grpc.pb.h"

namespace pacer {

struct PsClientOptions {
  std::vector<std::string> servers;  // host:port, the same order on every worker
  std::vector<std::string> server_ids;  // names for latency stats; default "ps<i>"
  std::string token;                 // the job token (pacer-ps requires one unless run --insecure-no-auth)
  std::string reporter;              // this worker's id, in latency stats
  int64_t rpc_timeout_ms = 10'000;
  // TLS to the servers (common/tls.h), the same for every server; without it only loopback
  // servers are dialled unless allow_insecure. A trainer passes its ClientOptions::tls.
  TlsClientOptions tls;
};

class PsClient {
 public:
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(PsClientOptions options);

  // Creates the table on every server (an identical existing table is fine).
  absl::Status CreateTable(const PsTableSpec& spec);
  // Appends keys.size() x dim values, in key order.
  absl::Status Pull(const std::string& table, const std::vector<uint64_t>& keys, std::vector<float>* values);
  std::future<absl::Status> PushAsync(const std::string& table, std::vector<uint64_t> keys,
                                      std::vector<float> gradients);
  absl::Status Push(const std::string& table, std::vector<uint64_t> keys, std::vector<float> gradients) {
    return PushAsync(table, std::move(keys), std::move(gradients)).get();
  }
  // A dense tensor of `size` floats stored as rows of the table.
  absl::Status PullDense(const std::string& table, size_t size, std::vector<float>* values);
  std::future<absl::Status> PushDenseAsync(const std::string& table, std::vector<float> gradients);

  size_t num_servers() const { return stubs_.size(); }
  // Per-server latency since the previous call (servers with no request are left out).
  std::vector<ServerLatency> TakeLatency(int64_t now_ms);
  // Sends TakeLatency() to the monitor (pacerd) in one ReportSteps.
  absl::Status ReportLatency(Monitor::StubInterface* monitor, int64_t now_ms);

 private:
  explicit PsClient(PsClientOptions options);
  absl::StatusOr<uint32_t> Dim(const std::string& table) const;
  void Record(size_t server, double ms);

  const PsClientOptions options_;
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs_;
  mutable absl::Mutex mu_;
  std::map<std::string, uint32_t> dims_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<double>> latencies_ms_ ABSL_GUARDED_BY(mu_);  // per server
};

}  // namespace pacer
