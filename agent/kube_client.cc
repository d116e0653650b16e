#include "agent/kube_client.h"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cmath>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/proc_stats.h"
#include "common/log.h"

namespace pacer {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

bool IsIpAddress(const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// DNS-1123: a label (namespace) is [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters; a
// subdomain (pod name) is dot-separated labels, at most 253. Checking them keeps the request path
// free of '/', '?', '%' and friends.
bool IsDns1123(std::string_view s, bool allow_dots, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (allow_dots && c == '.'))) {
      return false;
    }
  }
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  return alnum(s.front()) && alnum(s.back());
}

// A one-line secret or value: trimmed, non-empty, no control characters (it goes into a header).
absl::StatusOr<std::string> ReadOneLine(const std::string& path, const std::string& what) {
  auto text = ReadSmallFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " file ", path));
  std::string v(absl::StripAsciiWhitespace(*text));
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat("the ", what, " file ", path, " is empty"));
  for (char c : v) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("the ", what, " file ", path, " holds more than one line"));
    }
  }
  return v;
}

std::string EnvOr(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

// The `message` of a Kubernetes Status object, else the start of the body.
std::string ApiMessage(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    return j["message"].get<std::string>();
  }
  std::string s = body.substr(0, 200);
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return s;
}

}  // namespace

std::string KubeApiEndpoint::HostHeader() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return (tls && port == 443) || (!tls && port == 80) ? h : h + ":" + std::to_string(port);
}

absl::StatusOr<KubeApiEndpoint> ParseKubeApiUrl(std::string_view url) {
  KubeApiEndpoint e;
  const std::string u(url);
  std::string_view rest;
  if (url.substr(0, 8) == "https://") {
    e.tls = true;
    e.port = 443;
    rest = url.substr(8);
  } else if (url.substr(0, 7) == "http://") {
    e.tls = false;
    e.port = 80;
    rest = url.substr(7);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "' must start with https:// (or http:// for tests)"));
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#@ ") != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "' must be scheme://host[:port], without path, query or user"));
  }
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "': unclosed '['"));
    e.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "': junk after ']'"));
      port = after.substr(1);
      if (port.empty()) return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "': empty port"));
    }
    if (!IsIpAddress(e.host)) return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "': bad IPv6 address"));
  } else {
    const size_t colon = rest.find(':');
    e.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = rest.substr(colon + 1);
      if (port.empty()) return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "': empty port"));
    }
  }
  if (e.host.empty()) return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "' has no host"));
  if (!port.empty()) {
    uint32_t p = 0;
    if (!absl::SimpleAtoi(std::string(port), &p) || p == 0 || p > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("API URL '", u, "': bad port '", std::string(port), "'"));
    }
    e.port = static_cast<uint16_t>(p);
  }
  return e;
}

std::string KubeClientOptions::PodPath() const {
  return "/api/v1/namespaces/" + namespace_name + "/pods/" + pod_name;
}

std::string KubeClientOptions::NodePath() const { return "/api/v1/nodes/" + node_name; }

bool IsLabelName(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.')) return false;
  }
  return absl::ascii_isalnum(s.front()) && absl::ascii_isalnum(s.back());
}

absl::StatusOr<std::string> BadNodeLabelKey(std::string_view job) {
  if (!IsLabelName(job)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job name '", absl::string_view(job.data(), job.size()), "' cannot be the name part of label ", kBadNodeLabelPrefix,
        "<job>: at most 63 characters [A-Za-z0-9._-], starting and ending alphanumeric"));
  }
  return absl::StrCat(kBadNodeLabelPrefix, absl::string_view(job.data(), job.size()));
}

std::map<std::string, std::string> KubeEnvironment() {
  std::map<std::string, std::string> env;
  for (const char* k : {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAME",
                        "POD_NAMESPACE", "POD_UID", "NODE_NAME"}) {
    if (const char* v = std::getenv(k); v && *v) env[k] = v;
  }
  return env;
}

