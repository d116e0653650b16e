// KubeClient: the agent's one call to the Kubernetes API, "delete my own pod" (docs/design.md §5,
// Kubernetes mode of the migrate command), plus the in-cluster configuration it needs.
//
// Configuration (ResolveKubeClientOptions), each item from the first source that has it:
//   API server   --k8s-api-url, else https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
//   token        --k8s-token-file, else <service account dir>/token (re-read on every request:
//                bound service-account tokens are rotated by the kubelet)
//   CA           --k8s-ca-file, else <service account dir>/ca.crt (required for https)
//   namespace    --k8s-namespace, else $POD_NAMESPACE, else <service account dir>/namespace
//   pod name     --k8s-pod-name, else $POD_NAME (downward API)
//   pod uid      --k8s-pod-uid, else $POD_UID (optional; downward API metadata.uid)
//   node name    --k8s-node-name, else $NODE_NAME (downward API spec.nodeName; only MarkNode
//                needs it)
// The service account dir is /var/run/secrets/kubernetes.io/serviceaccount. http:// URLs are
// accepted only with `allow_insecure_http` (tests); https verifies the server against the CA
// file and the URL's host name or IP address.
//
// DeletePod protocol, one call:
//  1. DELETE /api/v1/namespaces/{ns}/pods/{name} with `Authorization: Bearer <token>`; with a
//     pod uid the body carries DeleteOptions{preconditions.uid}, so a replacement pod that took
//     the same name (StatefulSet) is never deleted by a late retry.
//  2. Every attempt has a deadline (resolve + connect + TLS + request + reply).
//  3. 200/202: deleted. 404: already gone, and 409 (uid precondition failed: the name now
//     belongs to a replacement) means the same: both count as done.
//  4. 401 -> UNAUTHENTICATED, 403 -> PERMISSION_DENIED with the RBAC hint, other 4xx ->
//     FAILED_PRECONDITION: not retried. 429, 5xx and transport errors (refused, reset, timeout,
//     TLS) are retried with exponential backoff up to max_attempts, then UNAVAILABLE (or
//     DEADLINE_EXCEEDED when the last attempt timed out).
//
// MarkNode protocol (migrate with --k8s-mark-node, before DeletePod): one JSON merge patch
// PATCH /api/v1/nodes/{node} {"metadata":{"labels":{KEY:VALUE}}}, the same attempts, deadlines
// and reply classes as above, except that 404 (no such node) is an error. It needs `patch` on
// `nodes` (deploy/node-marking); deploy/cluster's admission policy narrows that right to the
// bad-node.pacer.dev/ labels.
//
// No retry storm: after a 401 or 403 the client asks nothing more for refusal_hold_ms; calls
// made meanwhile fail at once with the same error (and say so), without a request.
//
// Thread-safety: none. Everything runs on the io_context passed in, which must be run by one
// thread (the agent's event loop); `done` is called on it. Destroying the client cancels calls
// in flight without calling their `done`.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pacer {

constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct KubeApiEndpoint {
  bool tls = true;
  std::string host;  // name or IP address, without brackets
  uint16_t port = 443;
  std::string HostHeader() const;  // host[:port], brackets around IPv6
};

// "https://host[:port]" or "http://host[:port]" (IPv6 as [addr]); a trailing "/" is allowed,
// any other path, a query or user info is not.
absl::StatusOr<KubeApiEndpoint> ParseKubeApiUrl(std::string_view url);

// What the flags say; empty = not given.
struct KubeFlags {
  std::string api_url, token_file, ca_file, namespace_name, pod_name, pod_uid, node_name;
  std::string service_account_dir = kServiceAccountDir;
  bool allow_insecure_http = false;
};

struct KubeClientOptions {
  KubeApiEndpoint endpoint;
  std::string token_file;
  std::string ca_file;  // empty only for http
  std::string namespace_name;
  std::string pod_name;
  std::string pod_uid;  // empty: no uid precondition
  std::string node_name;  // empty: MarkNode fails (FAILED_PRECONDITION)
  int64_t attempt_timeout_ms = 10'000;
  int max_attempts = 6;
  int64_t backoff_initial_ms = 500;
  int64_t backoff_max_ms = 8'000;
  int64_t refusal_hold_ms = 60'000;  // after a 401/403, no request for this long (0: none)

  std::string PodPath() const;   // /api/v1/namespaces/{ns}/pods/{name}
  std::string NodePath() const;  // /api/v1/nodes/{node}
};

// Nodes a job's pods must avoid carry the label bad-node.pacer.dev/<job> (value: the Unix time
// it was set); the job's pod template requires that the label does not exist.
constexpr char kBadNodeLabelPrefix[] = "bad-node.pacer.dev/";
// A label's name part: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends.
bool IsLabelName(std::string_view s);
// bad-node.pacer.dev/<job>; INVALID_ARGUMENT when the job name cannot be a label name.
absl::StatusOr<std::string> BadNodeLabelKey(std::string_view job);

// The environment variables ResolveKubeClientOptions reads, from the real environment.
std::map<std::string, std::string> KubeEnvironment();

// Resolves the flags over `env` and the service account files, and checks that the token
// (non-empty) and CA files can be read now. INVALID_ARGUMENT / NOT_FOUND with a message that
// names the missing piece and the flag or variable that provides it.
absl::StatusOr<KubeClientOptions> ResolveKubeClientOptions(
    const KubeFlags& flags, const std::map<std::string, std::string>& env);

struct PodDeletion {
  int http_status = 0;
  bool already_gone = false;  // 404, or 409 on the uid precondition
  int attempts = 0;
};

class KubeClient {
 public:
  using DeleteDone = std::function<void(absl::StatusOr<PodDeletion>)>;

  KubeClient(boost::asio::io_context& io, KubeClientOptions options);
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  const KubeClientOptions& options() const { return options_; }

  // Deletes the own pod (protocol above); `done` runs once on the io_context.
  void DeletePod(DeleteDone done);
  // Sets label `label_key` = `value` on the own node (MarkNode protocol above); `done` as above.
  void MarkNode(const std::string& label_key, const std::string& value, DeleteDone done);
  // Calls answered locally because of a recent 401/403 (no request sent).
  uint64_t calls_refused_locally() const { return calls_refused_locally_; }

 private:
  struct Request;
  class DeleteCall;
  void Call(Request r, DeleteDone done);
  static int64_t SteadyMs();
  std::optional<absl::Status> refused_;  // the last 401/403, while it holds
  int64_t refused_at_ms_ = 0, refused_until_ms_ = 0;
  uint64_t calls_refused_locally_ = 0;
  boost::asio::io_context& io_;
  KubeClientOptions options_;
  uint64_t next_call_id_ = 0;
  std::map<uint64_t, std::weak_ptr<DeleteCall>> calls_;  // in flight, cancelled on destruction
};

}  // namespace pacer
