#include "journal/etcd_client.h"

#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/channel_wait.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/tls.h"

namespace pacer {
namespace {

int64_t NowMs() { return RealClock::Get()->MonotonicNs() / 1'000'000; }

// Statuses after which the same call may succeed on another member (or the same one, later).
bool Retryable(const grpc::Status& s, bool retry_leader_errors) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // etcd answers UNAVAILABLE for "leader changed" and "no leader" too; those are retried only
    // for calls safe to repeat (the request may have been applied before the change).
    const bool leader_error = absl::StrContains(s.error_message(), "leader");
    return !leader_error || retry_leader_errors;
  }
  return false;
}

bool TokenExpired(const grpc::Status& s) {
  return absl::StrContains(s.error_message(), "invalid auth token") ||
         absl::StrContains(s.error_message(), "user name is empty");
}

}  // namespace

absl::StatusOr<EtcdUrl> ParseEtcdUrl(const std::string& url) {
  EtcdUrl out;
  std::string rest;
  if (absl::StartsWith(url, "etcd://")) {
    rest = url.substr(7);
  } else if (absl::StartsWith(url, "etcds://")) {
    rest = url.substr(8);
    out.tls = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", url, "' is not an etcd URL: expected etcd://host:port[,host:port...]/PREFIX"));
  }
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' names no key prefix: expected etcd://host:port,.../PREFIX"));
  }
  std::string prefix = rest.substr(slash + 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", url, "': the key prefix is empty; give each job its own (etcd://.../jobs/NAME)"));
  }
  out.prefix = prefix;
  for (absl::string_view ep : absl::StrSplit(rest.substr(0, slash), ',', absl::SkipEmpty())) {
    const size_t colon = ep.rfind(':');
    if (colon == absl::string_view::npos || colon + 1 == ep.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", url, "': endpoint '", ep, "' has no port (host:port)"));
    }
    out.endpoints.emplace_back(ep);
  }
  if (out.endpoints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' names no etcd endpoint"));
  }
  return out;
}

std::string EtcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

bool IsEtcdNoSpace(const absl::Status& s) {
  return absl::StrContains(s.message(), "database space exceeded");
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdClientOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoint");
  std::unique_ptr<EtcdClient> c(new EtcdClient(options));
  TlsClientOptions tls;
  tls.ca_file = options.cacert;
  tls.cert_file = options.cert;
  tls.key_file = options.key;
  tls.allow_insecure = options.allow_insecure;
  for (const std::string& ep : options.endpoints) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(4 << 20);
    // Reconnect quickly after a member restarts (the default backoff grows to 2 minutes). The
    // "min reconnect backoff" is one connection attempt's timeout (TCP + TLS handshake), not a
    // floor of the backoff: 1 s, so a TLS handshake completes and a hung member is left soon.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    // A member that stops answering (paused, partitioned) is noticed by the transport; no more
    // often than etcd's --grpc-keepalive-min-time (5 s) allows, or it closes the connection.
    // Calls have their own deadlines meanwhile.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
    // A channel of its own per member: gRPC would otherwise share one connection per address.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = DialChannel(ep, tls, args);
    if (!channel.ok()) return Annotate(channel.status(), absl::StrCat("etcd endpoint ", ep));
    Member m;
    m.endpoint = ep;
    m.channel = *channel;
    m.kv = etcdserverpb::KV::NewStub(m.channel);
    m.lease = etcdserverpb::Lease::NewStub(m.channel);
    m.watch = etcdserverpb::Watch::NewStub(m.channel);
    m.maintenance = etcdserverpb::Maintenance::NewStub(m.channel);
    m.auth = etcdserverpb::Auth::NewStub(m.channel);
    m.election = v3electionpb::Election::NewStub(m.channel);
    c->members_.push_back(std::move(m));
  }
  if (!options.user.empty()) RETURN_IF_ERROR(c->Authenticate());
  return c;
}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::current_endpoint() const { return members_[current_ % members_.size()].endpoint; }

void EtcdClient::Rotate() { current_ = (current_ + 1) % members_.size(); }

void EtcdClient::SetupContext(grpc::ClientContext* ctx, int64_t deadline_ms) {
  if (deadline_ms > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  }
  absl::MutexLock l(&token_mu_);
  if (!token_.empty()) ctx->AddMetadata("token", token_);
}

std::unique_ptr<grpc::ClientContext> EtcdClient::StreamContext(int64_t deadline_ms) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  SetupContext(ctx.get(), deadline_ms);
  ctx->AddMetadata("hasleader", "true");
  return ctx;
}

etcdserverpb::Lease::Stub* EtcdClient::lease_stub() { return members_[current_ % members_.size()].lease.get(); }

etcdserverpb::Watch::Stub* EtcdClient::watch_stub() { return members_[current_ % members_.size()].watch.get(); }

