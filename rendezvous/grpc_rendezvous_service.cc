#include "rendezvous/grpc_rendezvous_service.h"

#include "common/reply_limit.h"

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

// `Call` is evaluated with the request `req`, the reply `resp` and the caller's credential
// `who` (its Describe(): the store charges what a caller writes to it) in scope.
#define PACER_RENDEZVOUS_HANDLER(Method, Request, Response, Call)                              \
  grpc::ServerUnaryReactor* GrpcRendezvousService::Method(grpc::CallbackServerContext* ctx,    \
                                                          const Request* req, Response* resp) { \
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();                                 \
    absl::StatusOr<Principal> caller = auth_->Identify(ctx->client_metadata());                \
    absl::Status s = caller.status();                                                          \
    if (s.ok()) s = auth_->RequireWorkerSide(ctx->client_metadata(), "rendezvous " #Method);    \
    if (s.ok()) {                                                                              \
      const std::string who = caller->Describe();                                              \
      s = (Call);                                                                              \
    }                                                                                          \
    reactor->Finish(ReplyStatus(s, *resp, #Method));                                           \
    return reactor;                                                                            \
  }

PACER_RENDEZVOUS_HANDLER(Set, RendezvousSetRequest, RendezvousSetResponse, impl_->Set(*req, resp, who))
PACER_RENDEZVOUS_HANDLER(Add, RendezvousAddRequest, RendezvousAddResponse, impl_->Add(*req, resp, who))
PACER_RENDEZVOUS_HANDLER(Check, RendezvousCheckRequest, RendezvousCheckResponse, impl_->Check(*req, resp))

#undef PACER_RENDEZVOUS_HANDLER

// Join and Reform act as the request's worker; only the chief (or the job / admin token) opens
// the group, so no stray Join can fix the world size for everyone. A worker credential joins at
// its own rank and under its current incarnation (CheckJoin, common/identity_rules.h).
grpc::ServerUnaryReactor* GrpcRendezvousService::Join(grpc::CallbackServerContext* ctx,
                                                      const RendezvousJoinRequest* req,
                                                      RendezvousJoinResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto caller = auth_->Identify(ctx->client_metadata());
  absl::Status s = caller.status();
  if (s.ok()) s = auth_->RequireWorker(ctx->client_metadata(), req->worker_id(), "rendezvous join");
  RendezvousJoinRequest join = *req;
  if (s.ok() && directory_ != nullptr) {
    absl::StatusOr<int32_t> rank = CheckJoin(*caller, *directory_, req->worker_id(), req->rank(), req->incarnation());
    if (rank.ok()) join.set_rank(*rank);
    s = rank.status();
  }
  if (s.ok()) s = impl_->Join(join, resp, JoinAuthority{caller->chief()});
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcRendezvousService::Reform(grpc::CallbackServerContext* ctx,
                                                        const RendezvousReformRequest* req,
                                                        RendezvousReformResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = auth_->RequireWorker(ctx->client_metadata(), req->worker_id(), "rendezvous reform");
  if (s.ok()) s = impl_->Reform(*req, resp);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
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
