#include "worker_sdk/sharding_client.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/auth.h"
#include "common/log.h"
#include "common/status.h"

namespace pacer {
namespace {

void FromEnv(std::string& field, const char* name) {
  if (!field.empty()) return;
  if (const char* v = std::getenv(name)) field = v;
}

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

void ShardingClientOptions::FillFromEnvironment() {
  if (const char* v = std::getenv("PACER_ADDR"); v && *v) address = v;
  FromEnv(token, "PACER_TOKEN");
  FromEnv(worker_id, "PACER_WORKER_ID");
  FromEnv(node, "PACER_NODE");
}

ShardingClient::ShardingClient(ShardingClientOptions options)
    : options_(std::move(options)), jitter_(std::random_device{}()) {
  auto creds = options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(options_.address, creds, args);
  stub_ = ShardingService::NewStub(channel_);
}

absl::StatusOr<std::unique_ptr<ShardingClient>> ShardingClient::Connect(
    ShardingClientOptions options) {
  if (options.worker_id.empty()) {
    return absl::InvalidArgumentError("worker_id is required (or PACER_WORKER_ID)");
  }
  if (options.token.empty()) return absl::InvalidArgumentError("token is required (or PACER_TOKEN)");
  std::unique_ptr<ShardingClient> c(new ShardingClient(std::move(options)));
  RETURN_IF_ERROR(c->Reregister());
  return c;
}

absl::Status ShardingClient::Reregister() {
  RegisterWorkerRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_node(options_.node);
  RegisterWorkerResponse resp;
  RETURN_IF_ERROR(Retry("RegisterWorker", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->RegisterWorker(ctx, req, &resp);
  }));
  registration_ = std::move(resp);
  return absl::OkStatus();
}

bool ShardingClient::IsIncarnationGone(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         (status.message().find("declared lost") != std::string_view::npos ||
          status.message().find("stale incarnation") != std::string_view::npos);
}

absl::Status ShardingClient::Retry(const char* what,
                                   const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  const auto start = std::chrono::steady_clock::now();
  int64_t backoff = options_.backoff_initial_ms;
  for (int attempt = 1;; ++attempt) {
    if (cancelled()) return absl::CancelledError(std::string(what) + ": client shut down");
    grpc::ClientContext ctx;
    AttachToken(&ctx, options_.token);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.rpc_timeout_ms));
    grpc::Status s = call(&ctx);
    if (s.ok() || !Retryable(s.error_code())) return FromGrpcStatus(s);
    const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
    if (spent >= options_.retry_budget_ms) {
      return absl::UnavailableError(std::string(what) + ": pacerd at " + options_.address +
                                    " unreachable for " + std::to_string(spent) +
                                    " ms: " + s.error_message());
    }
    if (attempt == 1 || attempt % 20 == 0) {
      PACER_LOG(WARNING) << what << ": " << s.error_message() << "; retrying";
    }
    // Backoff between attempts (not synchronisation): full jitter, capped.
    int64_t pause_ms;
    {
      std::lock_guard<std::mutex> l(jitter_mu_);
      pause_ms = std::uniform_int_distribution<int64_t>(backoff / 2, backoff)(jitter_);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
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

absl::StatusOr<FetchShardResponse> ShardingClient::Fetch(const std::string& dataset) {
  FetchShardRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation());
  req.set_dataset(dataset);
  FetchShardResponse resp;
  RETURN_IF_ERROR(Retry("FetchShard", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->FetchShard(ctx, req, &resp);
  }));
  return resp;
}

absl::StatusOr<uint64_t> ShardingClient::ReportProgress(const Lease& lease, uint64_t records_done) {
  ProgressRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation());
  req.set_lease_id(lease.lease_id());
  req.set_fencing_token(lease.fencing_token());
  req.set_records_done(records_done);
  ProgressResponse resp;
  RETURN_IF_ERROR(Retry("ReportProgress", [&](grpc::ClientContext* ctx) {
    return stub_->ReportProgress(ctx, req, &resp);
  }));
  return resp.records_done();
}

absl::Status ShardingClient::Complete(const Lease& lease) {
  CompleteShardRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation());
  req.set_lease_id(lease.lease_id());
  req.set_fencing_token(lease.fencing_token());
  CompleteShardResponse resp;
  return Retry("CompleteShard", [&](grpc::ClientContext* ctx) {
    return stub_->CompleteShard(ctx, req, &resp);
  });
}

absl::Status ShardingClient::Release(const Lease& lease, uint64_t records_done, bool failed,
                                     const std::string& detail) {
  ReleaseShardRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation());
  req.set_lease_id(lease.lease_id());
  req.set_fencing_token(lease.fencing_token());
  req.set_records_done(records_done);
  req.set_failed(failed);
  req.set_detail(detail);
  ReleaseShardResponse resp;
  return Retry("ReleaseShard", [&](grpc::ClientContext* ctx) {
    return stub_->ReleaseShard(ctx, req, &resp);
  });
}

absl::StatusOr<HeartbeatResponse> ShardingClient::Heartbeat(const HeartbeatRequest& request) {
  HeartbeatRequest req = request;
  req.set_worker_id(options_.worker_id);
  req.set_incarnation(incarnation());
  HeartbeatResponse resp;
  RETURN_IF_ERROR(Retry("Heartbeat", [&](grpc::ClientContext* ctx) {
    resp.Clear();
    return stub_->Heartbeat(ctx, req, &resp);
  }));
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
