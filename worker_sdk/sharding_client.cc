#include "worker_sdk/sharding_client.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/auth.h"
#include "common/channel_wait.h"
#include "common/log.h"
#include "common/net.h"
#include "common/reconnect.h"
#include "common/status.h"

namespace pacer {
namespace {

void FromEnv(std::string& field, const char* name) {
  if (!field.empty()) return;
  if (const char* v = std::getenv(name)) field = v;
}

// The service's limit on held_leases per heartbeat (sharding_service.cc).
constexpr size_t kMaxHeldLeasesReported = 4096;

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

void ShardingClientOptions::FillFromEnvironment() {
  if (const char* v = std::getenv("PACER_ADDR"); v && *v) address = v;
  FromEnv(token, "PACER_TOKEN");
  FromEnv(worker_id, "PACER_WORKER_ID");
  FromEnv(node, "PACER_NODE");
  tls.FillFromEnvironment();
}

ShardingClient::ShardingClient(ShardingClientOptions options)
    : options_(std::move(options)), jitter_(std::random_device{}()) {
  grpc::ChannelArguments args;
  ApplyTlsChannelArgs(options_.tls, &args);
  SetReconnectBackoff(&args, 50, 500);
  args.SetMaxReceiveMessageSize(64 << 20);
  // A list of addresses (a leader and its standbys) becomes one channel over all of them.
  std::string target = options_.address;
  if (auto t = PrepareTarget(options_.address, &args); t.ok()) target = *t;
  channel_ = grpc::CreateCustomChannel(target, options_.credentials, args);
  stub_ = ShardingService::NewStub(channel_);
}

absl::StatusOr<std::unique_ptr<ShardingClient>> ShardingClient::Connect(
    ShardingClientOptions options) {
  if (options.worker_id.empty()) {
    return absl::InvalidArgumentError("worker_id is required (or PACER_WORKER_ID)");
  }
  if (options.token.empty()) return absl::InvalidArgumentError("token is required (or PACER_TOKEN)");
  if (options.credentials == nullptr) {
    auto target = ClientTarget(options.address);
    if (!target.ok()) return target.status();
    auto creds = MakeChannelCredentials(options.tls, *target);
    if (!creds.ok()) return creds.status();
    options.credentials = *creds;
  }
  std::unique_ptr<ShardingClient> c(new ShardingClient(std::move(options)));
  RETURN_IF_ERROR(c->Reregister());
  return c;
}

absl::Status ShardingClient::Reregister() {
  RegisterWorkerRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_node(options_.node);
  req.set_run_id(options_.run_id);
  RegisterWorkerResponse resp;
  RETURN_IF_ERROR(Retry("RegisterWorker", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->RegisterWorker(ctx, req, &resp);
  }));
  registration_ = std::move(resp);
  {
    // A new incarnation holds nothing: registering ended the previous one's leases.
    absl::MutexLock l(&held_mu_);
    held_.clear();
  }
  return absl::OkStatus();
}

bool ShardingClient::IsIncarnationGone(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         (status.message().find("declared lost") != std::string_view::npos ||
          status.message().find("stale incarnation") != std::string_view::npos);
}

absl::Status ShardingClient::Retry(const char* what,
                                   const std::function<grpc::Status(grpc::ClientContext*)>& call,
                                   uint64_t lease_request_id) {
  const auto start = std::chrono::steady_clock::now();
  int64_t backoff = options_.backoff_initial_ms;
  for (int attempt = 1;; ++attempt) {
    if (cancelled()) return absl::CancelledError(std::string(what) + ": client shut down");
    const LoseReply lose = lease_request_id != 0 && options_.test_lose_lease_reply
                               ? options_.test_lose_lease_reply(lease_request_id, attempt)
                               : LoseReply::kNone;
    grpc::ClientContext ctx;
    AttachToken(&ctx, options_.token);
    if (lose == LoseReply::kTinyDeadline) {
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(10));
    } else {
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options_.rpc_timeout_ms));
    }
    grpc::Status s = call(&ctx);
    if (s.ok() && lose == LoseReply::kDropReply) {
      s = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "reply dropped (test fault injection)");
    }
    if (s.ok() || !Retryable(s.error_code())) return FromGrpcStatus(s);
    const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
    if (spent >= options_.retry_budget_ms) {
      return absl::UnavailableError(std::string(what) + ": pacerd at " + options_.address +
                                    " unreachable for " + std::to_string(spent) +
                                    " ms: " + s.error_message());
    }
    if (lease_request_id != 0) {
      absl::MutexLock l(&held_mu_);
      ++leasing_stats_.retried_attempts;
    }
    if (attempt == 1 || attempt % 20 == 0) {
      PACER_LOG(WARNING) << what << ": " << s.error_message() << "; retrying";
    }
    // Backoff between attempts (not synchronisation): full jitter, capped. The pause watches the
    // channel, so that its reconnection makes progress (common/channel_wait.h).
    int64_t pause_ms;
    {
      absl::MutexLock l(&jitter_mu_);
      pause_ms = std::uniform_int_distribution<int64_t>(backoff / 2, backoff)(jitter_);
    }
    PauseWatchingChannel(channel_.get(), std::chrono::milliseconds(pause_ms));
    backoff = std::min(backoff * 2, options_.backoff_max_ms);
  }
}

