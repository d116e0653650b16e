// A bare gRPC echo service (callback API): the baseline Pacer's RPC throughput is compared with.
#pragma once

#include "proto/pacer/bench.grpc.pb.h"

namespace pacer::bench {

class EchoServiceImpl final : public Echo::CallbackService {
 public:
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* ctx, const EchoMessage* req,
                                 EchoMessage* resp) override {
    *resp = *req;
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace pacer::bench