absl::Status EtcdClient::Authenticate() {
  const int64_t deadline = NowMs() + options_.request_timeout_ms;
  grpc::Status last;
  for (size_t tried = 0; tried < members_.size() * 4 && NowMs() < deadline; ++tried) {
    Member& m = members_[current_ % members_.size()];
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(std::max<int64_t>(1, deadline - NowMs())));
    etcdserverpb::AuthenticateRequest req;
    req.set_name(options_.user);
    req.set_password(options_.password);
    etcdserverpb::AuthenticateResponse resp;
    last = m.auth->Authenticate(&ctx, req, &resp);
    if (last.ok()) {
      absl::MutexLock l(&token_mu_);
      token_ = resp.token();
      return absl::OkStatus();
    }
    if (!Retryable(last, true)) break;
    Rotate();
  }
  return Annotate(FromGrpcStatus(last), absl::StrCat("etcd: authenticating as '", options_.user, "'"));
}

template <typename Fn>
grpc::Status EtcdClient::Call(bool retry, Fn call, int64_t timeout_ms) {
  const int64_t deadline = NowMs() + (timeout_ms > 0 ? timeout_ms : options_.request_timeout_ms);
  grpc::Status s;
  bool reauthenticated = false;
  int64_t backoff_ms = 20;
  for (;;) {
    const size_t index = current_ % members_.size();
    grpc::ClientContext ctx;
    SetupContext(&ctx, std::max<int64_t>(1, deadline - NowMs()));
    s = call(members_[index], &ctx);
    if (s.ok()) return s;
    if (!reauthenticated && !options_.user.empty() && TokenExpired(s)) {
      reauthenticated = true;
      if (Authenticate().ok()) continue;
    }
    if (!Retryable(s, retry) || NowMs() >= deadline) return s;
    // Try the next member; after a full round, wait a little (the cluster is electing).
    size_t expected = index;
    current_.compare_exchange_strong(expected, (index + 1) % members_.size());
    if ((index + 1) % members_.size() == 0) {
      // Keep the member's channel connecting meanwhile (a synchronous client has no poller).
      PauseWatchingChannel(members_[index].channel.get(),
                           std::chrono::milliseconds(std::min<int64_t>(backoff_ms, deadline - NowMs())));
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 500);
    }
  }
}

namespace {
absl::Status Named(const grpc::Status& s, absl::string_view what, const std::string& endpoint) {
  return Annotate(FromGrpcStatus(s), absl::StrCat("etcd ", what, " (", endpoint, ")"));
}
}  // namespace

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(const etcdserverpb::RangeRequest& req) {
  etcdserverpb::RangeResponse resp;
  grpc::Status s = Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Range(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "range", current_endpoint());
  return resp;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& req, bool retry) {
  etcdserverpb::TxnResponse resp;
  grpc::Status s = Call(retry, [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Txn(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "txn", current_endpoint());
  return resp;
}

absl::StatusOr<etcdserverpb::PutResponse> EtcdClient::Put(const std::string& key, const std::string& value,
                                                          int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  grpc::Status s = Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Put(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "put", current_endpoint());
  return resp;
}

absl::StatusOr<int64_t> EtcdClient::DeleteRange(const std::string& key, const std::string& range_end) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  etcdserverpb::DeleteRangeResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.kv->DeleteRange(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "delete", current_endpoint());
  return resp.deleted();
}

absl::StatusOr<etcdserverpb::CompactionResponse> EtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest req;
  req.set_revision(revision);
  req.set_physical(true);
  etcdserverpb::CompactionResponse resp;
  grpc::Status s = Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Compact(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "compact", current_endpoint());
  return resp;
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.lease->LeaseGrant(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "lease grant", current_endpoint());
  if (!resp.error().empty()) return absl::UnavailableError(absl::StrCat("etcd lease grant: ", resp.error()));
  return resp;
}

absl::Status EtcdClient::LeaseRevoke(int64_t id) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.lease->LeaseRevoke(ctx, req, &resp); });
  if (!s.ok() && !absl::StrContains(s.error_message(), "requested lease not found")) {
    return Named(s, "lease revoke", current_endpoint());
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> EtcdClient::LeaseTimeToLive(int64_t id) {
  etcdserverpb::LeaseTimeToLiveRequest req;
  req.set_id(id);
  etcdserverpb::LeaseTimeToLiveResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.lease->LeaseTimeToLive(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "lease time-to-live", current_endpoint());
  return resp.ttl();
}

absl::StatusOr<int64_t> EtcdClient::LeaseKeepAliveOnce(int64_t id, int64_t timeout_ms) {
  etcdserverpb::LeaseKeepAliveResponse resp;
  grpc::Status s = Call(true, [&](Member& m, grpc::ClientContext* ctx) {
    ctx->AddMetadata("hasleader", "true");
    auto stream = m.lease->LeaseKeepAlive(ctx);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(id);
    if (!stream->Write(req) || !stream->Read(&resp)) {
      stream->WritesDone();
      grpc::Status f = stream->Finish();
      return f.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keepalive stream closed") : f;
    }
    stream->WritesDone();
    ctx->TryCancel();
    stream->Finish();
    return grpc::Status::OK;
  }, timeout_ms);
  if (!s.ok()) return Named(s, "lease keepalive", current_endpoint());
  return resp.ttl();
}

absl::StatusOr<v3electionpb::LeaderKey> EtcdClient::Campaign(grpc::ClientContext* ctx, const std::string& name,
                                                             int64_t lease, const std::string& value) {
  {
    absl::MutexLock l(&token_mu_);
    if (!token_.empty()) ctx->AddMetadata("token", token_);
  }
  v3electionpb::CampaignRequest req;
  req.set_name(name);
  req.set_lease(lease);
  req.set_value(value);
  v3electionpb::CampaignResponse resp;
  Member& m = members_[current_ % members_.size()];
  grpc::Status s = m.election->Campaign(ctx, req, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) Rotate();
    return Named(s, "campaign", m.endpoint);
  }
  return resp.leader();
}