absl::StatusOr<bool> ShardingClient::RegisterDataset(const DatasetSpec& spec) {
  RegisterDatasetRequest req;
  *req.mutable_spec() = spec;
  RegisterDatasetResponse resp;
  RETURN_IF_ERROR(Retry("RegisterDataset", [&](grpc::ClientContext* ctx) {
    return stub_->RegisterDataset(ctx, req, &resp);
  }));
  return resp.created();
}

uint64_t ShardingClient::BeginLeasing(bool combined) {
  absl::MutexLock l(&held_mu_);
  const uint64_t id = ++last_request_id_;
  leasing_in_flight_.insert(id);
  ++(combined ? leasing_stats_.combined_calls : leasing_stats_.fetch_calls);
  return id;
}

void ShardingClient::EndLeasing(uint64_t request_id, bool combined, const absl::Status& status,
                                const FetchShardResponse* granted, uint64_t ended_lease) {
  absl::MutexLock l(&held_mu_);
  if (ended_lease != 0) held_.erase(ended_lease);
  if (status.ok() && granted != nullptr && granted->outcome() == FetchShardResponse::LEASED) {
    held_.insert(granted->lease().lease_id());
    ++(combined ? leasing_stats_.leased_by_combined : leasing_stats_.leased_by_fetch);
  }
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kCancelled) {
    ++leasing_stats_.given_up;
  }
  leasing_in_flight_.erase(request_id);
}

size_t ShardingClient::leasing_calls_in_flight() const {
  absl::MutexLock l(&held_mu_);
  return leasing_in_flight_.size();
}

LeasingStats ShardingClient::leasing_stats() const {
  absl::MutexLock l(&held_mu_);
  return leasing_stats_;
}

void ShardingClient::Ended(uint64_t lease_id) {
  absl::MutexLock l(&held_mu_);
  held_.erase(lease_id);
}

void ShardingClient::ForgetLease(uint64_t lease_id) { Ended(lease_id); }

std::vector<uint64_t> ShardingClient::HeldLeases() const {
  absl::MutexLock l(&held_mu_);
  return std::vector<uint64_t>(held_.begin(), held_.end());
}

uint64_t ShardingClient::last_ended_request_id() const {
  absl::MutexLock l(&held_mu_);
  return leasing_in_flight_.empty() ? last_request_id_ : *leasing_in_flight_.begin() - 1;
}

void ShardingClient::FillHeld(HeartbeatRequest* req) const {
  req->clear_held_leases();
  absl::MutexLock l(&held_mu_);
  if (held_.size() > kMaxHeldLeasesReported) {
    // More than the service takes in one heartbeat (never with the SDK's readers): say nothing
    // rather than list a part, which would release the rest.
    req->set_reports_held_leases(false);
    req->set_last_fetch_request_id(0);
    return;
  }
  req->set_reports_held_leases(true);
  for (uint64_t id : held_) req->add_held_leases(id);
  // Calls may end out of order (the prefetch thread's fetch and the reporter's combined
  // completion): only ids below every call still in flight count as ended.
  req->set_last_fetch_request_id(leasing_in_flight_.empty() ? last_request_id_
                                                            : *leasing_in_flight_.begin() - 1);
}

absl::StatusOr<FetchShardResponse> ShardingClient::Fetch(const std::string& dataset) {
  FetchShardRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation());
  req.set_dataset(dataset);
  req.set_request_id(BeginLeasing(/*combined=*/false));
  FetchShardResponse resp;
  absl::Status s = Retry("FetchShard", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->FetchShard(ctx, req, &resp);
  }, req.request_id());
  EndLeasing(req.request_id(), false, s, &resp);
  RETURN_IF_ERROR(s);
  return resp;
}

absl::StatusOr<uint64_t> ShardingClient::ReportProgress(const Lease& lease, uint64_t records_done) {
  ProgressRequest req = AboutLease<ProgressRequest>(lease);
  req.set_records_done(records_done);
  ProgressResponse resp;
  RETURN_IF_ERROR(Retry("ReportProgress", [&](grpc::ClientContext* ctx) {
    return stub_->ReportProgress(ctx, req, &resp);
  }));
  return resp.records_done();
}