absl::StatusOr<KubeClientOptions> ResolveKubeClientOptions(
    const KubeFlags& flags, const std::map<std::string, std::string>& env) {
  KubeClientOptions o;
  std::string url = flags.api_url;
  if (url.empty()) {
    const std::string host = EnvOr(env, "KUBERNETES_SERVICE_HOST");
    if (host.empty()) {
      return absl::InvalidArgumentError(
          "no Kubernetes API server: KUBERNETES_SERVICE_HOST is not set (not in a pod?); pass --k8s-api-url");
    }
    std::string port = EnvOr(env, "KUBERNETES_SERVICE_PORT");
    if (port.empty()) port = "443";
    url = "https://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port;
  }
  auto endpoint = ParseKubeApiUrl(url);
  if (!endpoint.ok()) return endpoint.status();
  o.endpoint = *endpoint;
  if (!o.endpoint.tls && !flags.allow_insecure_http) {
    return absl::InvalidArgumentError("--k8s-api-url " + url +
                                      ": plain http is for tests only (--k8s-allow-http); use https");
  }

  const std::string& sa = flags.service_account_dir;
  o.token_file = flags.token_file.empty() ? sa + "/token" : flags.token_file;
  if (auto t = ReadOneLine(o.token_file, "service account token"); !t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat(t.status().message(),
                                     " (mount it with automountServiceAccountToken or pass --k8s-token-file)"));
  }
  if (o.endpoint.tls) {
    o.ca_file = flags.ca_file.empty() ? sa + "/ca.crt" : flags.ca_file;
    auto ca = ReadSmallFile(o.ca_file);
    if (!ca.ok()) {
      return absl::NotFoundError("cannot read the Kubernetes CA file " + o.ca_file + " (pass --k8s-ca-file)");
    }
    if (ca->find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      return absl::InvalidArgumentError("the Kubernetes CA file " + o.ca_file + " holds no PEM certificate");
    }
  }

  o.namespace_name = flags.namespace_name;
  if (o.namespace_name.empty()) o.namespace_name = EnvOr(env, "POD_NAMESPACE");
  if (o.namespace_name.empty()) {
    auto ns = ReadOneLine(sa + "/namespace", "namespace");
    if (!ns.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no namespace: pass --k8s-namespace or set POD_NAMESPACE (", ns.status().message(), ")"));
    }
    o.namespace_name = *ns;
  }
  if (!IsDns1123(o.namespace_name, false, 63)) {
    return absl::InvalidArgumentError("namespace '" + o.namespace_name + "' is not a valid Kubernetes name");
  }
  o.pod_name = flags.pod_name.empty() ? EnvOr(env, "POD_NAME") : flags.pod_name;
  if (o.pod_name.empty()) {
    return absl::InvalidArgumentError(
        "no pod name: set POD_NAME from the downward API (fieldRef metadata.name) or pass --k8s-pod-name");
  }
  if (!IsDns1123(o.pod_name, true, 253)) {
    return absl::InvalidArgumentError("pod name '" + o.pod_name + "' is not a valid Kubernetes name");
  }
  o.pod_uid = flags.pod_uid.empty() ? EnvOr(env, "POD_UID") : flags.pod_uid;
  for (char c : o.pod_uid) {
    if (!(absl::ascii_isalnum(c) || c == '-')) {
      return absl::InvalidArgumentError("pod uid '" + o.pod_uid + "' is not a uid");
    }
  }
  o.node_name = flags.node_name.empty() ? EnvOr(env, "NODE_NAME") : flags.node_name;
  if (!o.node_name.empty() && !IsDns1123(o.node_name, true, 253)) {
    return absl::InvalidArgumentError("node name '" + o.node_name + "' is not a valid Kubernetes name");
  }
  return o;
}

// What one API call sends and how its reply is read.
struct KubeClient::Request {
  http::verb verb = http::verb::delete_;
  std::string path, body, content_type;
  std::string object;      // "pod ns/name", "node name": for messages
  std::string rbac_hint;   // what the service account needs, for a 403
  bool gone_is_done = false;  // 404 (and 409 with a uid precondition) count as done
};

