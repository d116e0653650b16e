#include "worker_sdk/ps/ps_server.h"

#include <filesystem>
#include <vector>

#include "common/net.h"
#include "common/log.h"
#include "common/status.h"
#include "common/tls.h"
#include "worker_sdk/ps/ps_snapshot.h"

namespace pacer {

PsServer::PsServer(PsServerOptions options, const PsLimits& limits)
    : options_(std::move(options)), store_(limits) {
  if (!options_.job_token.empty()) auth_.emplace(options_.job_token, GenerateToken());
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(PsServerOptions options) {
  auto hp = ParseHostPort(options.listen);
  if (!hp.ok()) return hp.status();
  if (options.snapshot_ms <= 0) return absl::InvalidArgumentError("pacer-ps: --snapshot-ms must be > 0");
  if (options.max_threads < 1 || options.max_threads > 1024) {
    return absl::InvalidArgumentError("pacer-ps: --max-threads must be in 1..1024");
  }
  if (options.job_token.empty()) {
    if (!options.insecure_no_auth) {
      return absl::InvalidArgumentError(
          "pacer-ps: no job token: set PACER_TOKEN or give --token-file (pacerd writes "
          "<data_dir>/job.token); --insecure-no-auth serves without one on loopback only");
    }
    if (!IsLoopbackHost(hp->host)) {
      return absl::InvalidArgumentError("pacer-ps: --insecure-no-auth is refused on non-loopback address '" +
                                        options.listen + "': give the job token");
    }
  } else if (IsCredential(options.job_token)) {
    return absl::InvalidArgumentError(
        "pacer-ps: its token is a per-process credential, not the job token (it checks the workers' "
        "credentials with the job token): under pacer-agent use --worker-credentials inherit");
  }
  PsLimits limits = options.limits;
  if (absl::Status l = limits.Resolve(); !l.ok()) return absl::InvalidArgumentError("pacer-ps: " + std::string(l.message()));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                   MakeServerCredentials(options.tls, hp->host, "pacer-ps"));
  std::unique_ptr<PsServer> s(new PsServer(std::move(options), limits));
  if (!s->options_.state_dir.empty()) {
    if (absl::Status l = s->LoadSnapshot(); !l.ok()) return l;
  }
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(hp->ToString(), creds, &port);
  b.RegisterService(s.get());
  // The largest request the limits allow (keys at 10 bytes each on the wire, 4 a float), with
  // room for the table name: gRPC refuses anything bigger before it is parsed.
  const uint64_t max_request = std::min<uint64_t>(
      64ull << 20, limits.max_keys_per_request * 10 + limits.max_values_per_request * 5 + 4096);
  b.SetMaxReceiveMessageSize(static_cast<int>(max_request));
  b.SetMaxSendMessageSize(64 << 20);
  grpc::ResourceQuota quota("pacer-ps");
  quota.SetMaxThreads(s->options_.max_threads + 2);  // + gRPC's own pollers
  b.SetResourceQuota(quota);
  s->server_ = b.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError("pacer-ps: cannot listen on " + s->options_.listen);
  }
  s->address_ = hp->host + ":" + std::to_string(port);
  if (!s->options_.state_dir.empty()) s->snapshot_thread_ = std::thread([p = s.get()] { p->SnapshotLoop(); });
  return s;
}

PsServer::~PsServer() { Shutdown(); }

std::string PsServer::snapshot_path() const { return options_.state_dir + "/" + kPsSnapshotFile; }

absl::Status PsServer::LoadSnapshot() {
  std::error_code ec;
  std::filesystem::create_directories(options_.state_dir, ec);
  if (ec) return absl::InvalidArgumentError("pacer-ps: cannot create --state-dir " + options_.state_dir + ": " + ec.message());
  auto snap = ReadPsSnapshot(snapshot_path());
  if (!snap.ok()) return snap.status();
  if (!snap->has_value()) return absl::OkStatus();
  if (!(*snap)->server_id().empty() && (*snap)->server_id() != options_.server_id) {
    return absl::FailedPreconditionError("snapshot " + snapshot_path() + " belongs to server '" +
                                         (*snap)->server_id() + "', not '" + options_.server_id +
                                         "': each server needs its own --state-dir");
  }
  if (absl::Status r = store_.Restore(**snap); !r.ok()) {
    if (r.code() == absl::StatusCode::kResourceExhausted) {  // intact, but over the --max-* flags
      return absl::ResourceExhaustedError("snapshot " + snapshot_path() + ": " + std::string(r.message()) +
                                          "; raise the limit to load it");
    }
    return absl::DataLossError("snapshot " + snapshot_path() + ": " + std::string(r.message()));
  }
  PACER_LOG(INFO) << "pacer-ps " << options_.server_id << ": loaded " << store_.rows() << " rows of "
                  << (*snap)->tables_size() << " tables from " << snapshot_path();
  return absl::OkStatus();
}