absl::StatusOr<ProgressResponse> ShardingClient::ReportProgressAndFetch(
    const Lease& lease, uint64_t records_done, const std::string& next_dataset) {
  ProgressRequest req = AboutLease<ProgressRequest>(lease);
  req.set_records_done(records_done);
  req.set_next_dataset(next_dataset);
  req.set_next_request_id(BeginLeasing(/*combined=*/true));
  ProgressResponse resp;
  absl::Status s = Retry("ReportProgress", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->ReportProgress(ctx, req, &resp);
  }, req.next_request_id());
  EndLeasing(req.next_request_id(), true, s, resp.has_next() ? &resp.next() : nullptr,
             s.code() == absl::StatusCode::kFailedPrecondition ? lease.lease_id() : 0);
  RETURN_IF_ERROR(s);
  return resp;
}

absl::Status ShardingClient::Complete(const Lease& lease) {
  CompleteShardRequest req = AboutLease<CompleteShardRequest>(lease);
  CompleteShardResponse resp;
  absl::Status s = Retry("CompleteShard", [&](grpc::ClientContext* ctx) {
    return stub_->CompleteShard(ctx, req, &resp);
  });
  if (s.ok() || s.code() == absl::StatusCode::kFailedPrecondition) Ended(lease.lease_id());
  return s;
}

absl::StatusOr<CompleteShardResponse> ShardingClient::CompleteAndFetch(
    const Lease& lease, const std::string& next_dataset) {
  CompleteShardRequest req = AboutLease<CompleteShardRequest>(lease);
  req.set_next_dataset(next_dataset);
  req.set_next_request_id(BeginLeasing(/*combined=*/true));
  CompleteShardResponse resp;
  absl::Status s = Retry("CompleteShard", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->CompleteShard(ctx, req, &resp);
  }, req.next_request_id());
  // One step: the completed lease leaves the held set as the next one joins it and its
  // request id ends.
  const bool ended = s.ok() || s.code() == absl::StatusCode::kFailedPrecondition;
  EndLeasing(req.next_request_id(), true, s, resp.has_next() ? &resp.next() : nullptr,
             ended ? lease.lease_id() : 0);
  RETURN_IF_ERROR(s);
  return resp;
}

absl::Status ShardingClient::Release(const Lease& lease, uint64_t records_done, bool failed,
                                     const std::string& detail) {
  ReleaseShardRequest req = AboutLease<ReleaseShardRequest>(lease);
  req.set_records_done(records_done);
  req.set_failed(failed);
  req.set_detail(detail);
  ReleaseShardResponse resp;
  absl::Status s = Retry("ReleaseShard", [&](grpc::ClientContext* ctx) {
    return stub_->ReleaseShard(ctx, req, &resp);
  });
  if (s.ok() || s.code() == absl::StatusCode::kFailedPrecondition ||
      s.code() == absl::StatusCode::kNotFound) {
    Ended(lease.lease_id());
  }
  return s;
}

absl::StatusOr<HeartbeatResponse> ShardingClient::Heartbeat(const HeartbeatRequest& request) {
  HeartbeatRequest req = request;
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation());
  HeartbeatResponse resp;
  RETURN_IF_ERROR(Retry("Heartbeat", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    FillHeld(&req);  // taken afresh for every attempt
    return stub_->Heartbeat(ctx, req, &resp);
  }));
  {
    absl::MutexLock l(&held_mu_);
    for (uint64_t id : resp.cancelled_leases()) held_.erase(id);
    for (uint64_t id : resp.released_unknown_leases()) held_.erase(id);
  }
  return resp;
}

absl::Status ShardingClient::SaveCheckpoint(const std::string& tag) {
  CheckpointRequest req;
  req.set_tag(tag);
  CheckpointResponse resp;
  return Retry("SaveCheckpoint", [&](grpc::ClientContext* ctx) {
    return stub_->SaveCheckpoint(ctx, req, &resp);
  });
}

absl::Status ShardingClient::RestoreCheckpoint(const std::string& tag) {
  CheckpointRequest req;
  req.set_tag(tag);
  CheckpointResponse resp;
  return Retry("RestoreCheckpoint", [&](grpc::ClientContext* ctx) {
    return stub_->RestoreCheckpoint(ctx, req, &resp);
  });
}

absl::StatusOr<ListDatasetsResponse> ShardingClient::ListDatasets() {
  ListDatasetsResponse resp;
  RETURN_IF_ERROR(Retry("ListDatasets", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->ListDatasets(ctx, ListDatasetsRequest(), &resp);
  }));
  return resp;
}

}  // namespace pacer
