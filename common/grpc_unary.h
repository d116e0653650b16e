// The one shape of every unary handler pacerd and the agent serve (gRPC's callback API):
// authorize, serve, check the reply's size, finish.
//
//   return AnswerNow(ctx, *resp, "ListActions", auth_->RequireWorkerSide(md, "list actions"),
//                    [&] { return reconciler_->ListActions(*req, resp); });
//
// `allowed` is the caller's authorization, worked out by the handler (each service has its own
// rules: common/auth.h, common/identity_rules.h); a refused call finishes with it and is never
// served. `serve` runs only when allowed; it returns absl::Status, or nothing (always OK).
// AnswerNow is for services whose calls are short and never block (the reply is finished
// inline); AnswerLater for services that answer when their work is durable: `serve` gets a
// `done(absl::Status)` to call exactly once, on any thread, after it has filled the reply.
// Either way the reply passes CheckReplySize (common/reply_limit.h) before it is finished, so an
// oversized reply becomes RESOURCE_EXHAUSTED naming `method`, never a serialization abort.
// `method` must be a string literal (or otherwise outlive the call).
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "common/reply_limit.h"

namespace pacer {

template <typename Serve>
grpc::ServerUnaryReactor* AnswerNow(grpc::CallbackServerContext* ctx,
                                    const google::protobuf::MessageLite& reply, std::string_view method,
                                    absl::Status allowed, Serve&& serve) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = std::move(allowed);
  if (s.ok()) {
    if constexpr (std::is_void_v<std::invoke_result_t<Serve>>) {
      std::forward<Serve>(serve)();
    } else {
      s = std::forward<Serve>(serve)();
    }
  }
  reactor->Finish(ReplyStatus(s, reply, method));
  return reactor;
}

template <typename Serve>
grpc::ServerUnaryReactor* AnswerLater(grpc::CallbackServerContext* ctx,
                                      const google::protobuf::MessageLite* reply, std::string_view method,
                                      absl::Status allowed, Serve&& serve) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  std::forward<Serve>(serve)([reactor, reply, method](const absl::Status& s) {
    reactor->Finish(ReplyStatus(s, *reply, method));
  });
  return reactor;
}

}  // namespace pacer