absl::StatusOr<mvccpb::KeyValue> EtcdClient::Leader(const std::string& name) {
  v3electionpb::LeaderRequest req;
  req.set_name(name);
  v3electionpb::LeaderResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.election->Leader(ctx, req, &resp); });
  if (!s.ok()) {
    if (absl::StrContains(s.error_message(), "no leader")) {
      return absl::NotFoundError(absl::StrCat("no pacerd leads '", name, "'"));
    }
    return Named(s, "leader", current_endpoint());
  }
  return resp.kv();
}

absl::Status EtcdClient::Resign(const v3electionpb::LeaderKey& leader) {
  v3electionpb::ResignRequest req;
  *req.mutable_leader() = leader;
  v3electionpb::ResignResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.election->Resign(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "resign", current_endpoint());
  return absl::OkStatus();
}

absl::Status EtcdClient::Proclaim(const std::string& name, const std::string& key, int64_t rev, int64_t lease,
                                  const std::string& value) {
  v3electionpb::ProclaimRequest req;
  req.mutable_leader()->set_name(name);
  req.mutable_leader()->set_key(key);
  req.mutable_leader()->set_rev(rev);
  req.mutable_leader()->set_lease(lease);
  req.set_value(value);
  v3electionpb::ProclaimResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.election->Proclaim(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "proclaim", current_endpoint());
  return absl::OkStatus();
}

absl::StatusOr<etcdserverpb::StatusResponse> EtcdClient::MemberStatus(size_t endpoint) {
  if (endpoint >= members_.size()) return absl::InvalidArgumentError("etcd: no such endpoint");
  grpc::ClientContext ctx;
  SetupContext(&ctx, options_.request_timeout_ms);
  etcdserverpb::StatusResponse resp;
  grpc::Status s = members_[endpoint].maintenance->Status(&ctx, etcdserverpb::StatusRequest(), &resp);
  if (!s.ok()) return Named(s, "status", members_[endpoint].endpoint);
  return resp;
}

absl::StatusOr<etcdserverpb::AlarmResponse> EtcdClient::Alarms() {
  etcdserverpb::AlarmRequest req;
  req.set_action(etcdserverpb::AlarmRequest::GET);
  etcdserverpb::AlarmResponse resp;
  grpc::Status s =
      Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.maintenance->Alarm(ctx, req, &resp); });
  if (!s.ok()) return Named(s, "alarm list", current_endpoint());
  return resp;
}

absl::Status EtcdClient::DisarmNoSpace() {
  ASSIGN_OR_RETURN(etcdserverpb::AlarmResponse alarms, Alarms());
  for (const auto& a : alarms.alarms()) {
    if (a.alarm() != etcdserverpb::NOSPACE) continue;
    etcdserverpb::AlarmRequest req;
    req.set_action(etcdserverpb::AlarmRequest::DEACTIVATE);
    req.set_memberid(a.memberid());
    req.set_alarm(etcdserverpb::NOSPACE);
    etcdserverpb::AlarmResponse resp;
    grpc::Status s =
        Call(true, [&](Member& m, grpc::ClientContext* ctx) { return m.maintenance->Alarm(ctx, req, &resp); });
    if (!s.ok()) return Named(s, "alarm disarm", current_endpoint());
  }
  return absl::OkStatus();
}

absl::Status EtcdClient::Defragment(size_t endpoint) {
  if (endpoint >= members_.size()) return absl::InvalidArgumentError("etcd: no such endpoint");
  grpc::ClientContext ctx;
  SetupContext(&ctx, std::max<int64_t>(options_.request_timeout_ms, 30000));
  etcdserverpb::DefragmentResponse resp;
  grpc::Status s = members_[endpoint].maintenance->Defragment(&ctx, etcdserverpb::DefragmentRequest(), &resp);
  if (!s.ok()) return Named(s, "defragment", members_[endpoint].endpoint);
  return absl::OkStatus();
}

}  // namespace pacer