// One call: attempts with deadlines and backoff (protocol in the header). Owned by the
// handlers in flight (shared_ptr); the client keeps a weak_ptr to cancel it.
class KubeClient::DeleteCall : public std::enable_shared_from_this<DeleteCall> {
 public:
  DeleteCall(asio::io_context& io, const KubeClientOptions& options, Request req, DeleteDone done,
             std::function<void()> on_end)
      : io_(io), o_(options), req_(std::move(req)), done_(std::move(done)), on_end_(std::move(on_end)),
        resolver_(io), deadline_(io), backoff_(io) {}

  void Start() { Attempt(); }

  // Stops everything; `done` is not called.
  void Cancel() {
    cancelled_ = true;
    done_ = nullptr;
    deadline_.cancel();
    backoff_.cancel();
    resolver_.cancel();
    CloseSocket();
  }

 private:
  std::string Where() const {
    return absl::StrCat(std::string(http::to_string(req_.verb)), " ", o_.endpoint.tls ? "https://" : "http://",
                        o_.endpoint.HostHeader(), req_.path);
  }

  tcp::socket& Socket() { return tls_ ? tls_->next_layer() : *plain_; }
  void CloseSocket() {
    if (!tls_ && !plain_) return;
    boost::system::error_code ignored;
    Socket().close(ignored);
  }

  void Attempt() {
    if (cancelled_) return;
    ++attempt_;
    timed_out_ = false;
    buffer_.clear();
    tls_.reset();
    plain_.reset();
    ssl_ctx_.reset();

    auto token = ReadOneLine(o_.token_file, "service account token");
    if (!token.ok()) return Finish(token.status());  // a broken mount: retrying will not help

    if (o_.endpoint.tls) {
      ssl_ctx_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
      boost::system::error_code ec;
      ssl_ctx_->set_verify_mode(asio::ssl::verify_peer, ec);
      ssl_ctx_->load_verify_file(o_.ca_file, ec);
      if (ec) {
        return Finish(absl::FailedPreconditionError(
            absl::StrCat("cannot load the Kubernetes CA file ", o_.ca_file, ": ", ec.message())));
      }
      tls_ = std::make_unique<asio::ssl::stream<tcp::socket>>(io_, *ssl_ctx_);
      SSL* ssl = tls_->native_handle();
      X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
      // The server's certificate must name the host we asked for (an IP SAN for an address).
      if (IsIpAddress(o_.endpoint.host)) {
        X509_VERIFY_PARAM_set1_ip_asc(param, o_.endpoint.host.c_str());
      } else {
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        X509_VERIFY_PARAM_set1_host(param, o_.endpoint.host.c_str(), 0);
        SSL_set_tlsext_host_name(ssl, o_.endpoint.host.c_str());
      }
    } else {
      plain_ = std::make_unique<tcp::socket>(io_);
    }

    request_ = {};
    request_.method(req_.verb);
    request_.target(req_.path);
    request_.version(11);
    request_.set(http::field::host, o_.endpoint.HostHeader());
    request_.set(http::field::authorization, "Bearer " + *token);
    request_.set(http::field::accept, "application/json");
    request_.set(http::field::user_agent, "pacer-agent");
    request_.set(http::field::connection, "close");
    if (!req_.body.empty()) {
      request_.set(http::field::content_type, req_.content_type);
      request_.body() = req_.body;
    }
    request_.prepare_payload();

    auto self = shared_from_this();
    deadline_.expires_after(std::chrono::milliseconds(o_.attempt_timeout_ms));
    deadline_.async_wait([self](const boost::system::error_code& ec) {
      if (ec || self->cancelled_) return;
      self->timed_out_ = true;
      self->resolver_.cancel();
      self->CloseSocket();
    });
    resolver_.async_resolve(o_.endpoint.host, std::to_string(o_.endpoint.port),
                            [self](const boost::system::error_code& ec, tcp::resolver::results_type r) {
                              self->OnResolved(ec, r);
                            });
  }

  void OnResolved(const boost::system::error_code& ec, const tcp::resolver::results_type& results) {
    if (cancelled_) return;
    if (ec) return Failed("resolve " + o_.endpoint.host, ec);
    auto self = shared_from_this();
    asio::async_connect(Socket(), results, [self](const boost::system::error_code& ec, const tcp::endpoint&) {
      if (self->cancelled_) return;
      if (ec) return self->Failed("connect", ec);
      if (!self->tls_) return self->Send();
      self->tls_->async_handshake(asio::ssl::stream_base::client, [self](const boost::system::error_code& ec) {
        if (self->cancelled_) return;
        if (ec) return self->Failed("TLS handshake", ec);
        self->Send();
      });
    });
  }

