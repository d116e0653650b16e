#include "sharding_service/grpc_sharding_service.h"

#include <utility>

#include "common/grpc_unary.h"

namespace pacer {

absl::Status GrpcShardingService::CheckRegister(const Authenticator::Metadata& md,
                                                const RegisterWorkerRequest& req) const {
  auto caller = auth_->Identify(md);
  if (!caller.ok()) return caller.status();
  RETURN_IF_ERROR(auth_->RequireWorker(md, req.worker_id(), "register worker"));
  return directory_ ? CheckNodeClaim(*caller, *directory_, req.worker_id(), req.node(), "register worker")
                    : absl::OkStatus();
}

// Each handler: authorize with the call's metadata, hand the request to the ShardingApi, finish
// when it answers (common/grpc_unary.h).

grpc::ServerUnaryReactor* GrpcShardingService::RegisterDataset(grpc::CallbackServerContext* ctx,
                                                               const RegisterDatasetRequest* req,
                                                               RegisterDatasetResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "RegisterDataset", auth_->RequireWorkerSide(md, "register dataset"),
                     [&](ShardingApi::Done done) { impl_->RegisterDataset(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::RegisterWorker(grpc::CallbackServerContext* ctx,
                                                              const RegisterWorkerRequest* req,
                                                              RegisterWorkerResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "RegisterWorker", CheckRegister(md, *req),
                     [&](ShardingApi::Done done) { impl_->RegisterWorker(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::FetchShard(grpc::CallbackServerContext* ctx,
                                                          const FetchShardRequest* req,
                                                          FetchShardResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "FetchShard", auth_->RequireWorker(md, req->worker_id(), "fetch shard"),
                     [&](ShardingApi::Done done) { impl_->FetchShard(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::ReportProgress(grpc::CallbackServerContext* ctx,
                                                              const ProgressRequest* req,
                                                              ProgressResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "ReportProgress",
                     auth_->RequireWorker(md, req->worker_id(), "report progress"),
                     [&](ShardingApi::Done done) { impl_->ReportProgress(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::CompleteShard(grpc::CallbackServerContext* ctx,
                                                             const CompleteShardRequest* req,
                                                             CompleteShardResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "CompleteShard", auth_->RequireWorker(md, req->worker_id(), "complete shard"),
                     [&](ShardingApi::Done done) { impl_->CompleteShard(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::ReleaseShard(grpc::CallbackServerContext* ctx,
                                                            const ReleaseShardRequest* req,
                                                            ReleaseShardResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "ReleaseShard", auth_->RequireWorker(md, req->worker_id(), "release shard"),
                     [&](ShardingApi::Done done) { impl_->ReleaseShard(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                         const HeartbeatRequest* req,
                                                         HeartbeatResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "Heartbeat", auth_->RequireWorker(md, req->worker_id(), "heartbeat"),
                     [&](ShardingApi::Done done) { impl_->Heartbeat(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::SaveCheckpoint(grpc::CallbackServerContext* ctx,
                                                              const CheckpointRequest* req,
                                                              CheckpointResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "SaveCheckpoint", auth_->RequireChief(md, "save checkpoint"),
                     [&](ShardingApi::Done done) { impl_->SaveCheckpoint(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::RestoreCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const CheckpointRequest* req,
                                                                 CheckpointResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "RestoreCheckpoint", auth_->RequireChief(md, "restore checkpoint"),
                     [&](ShardingApi::Done done) { impl_->RestoreCheckpoint(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::ListDatasets(grpc::CallbackServerContext* ctx,
                                                            const ListDatasetsRequest* req,
                                                            ListDatasetsResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "ListDatasets", auth_->RequireWorkerSide(md, "list datasets"),
                     [&](ShardingApi::Done done) { impl_->ListDatasets(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::SetAllocation(grpc::CallbackServerContext* ctx,
                                                             const SetAllocationRequest* req,
                                                             SetAllocationResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "SetAllocation", auth_->Require(md, Role::kAdmin),
                     [&](ShardingApi::Done done) { impl_->SetAllocation(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::SetTailBackup(grpc::CallbackServerContext* ctx,
                                                             const SetTailBackupRequest* req,
                                                             SetTailBackupResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "SetTailBackup", auth_->Require(md, Role::kAdmin),
                     [&](ShardingApi::Done done) { impl_->SetTailBackup(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::DeleteDataset(grpc::CallbackServerContext* ctx,
                                                             const DeleteDatasetRequest* req,
                                                             DeleteDatasetResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "DeleteDataset", auth_->Require(md, Role::kAdmin),
                     [&](ShardingApi::Done done) { impl_->DeleteDataset(*req, resp, std::move(done)); });
}

grpc::ServerUnaryReactor* GrpcShardingService::ResetDataset(grpc::CallbackServerContext* ctx,
                                                            const ResetDatasetRequest* req,
                                                            ResetDatasetResponse* resp) {
  const Authenticator::Metadata& md = ctx->client_metadata();
  return AnswerLater(ctx, resp, "ResetDataset", auth_->Require(md, Role::kAdmin),
                     [&](ShardingApi::Done done) { impl_->ResetDataset(*req, resp, std::move(done)); });
}

}  // namespace pacer
