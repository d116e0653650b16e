// A server interceptor that keeps every status a client gets readable:
//   - an unparsable request body: the callback API finishes such a call with UNIMPLEMENTED and
//     an empty message, which tells the client nothing. With this interceptor the call gets
//     INVALID_ARGUMENT naming the method;
//   - a message past kMaxStatusMessageBytes (one quoting a 60 KB id from the request) is cut in
//     the middle (BoundStatusMessage). gRPC sends it as a header, and a client refuses headers
//     past 8 KiB: it got RESOURCE_EXHAUSTED "received initial metadata size exceeds limit"
//     instead of the code, and a few such replies failed other calls on its connection too.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pacer {

inline constexpr size_t kMaxStatusMessageBytes = 1024;

// `message` when it fits kMaxStatusMessageBytes; otherwise its head and tail (where a limit's
// flag is named) with " [... N bytes cut ...] " between them, cut on UTF-8 character boundaries.
std::string BoundStatusMessage(std::string_view message);

// Add to a server: builder.experimental().SetInterceptorCreators(UnparsableRequestInterceptors()).
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
UnparsableRequestInterceptors();

}  // namespace pacer