  void Send() {
    auto self = shared_from_this();
    auto on_written = [self](const boost::system::error_code& ec, size_t) {
      if (self->cancelled_) return;
      if (ec) return self->Failed("send", ec);
      self->Receive();
    };
    if (tls_) {
      http::async_write(*tls_, request_, on_written);
    } else {
      http::async_write(*plain_, request_, on_written);
    }
  }

  void Receive() {
    auto self = shared_from_this();
    parser_.emplace();
    parser_->body_limit(64 * 1024);
    auto on_read = [self](const boost::system::error_code& ec, size_t) {
      if (self->cancelled_) return;
      if (ec) return self->Failed("read reply", ec);
      self->OnReply(self->parser_->get().result_int(), self->parser_->get().body());
    };
    if (tls_) {
      http::async_read(*tls_, buffer_, *parser_, on_read);
    } else {
      http::async_read(*plain_, buffer_, *parser_, on_read);
    }
  }

  void Failed(const std::string& stage, const boost::system::error_code& ec) {
    deadline_.cancel();
    CloseSocket();
    if (timed_out_) {
      return Retry(absl::DeadlineExceededError(absl::StrFormat(
          "%s: no reply within %d ms (stuck at %s)", Where(), o_.attempt_timeout_ms, stage)));
    }
    Retry(absl::UnavailableError(absl::StrCat(Where(), ": ", stage, ": ", ec.message())));
  }

  void OnReply(int code, const std::string& body) {
    deadline_.cancel();
    CloseSocket();
    PodDeletion d;
    d.http_status = code;
    d.attempts = attempt_;
    if (code == 200 || code == 201 || code == 202) return Finish(d);
    if (req_.gone_is_done && (code == 404 || (code == 409 && !o_.pod_uid.empty()))) {
      d.already_gone = true;  // 409: the uid precondition failed, the name is a replacement's
      return Finish(d);
    }
    const std::string msg = ApiMessage(body);
    if (code == 401) {
      return Finish(absl::UnauthenticatedError(absl::StrCat(
          Where(), ": 401 Unauthorized: the API server rejected the service account token (", o_.token_file,
          "): ", msg)));
    }
    if (code == 403) {
      return Finish(absl::PermissionDeniedError(absl::StrCat(
          Where(), ": 403 Forbidden: ", msg, ". RBAC: ", req_.rbac_hint)));
    }
    if (code == 429 || code >= 500) {
      return Retry(absl::UnavailableError(absl::StrCat(Where(), ": HTTP ", code, ": ", msg)));
    }
    Finish(absl::FailedPreconditionError(absl::StrCat(Where(), ": HTTP ", code, ": ", msg)));
  }

  void Retry(absl::Status why) {
    if (attempt_ >= o_.max_attempts) {
      return Finish(absl::Status(why.code(), absl::StrCat(why.message(), " (gave up after ", attempt_,
                                                          " attempts)")));
    }
    const int64_t delay = static_cast<int64_t>(std::min<double>(
        static_cast<double>(o_.backoff_max_ms),
        static_cast<double>(o_.backoff_initial_ms) * std::pow(2.0, std::min(attempt_ - 1, 20))));
    PACER_LOG(WARNING) << why.message() << "; attempt " << attempt_ << "/" << o_.max_attempts
                       << ", retrying in " << delay << " ms";
    auto self = shared_from_this();
    backoff_.expires_after(std::chrono::milliseconds(delay));
    backoff_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->Attempt();
    });
  }

  void Finish(absl::StatusOr<PodDeletion> result) {
    if (cancelled_ || !done_) return;
    deadline_.cancel();
    CloseSocket();
    DeleteDone done = std::move(done_);
    done_ = nullptr;
    on_end_();
    done(std::move(result));
  }

  asio::io_context& io_;
  const KubeClientOptions o_;
  const Request req_;
  DeleteDone done_;
  std::function<void()> on_end_;
  tcp::resolver resolver_;
  asio::steady_timer deadline_;  // of the current attempt
  asio::steady_timer backoff_;
  std::unique_ptr<asio::ssl::context> ssl_ctx_;
  std::unique_ptr<asio::ssl::stream<tcp::socket>> tls_;
  std::unique_ptr<tcp::socket> plain_;
  boost::beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  std::optional<http::response_parser<http::string_body>> parser_;
  int attempt_ = 0;
  bool timed_out_ = false;
  bool cancelled_ = false;
};

