#include "worker_sdk/rendezvous_client.h"

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/channel_wait.h"
#include "common/auth.h"
#include "common/status.h"

namespace pacer {

RendezvousClient::RendezvousClient(RendezvousClientOptions options) : options_(std::move(options)) {
  if (options_.credentials == nullptr) {
    auto creds = MakeChannelCredentials(options_.tls, options_.address);
    if (creds.ok()) {
      options_.credentials = *creds;
    } else {
      dial_status_ = creds.status();
      options_.credentials = grpc::InsecureChannelCredentials();  // never used: calls fail first
    }
  }
  grpc::ChannelArguments args;
  ApplyTlsChannelArgs(options_.tls, &args);
  channel_ = grpc::CreateCustomChannel(options_.address, options_.credentials, args);
  stub_ = Rendezvous::NewStub(channel_);
}

template <typename Req, typename Resp, typename Call>
absl::Status RendezvousClient::CallWithRetry(const Req& req, Resp* resp, Call call, bool retry) {
  if (!dial_status_.ok()) return dial_status_;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.retry_budget_ms);
  int64_t backoff_ms = 20;
  std::mt19937_64 jitter(std::random_device{}());
  for (;;) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, options_.token);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.rpc_timeout_ms));
    absl::Status s = FromGrpcStatus(call(&ctx, req, resp));
    if (s.ok() || !retry || s.code() != absl::StatusCode::kUnavailable ||
        std::chrono::steady_clock::now() >= deadline) {
      return s;
    }
    // Backoff between attempts (not synchronisation), keeping the channel connecting.
    PauseWatchingChannel(channel_.get(), std::chrono::milliseconds(
        std::uniform_int_distribution<int64_t>(backoff_ms / 2, backoff_ms)(jitter)));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 1'000);
  }
}

absl::StatusOr<RendezvousJoinResponse> RendezvousClient::Join(const std::string& worker_id,
                                                              uint64_t incarnation, int rank,
                                                              uint32_t world_size) {
  RendezvousJoinRequest req;
  req.set_worker_id(worker_id);
  req.set_incarnation(incarnation);
  req.set_rank(rank);
  req.set_world_size(world_size);
  RendezvousJoinResponse resp;
  absl::Status s = CallWithRetry(
      req, &resp, [&](auto* ctx, const auto& r, auto* o) { return stub_->Join(ctx, r, o); }, true);
  if (!s.ok()) return Annotate(s, "rendezvous join");
  return resp;
}

absl::StatusOr<uint64_t> RendezvousClient::Reform(const std::string& worker_id, uint64_t generation) {
  RendezvousReformRequest req;
  req.set_worker_id(worker_id);
  req.set_generation(generation);
  RendezvousReformResponse resp;
  absl::Status s = CallWithRetry(
      req, &resp, [&](auto* ctx, const auto& r, auto* o) { return stub_->Reform(ctx, r, o); }, true);
  if (!s.ok()) return Annotate(s, "rendezvous reform");
  return resp.generation();
}

absl::Status RendezvousClient::Set(uint64_t generation, const std::string& key,
                                   const std::string& value) {
  RendezvousSetRequest req;
  req.set_generation(generation);
  req.set_key(key);
  req.set_value(value);
  RendezvousSetResponse resp;
  return Annotate(CallWithRetry(req, &resp,
                                [&](auto* ctx, const auto& r, auto* o) { return stub_->Set(ctx, r, o); },
                                true),
                  "rendezvous set '" + key + "'");
}

absl::StatusOr<std::vector<std::string>> RendezvousClient::Get(uint64_t generation,
                                                               const std::vector<std::string>& keys,
                                                               bool wait,
                                                               std::chrono::milliseconds timeout) {
  RendezvousGetRequest req;
  req.set_generation(generation);
  for (const auto& k : keys) req.add_keys(k);
  req.set_wait(wait);
  RendezvousGetResponse resp;
  // One attempt: the deadline is the wait's bound (UNAVAILABLE is the caller's to retry).
  grpc::ClientContext ctx;
  AttachToken(&ctx, options_.token);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   (wait ? timeout : std::chrono::milliseconds(options_.rpc_timeout_ms)));
  absl::Status s = FromGrpcStatus(stub_->Get(&ctx, req, &resp));
  if (!s.ok()) {
    return Annotate(s, "rendezvous get '" + (keys.empty() ? std::string() : keys.front()) + "'" +
                           (keys.size() > 1 ? " and " + std::to_string(keys.size() - 1) + " more" : ""));
  }
  if (resp.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError("rendezvous get: " + std::to_string(resp.values_size()) +
                               " values for " + std::to_string(keys.size()) + " keys");
  }
  return std::vector<std::string>(resp.values().begin(), resp.values().end());
}

absl::StatusOr<int64_t> RendezvousClient::Add(uint64_t generation, const std::string& key,
                                              int64_t delta) {
  RendezvousAddRequest req;
  req.set_generation(generation);
  req.set_key(key);
  req.set_delta(delta);
  RendezvousAddResponse resp;
  absl::Status s = CallWithRetry(
      req, &resp, [&](auto* ctx, const auto& r, auto* o) { return stub_->Add(ctx, r, o); }, false);
  if (!s.ok()) return Annotate(s, "rendezvous add '" + key + "'");
  return resp.value();
}

absl::StatusOr<bool> RendezvousClient::Check(uint64_t generation, const std::vector<std::string>& keys) {
  RendezvousCheckRequest req;
  req.set_generation(generation);
  for (const auto& k : keys) req.add_keys(k);
  RendezvousCheckResponse resp;
  absl::Status s = CallWithRetry(
      req, &resp, [&](auto* ctx, const auto& r, auto* o) { return stub_->Check(ctx, r, o); }, true);
  if (!s.ok()) return Annotate(s, "rendezvous check");
  return resp.all_set();
}

namespace {

// gloo::rendezvous::Store over pacerd's store, for one generation.
class PacerdStore final : public gloo::rendezvous::Store {
 public:
  PacerdStore(RendezvousClient* client, uint64_t generation, std::chrono::milliseconds timeout,
              absl::Status* last_error)
      : client_(client), generation_(generation), timeout_(timeout), last_error_(last_error) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(client_->Set(generation_, key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_->Get(generation_, {key}, /*wait=*/true, timeout_);
    Check(v.status());
    return std::vector<char>(v->front().begin(), v->front().end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (keys.empty()) return;
    Check(client_->Get(generation_, keys, /*wait=*/true, std::min(timeout, timeout_)).status());
  }

 private:
  void Check(const absl::Status& s) {
    if (s.ok()) return;
    if (last_error_) *last_error_ = s;
    throw std::runtime_error("pacerd store (generation " + std::to_string(generation_) +
                             "): " + s.ToString());
  }

  RendezvousClient* client_;
  const uint64_t generation_;
  const std::chrono::milliseconds timeout_;
  absl::Status* last_error_;
};

}  // namespace

std::unique_ptr<gloo::rendezvous::Store> MakePacerdStore(RendezvousClient* client,
                                                         uint64_t generation,
                                                         std::chrono::milliseconds timeout,
                                                         absl::Status* last_error) {
  return std::make_unique<PacerdStore>(client, generation, timeout, last_error);
}

}  // namespace pacer
