#include "rendezvous/grpc_rendezvous_service.h"

#include "common/grpc_unary.h"

namespace pacer {
namespace {

// A Get that may wait: parked in the impl under its own address as the tag. OnCancel (deadline
// or client gone) takes it out again; whoever takes it out finishes it, exactly once. gRPC
// calls OnCancel and OnDone only once the handler has returned the reactor (a call cancelled
// earlier still gets OnCancel then), so `this` outlives Start and no cancellation is missed.
// OnDone, once the reply is sent or dropped, gives its bytes back to the caller's budget.
class WaitingGet final : public grpc::ServerUnaryReactor {
 public:
  explicit WaitingGet(RendezvousServiceImpl* impl) : impl_(impl) {}

  void Start(const RendezvousGetRequest* req, RendezvousGetResponse* resp, const std::string& caller) {
    impl_->Get(*req, resp, this, [this](absl::Status s) { Finish(ToGrpcStatus(s)); }, caller);
  }
  void OnCancel() override { impl_->CancelWait(this); }
  void OnDone() override {
    impl_->Finished(this);
    delete this;
  }

 private:
  RendezvousServiceImpl* impl_;
};

}  // namespace

// Set, Add and Check need a worker-side credential; the store charges what a caller writes to
// its credential (Describe()).
absl::StatusOr<std::string> GrpcRendezvousService::StoreCaller(grpc::CallbackServerContext* ctx,
                                                               const char* what) const {
  absl::StatusOr<Principal> caller = auth_->Identify(ctx->client_metadata());
  if (!caller.ok()) return caller.status();
  RETURN_IF_ERROR(auth_->RequireWorkerSide(ctx->client_metadata(), what));
  return caller->Describe();
}

grpc::ServerUnaryReactor* GrpcRendezvousService::Set(grpc::CallbackServerContext* ctx,
                                                     const RendezvousSetRequest* req,
                                                     RendezvousSetResponse* resp) {
  absl::StatusOr<std::string> who = StoreCaller(ctx, "rendezvous Set");
  return AnswerNow(ctx, *resp, "Set", who.status(), [&] { return impl_->Set(*req, resp, *who); });
}

grpc::ServerUnaryReactor* GrpcRendezvousService::Add(grpc::CallbackServerContext* ctx,
                                                     const RendezvousAddRequest* req,
                                                     RendezvousAddResponse* resp) {
  absl::StatusOr<std::string> who = StoreCaller(ctx, "rendezvous Add");
  return AnswerNow(ctx, *resp, "Add", who.status(), [&] { return impl_->Add(*req, resp, *who); });
}

grpc::ServerUnaryReactor* GrpcRendezvousService::Check(grpc::CallbackServerContext* ctx,
                                                       const RendezvousCheckRequest* req,
                                                       RendezvousCheckResponse* resp) {
  absl::StatusOr<std::string> who = StoreCaller(ctx, "rendezvous Check");
  return AnswerNow(ctx, *resp, "Check", who.status(), [&] { return impl_->Check(*req, resp); });
}

// Join and Reform act as the request's worker; only the chief (or the job / admin token) opens
// the group, so no stray Join can fix the world size for everyone. A worker credential joins at
// its own rank and under its current incarnation (CheckJoin, common/identity_rules.h).
grpc::ServerUnaryReactor* GrpcRendezvousService::Join(grpc::CallbackServerContext* ctx,
                                                      const RendezvousJoinRequest* req,
                                                      RendezvousJoinResponse* resp) {
  auto caller = auth_->Identify(ctx->client_metadata());
  absl::Status s = caller.status();
  if (s.ok()) s = auth_->RequireWorker(ctx->client_metadata(), req->worker_id(), "rendezvous join");
  RendezvousJoinRequest join = *req;
  if (s.ok() && directory_ != nullptr) {
    absl::StatusOr<int32_t> rank =
        CheckJoin(*caller, *directory_, req->worker_id(), req->rank(), req->incarnation());
    if (rank.ok()) join.set_rank(*rank);
    s = rank.status();
  }
  return AnswerNow(ctx, *resp, "Join", s,
                   [&] { return impl_->Join(join, resp, JoinAuthority{caller->chief()}); });
}

grpc::ServerUnaryReactor* GrpcRendezvousService::Reform(grpc::CallbackServerContext* ctx,
                                                        const RendezvousReformRequest* req,
                                                        RendezvousReformResponse* resp) {
  return AnswerNow(ctx, *resp, "Reform",
                   auth_->RequireWorker(ctx->client_metadata(), req->worker_id(), "rendezvous reform"),
                   [&] { return impl_->Reform(*req, resp); });
}

grpc::ServerUnaryReactor* GrpcRendezvousService::Get(grpc::CallbackServerContext* ctx,
                                                     const RendezvousGetRequest* req,
                                                     RendezvousGetResponse* resp) {
  // The caller's credential: its parked Gets and unsent replies are charged to it.
  absl::StatusOr<Principal> caller = auth_->Identify(ctx->client_metadata());
  absl::Status s = caller.status();
  if (s.ok()) s = auth_->RequireWorkerSide(ctx->client_metadata(), "rendezvous Get");
  if (!s.ok()) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  auto* reactor = new WaitingGet(impl_);
  reactor->Start(req, resp, caller->Describe());
  return reactor;
}

}  // namespace pacer