KubeClient::KubeClient(asio::io_context& io, KubeClientOptions options)
    : io_(io), options_(std::move(options)) {}

KubeClient::~KubeClient() {
  for (auto& [id, weak] : calls_) {
    if (auto call = weak.lock()) call->Cancel();
  }
}

void KubeClient::DeletePod(DeleteDone done) {
  Request r;
  r.verb = http::verb::delete_;
  r.path = options_.PodPath();
  r.object = "pod " + options_.namespace_name + "/" + options_.pod_name;
  r.rbac_hint = "the pod's service account needs verb 'delete' on 'pods' in namespace " +
                options_.namespace_name + " (deploy/base/agent-rbac.yaml: Role + RoleBinding)";
  r.gone_is_done = true;
  if (!options_.pod_uid.empty()) {
    // Only delete the pod this agent runs in, not a replacement with the same name.
    r.content_type = "application/json";
    r.body = nlohmann::json{{"kind", "DeleteOptions"},
                            {"apiVersion", "v1"},
                            {"preconditions", {{"uid", options_.pod_uid}}}}
                 .dump();
  }
  Call(std::move(r), std::move(done));
}

void KubeClient::MarkNode(const std::string& label_key, const std::string& value, DeleteDone done) {
  if (options_.node_name.empty()) {
    boost::asio::post(io_, [done = std::move(done)] {
      done(absl::FailedPreconditionError(
          "no node name to mark: set NODE_NAME from the downward API (fieldRef spec.nodeName) or pass "
          "--k8s-node-name"));
    });
    return;
  }
  Request r;
  r.verb = http::verb::patch;
  r.path = options_.NodePath();
  r.object = "node " + options_.node_name;
  r.rbac_hint = "the pod's service account needs verb 'patch' on 'nodes' (cluster-scoped: "
                "deploy/node-marking, ClusterRole + ClusterRoleBinding)";
  r.content_type = "application/merge-patch+json";
  r.body = nlohmann::json{{"metadata", {{"labels", {{label_key, value}}}}}}.dump();
  Call(std::move(r), std::move(done));
}

void KubeClient::Call(Request r, DeleteDone done) {
  const int64_t now = SteadyMs();
  if (refused_ && now < refused_until_ms_) {
    // The API refused this service account (401/403) moments ago: asking again cannot help
    // until someone fixes RBAC or the token, and a loop of commands must not become a storm.
    absl::Status s(refused_->code(),
                   absl::StrCat(refused_->message(), " (not asked again: the API refused this service ",
                                "account ", (now - refused_at_ms_) / 1000, " s ago; next try in ",
                                (refused_until_ms_ - now + 999) / 1000, " s)"));
    ++calls_refused_locally_;
    boost::asio::post(io_, [done = std::move(done), s] { done(s); });
    return;
  }
  const uint64_t id = next_call_id_++;
  auto wrapped = [this, done = std::move(done)](absl::StatusOr<PodDeletion> result) {
    if (!result.ok() && (result.status().code() == absl::StatusCode::kPermissionDenied ||
                         result.status().code() == absl::StatusCode::kUnauthenticated) &&
        options_.refusal_hold_ms > 0) {
      refused_ = result.status();
      refused_at_ms_ = SteadyMs();
      refused_until_ms_ = refused_at_ms_ + options_.refusal_hold_ms;
    } else if (result.ok()) {
      refused_.reset();
    }
    done(std::move(result));
  };
  auto call = std::make_shared<DeleteCall>(io_, options_, std::move(r), std::move(wrapped),
                                           [this, id] { calls_.erase(id); });
  calls_[id] = call;
  call->Start();
}

int64_t KubeClient::SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace pacer
