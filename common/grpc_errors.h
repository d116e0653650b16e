// A server interceptor that makes gRPC's answer to an unparsable request body readable: the
// callback API finishes such a call with UNIMPLEMENTED and an empty message, which tells the
// client nothing. With this interceptor the call gets INVALID_ARGUMENT naming the method.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace pacer {

// Add to a server: builder.experimental().SetInterceptorCreators(UnparsableRequestInterceptors()).
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
UnparsableRequestInterceptors();

}  // namespace pacer
