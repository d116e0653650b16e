#include "worker_sdk/ps/ps_server.h"

#include <filesystem>
#include <vector>

#include "common/net.h"
#include "common/log.h"
#include "common/status.h"
#include "worker_sdk/ps/ps_snapshot.h"

namespace pacer {

PsServer::PsServer(PsServerOptions options) : options_(std::move(options)) {
  if (!options_.job_token.empty()) auth_.emplace(options_.job_token, GenerateToken());
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(PsServerOptions options) {
  auto hp = ParseHostPort(options.listen);
  if (!hp.ok()) return hp.status();
  if (options.snapshot_ms <= 0) return absl::InvalidArgumentError("pacer-ps: --snapshot-ms must be > 0");
  std::unique_ptr<PsServer> s(new PsServer(std::move(options)));
  if (!s->options_.state_dir.empty()) {
    if (absl::Status l = s->LoadSnapshot(); !l.ok()) return l;
  }
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(hp->ToString(), grpc::InsecureServerCredentials(), &port);
  b.RegisterService(s.get());
  b.SetMaxReceiveMessageSize(64 << 20);
  b.SetMaxSendMessageSize(64 << 20);
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
    return absl::DataLossError("snapshot " + snapshot_path() + ": " + std::string(r.message()));
  }
  PACER_LOG(INFO) << "pacer-ps " << options_.server_id << ": loaded " << store_.rows() << " rows of "
                  << (*snap)->tables_size() << " tables from " << snapshot_path();
  return absl::OkStatus();
}

absl::Status PsServer::SaveSnapshot() {
  if (options_.state_dir.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> l(save_mu_);
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
  std::unique_lock<std::mutex> l(loop_mu_);
  while (!stopping_) {
    loop_cv_.wait_for(l, std::chrono::milliseconds(options_.snapshot_ms), [&] { return stopping_; });
    if (stopping_) break;
    l.unlock();
    if (absl::Status s = SaveSnapshot(); !s.ok()) {
      PACER_LOG(WARNING) << "pacer-ps: periodic snapshot: " << s;
    }
    l.lock();
  }
}

void PsServer::Shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }
  {
    std::lock_guard<std::mutex> l(loop_mu_);
    stopping_ = true;
  }
  loop_cv_.notify_all();
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
  std::vector<uint64_t> keys(req->keys().begin(), req->keys().end());
  std::vector<float> values;
  absl::Status s = store_.Pull(req->table(), keys, &values);
  if (!s.ok()) return ToGrpcStatus(s);
  resp->mutable_values()->Add(values.begin(), values.end());
  return grpc::Status::OK;
}

grpc::Status PsServer::Push(grpc::ServerContext* ctx, const PushRequest* req, PushResponse* resp) {
  if (absl::Status a = Authorize(ctx); !a.ok()) return ToGrpcStatus(a);
  ++pushes_;
  std::vector<uint64_t> keys(req->keys().begin(), req->keys().end());
  std::vector<float> grads(req->gradients().begin(), req->gradients().end());
  auto v = store_.Push(req->table(), keys, grads);
  if (!v.ok()) return ToGrpcStatus(v.status());
  resp->set_version(*v);
  return grpc::Status::OK;
}

grpc::Status PsServer::Stats(grpc::ServerContext* ctx, const PsStatsRequest*, PsStatsResponse* resp) {
  if (absl::Status a = Authorize(ctx); !a.ok()) return ToGrpcStatus(a);
  resp->set_server_id(options_.server_id);
  resp->set_rows(store_.rows());
  resp->set_pulls(pulls_.load());
  resp->set_pushes(pushes_.load());
  return grpc::Status::OK;
}

}  // namespace pacer
