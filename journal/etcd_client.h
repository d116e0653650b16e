// EtcdClient: the calls pacerd makes to an etcd 3.4 cluster over etcd's v3 gRPC API
// (proto/etcd/*.proto; no C++ etcd client is packaged for Debian, so Pacer speaks the API itself).
//
// One gRPC channel per member endpoint. A call goes to the current member; on UNAVAILABLE (the
// member is down or cut off) or a member that lost its raft leader, it moves to the next member
// and tries again until the call's deadline, for calls that are safe to repeat (every call here
// but Campaign: a Txn is repeated only by its caller, who knows whether it is idempotent).
// Streams carry `hasleader: true`, so a member cut off from the raft leader fails them instead of
// letting them hang. With a user name, the client authenticates (Auth.Authenticate) and sends
// the token on every call, authenticating again when etcd says it expired.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "etcd/election.grpc.pb.h"
#include "etcd/rpc.grpc.pb.h"

namespace pacer {

struct EtcdClientOptions {
  std::vector<std::string> endpoints;  // "host:port" of each member's client URL
  // TLS to etcd, as etcd's own clients name them (--cacert, --cert, --key): PEM file paths.
  // Empty cacert: plaintext.
  std::string cacert;
  std::string cert;
  std::string key;
  // Plaintext to a non-loopback member (pacerd --allow-insecure); refused otherwise.
  bool allow_insecure = false;
  // etcd authentication (--user NAME, password from a file): empty user: none.
  std::string user;
  std::string password;
  // The deadline of one call, retries on other members included.
  int64_t request_timeout_ms = 5000;
};

// Parses "etcd://host1:2379,host2:2379/prefix" (also etcds:// for TLS) into the endpoints and the
// key prefix (never empty: "/" alone is refused, a job's keys need a home of their own).
struct EtcdUrl {
  std::vector<std::string> endpoints;
  std::string prefix;  // without leading or trailing '/'
  bool tls = false;    // etcds://
};
absl::StatusOr<EtcdUrl> ParseEtcdUrl(const std::string& url);

// The end of the range of every key starting with `prefix` (etcd's "prefix" range_end).
std::string EtcdPrefixEnd(const std::string& prefix);

// Whether `s` is etcd refusing a write because its backend quota is exhausted (NOSPACE alarm).
bool IsEtcdNoSpace(const absl::Status& s);

class EtcdClient {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdClientOptions& options);
  ~EtcdClient();

  const EtcdClientOptions& options() const { return options_; }
  // The member calls go to now ("host:port").
  std::string current_endpoint() const;

  // KV. Range pages are the caller's business (limit / more).
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& req);
  // A transaction. `retry`: repeat it on another member after UNAVAILABLE (only when applying it
  // twice is harmless: its puts write the same values, its compares fence it).
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& req, bool retry);
  absl::StatusOr<etcdserverpb::PutResponse> Put(const std::string& key, const std::string& value,
                                                 int64_t lease = 0);
  absl::StatusOr<int64_t> DeleteRange(const std::string& key, const std::string& range_end);
  absl::StatusOr<etcdserverpb::CompactionResponse> Compact(int64_t revision);

  // Lease.
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(int64_t ttl_s);
  absl::Status LeaseRevoke(int64_t id);
  // Remaining seconds of the lease (-1: expired or revoked).
  absl::StatusOr<int64_t> LeaseTimeToLive(int64_t id);
  // One keepalive on a stream of its own (the election keeps one stream open instead; this is
  // for tools and tests). Returns the new TTL (<= 0: the lease is gone).
  // `timeout_ms` (0: the client's) bounds the call.
  absl::StatusOr<int64_t> LeaseKeepAliveOnce(int64_t id, int64_t timeout_ms = 0);

  // Election (etcd's v3election service). Campaign blocks until the caller leads or `ctx` is
  // cancelled or times out; it is never repeated by the client (the caller campaigns again).
  absl::StatusOr<v3electionpb::LeaderKey> Campaign(grpc::ClientContext* ctx, const std::string& name,
                                                   int64_t lease, const std::string& value);
  // The current leader's key-value (NOT_FOUND when there is none).
  absl::StatusOr<mvccpb::KeyValue> Leader(const std::string& name);
  absl::Status Resign(const v3electionpb::LeaderKey& leader);
  // Changes the value the leader advertises (its key `key` with create revision `rev`).
  absl::Status Proclaim(const std::string& name, const std::string& key, int64_t rev, int64_t lease,
                        const std::string& value);

  // Maintenance, on one member (`endpoint`: index into options().endpoints).
  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(size_t endpoint);
  absl::StatusOr<etcdserverpb::AlarmResponse> Alarms();
  absl::Status DisarmNoSpace();
  absl::Status Defragment(size_t endpoint);

  // For long-lived streams (the election's keepalive): a context with the auth token,
  // `hasleader: true` and the given deadline (0: none), and the stub of the current member.
  std::unique_ptr<grpc::ClientContext> StreamContext(int64_t deadline_ms);
  etcdserverpb::Lease::Stub* lease_stub();
  // The Watch stub of the current member (a follower's wake-up: journal/etcd_log.h).
  etcdserverpb::Watch::Stub* watch_stub();
  // After a stream failed with UNAVAILABLE: move to the next member.
  void Rotate();

 private:
  explicit EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {}
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
    std::unique_ptr<v3electionpb::Election::Stub> election;
  };
  // Runs `call(member, ctx)` on the current member, then the others, until it returns something
  // other than a retryable status (UNAVAILABLE; and, with `retry`, etcd's "leader changed" and
  // "no leader") or the deadline passes; re-authenticates once on an expired token.
  // `timeout_ms` 0: options().request_timeout_ms.
  template <typename Fn>
  grpc::Status Call(bool retry, Fn call, int64_t timeout_ms = 0);
  void SetupContext(grpc::ClientContext* ctx, int64_t deadline_ms);
  absl::Status Authenticate();

  const EtcdClientOptions options_;
  std::vector<Member> members_;
  std::atomic<size_t> current_{0};
  mutable absl::Mutex token_mu_;
  std::string token_ ABSL_GUARDED_BY(token_mu_);
};

}  // namespace pacer