absl::Status PsServer::SaveSnapshot() {
  if (options_.state_dir.empty()) return absl::OkStatus();
  absl::MutexLock l(&save_mu_);
  const uint64_t changes = store_.changes();  // read before copying: a later change saves again
  if (changes == saved_changes_) return absl::OkStatus();
  PsSnapshot snap = store_.Snapshot();
  snap.set_server_id(options_.server_id);
  snap.set_saved_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count());
  if (absl::Status w = WritePsSnapshot(snapshot_path(), snap); !w.ok()) return w;
  saved_changes_ = changes;
  return absl::OkStatus();
}

// Periodic saves. The wait is a timer only (no state depends on it), so it reads the real clock.
void PsServer::SnapshotLoop() {
  absl::MutexLock l(&loop_mu_);
  while (!loop_mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(options_.snapshot_ms))) {
    loop_mu_.Unlock();
    if (absl::Status s = SaveSnapshot(); !s.ok()) {
      PACER_LOG(WARNING) << "pacer-ps: periodic snapshot: " << s;
    }
    loop_mu_.Lock();
  }
}

void PsServer::Shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }
  {
    absl::MutexLock l(&loop_mu_);
    stopping_ = true;
  }
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  // No push arrives any more: this save holds everything.
  if (absl::Status s = SaveSnapshot(); !s.ok()) {
    PACER_LOG(ERROR) << "pacer-ps " << options_.server_id << ": last snapshot: " << s;
  }
}

absl::Status PsServer::Authorize(grpc::ServerContext* ctx) const {
  if (!auth_) return absl::OkStatus();
  return auth_->Require(ctx->client_metadata(), Role::kWorker);
}

grpc::Status PsServer::CreateTable(grpc::ServerContext* ctx, const CreateTableRequest* req,
                                   CreateTableResponse* resp) {
  if (absl::Status a = Authorize(ctx); !a.ok()) return ToGrpcStatus(a);
  auto created = store_.CreateTable(req->spec());
  if (!created.ok()) return ToGrpcStatus(created.status());
  resp->set_created(*created);
  return grpc::Status::OK;
}

grpc::Status PsServer::Pull(grpc::ServerContext* ctx, const PullRequest* req, PullResponse* resp) {
  if (absl::Status a = Authorize(ctx); !a.ok()) return ToGrpcStatus(a);
  ++pulls_;
  const absl::Span<const uint64_t> keys(req->keys().data(), req->keys().size());
  absl::Status s = store_.PullInto(req->table(), keys, [resp](size_t n) {
    resp->mutable_values()->Resize(static_cast<int>(n), 0.0f);
    return resp->mutable_values()->mutable_data();
  });
  return ToGrpcStatus(s);
}

grpc::Status PsServer::Push(grpc::ServerContext* ctx, const PushRequest* req, PushResponse* resp) {
  if (absl::Status a = Authorize(ctx); !a.ok()) return ToGrpcStatus(a);
  ++pushes_;
  auto v = store_.Push(req->table(), absl::Span<const uint64_t>(req->keys().data(), req->keys().size()),
                       absl::Span<const float>(req->gradients().data(), req->gradients().size()));
  if (!v.ok()) return ToGrpcStatus(v.status());
  resp->set_version(*v);
  return grpc::Status::OK;
}

grpc::Status PsServer::Stats(grpc::ServerContext* ctx, const PsStatsRequest*, PsStatsResponse* resp) {
  if (absl::Status a = Authorize(ctx); !a.ok()) return ToGrpcStatus(a);
  resp->set_server_id(options_.server_id);
  resp->set_rows(store_.rows());
  resp->set_bytes(store_.bytes());
  resp->set_pulls(pulls_.load());
  resp->set_pushes(pushes_.load());
  return grpc::Status::OK;
}

}  // namespace pacer
