#include "worker_sdk/ps/ps_server.h"

#include <vector>

#include "common/net.h"
#include "common/status.h"

namespace pacer {

PsServer::PsServer(PsServerOptions options) : options_(std::move(options)) {
  if (!options_.job_token.empty()) auth_.emplace(options_.job_token, GenerateToken());
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(PsServerOptions options) {
  auto hp = ParseHostPort(options.listen);
  if (!hp.ok()) return hp.status();
  std::unique_ptr<PsServer> s(new PsServer(std::move(options)));
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
  return s;
}

PsServer::~PsServer() { Shutdown(); }

void PsServer::Shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
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
