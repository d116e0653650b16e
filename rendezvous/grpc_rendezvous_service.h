// GrpcRendezvousService: the gRPC adapter of the rendezvous store (callback API).
//
// Every handler authenticates the job token (Role::kWorker) and delegates to
// RendezvousServiceImpl. A waiting Get holds no server thread: its reactor is parked in the
// impl until the keys arrive, the generation moves on, or the call is cancelled (its deadline
// passed: the client sees DEADLINE_EXCEEDED).
#pragma once

#include "common/auth.h"
#include "proto/pacer/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_service.h"

namespace pacer {

class GrpcRendezvousService final : public Rendezvous::CallbackService {
 public:
  GrpcRendezvousService(RendezvousServiceImpl* impl, const Authenticator* auth)
      : impl_(impl), auth_(auth) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const RendezvousJoinRequest* req,
                                 RendezvousJoinResponse* resp) override;
  grpc::ServerUnaryReactor* Reform(grpc::CallbackServerContext* ctx,
                                   const RendezvousReformRequest* req,
                                   RendezvousReformResponse* resp) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const RendezvousSetRequest* req,
                                RendezvousSetResponse* resp) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const RendezvousGetRequest* req,
                                RendezvousGetResponse* resp) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const RendezvousAddRequest* req,
                                RendezvousAddResponse* resp) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const RendezvousCheckRequest* req,
                                  RendezvousCheckResponse* resp) override;

 private:
  RendezvousServiceImpl* impl_;
  const Authenticator* auth_;
};

}  // namespace pacer
