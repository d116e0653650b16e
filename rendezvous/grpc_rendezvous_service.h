// GrpcRendezvousService: the gRPC adapter of the rendezvous store (callback API).
//
// Every handler authorizes the caller and delegates to RendezvousServiceImpl: Join and Reform act
// as the request's worker (its credential or a token; a worker credential joins at its own rank
// and under its current sharding incarnation, read through `directory`, which may be null: no
// such rule); Set, Get, Add and Check need a worker or chief credential or a token. A waiting Get holds no server thread: its reactor is parked in the
// impl until the keys arrive, the generation moves on, or the call is cancelled (its deadline
// passed: the client sees DEADLINE_EXCEEDED).
#pragma once

#include "common/auth.h"
#include "common/identity_rules.h"
#include "proto/pacer/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_service.h"

namespace pacer {

class GrpcRendezvousService final : public Rendezvous::CallbackService {
 public:
  GrpcRendezvousService(RendezvousServiceImpl* impl, const Authenticator* auth,
                        const WorkerDirectory* directory = nullptr)
      : impl_(impl), auth_(auth), directory_(directory) {}

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
  // The caller's Describe() if it holds a worker-side credential.
  absl::StatusOr<std::string> StoreCaller(grpc::CallbackServerContext* ctx, const char* what) const;

  RendezvousServiceImpl* impl_;
  const Authenticator* auth_;
  const WorkerDirectory* directory_;
};

}  // namespace pacer
