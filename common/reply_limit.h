// The largest reply pacerd sends. Every Pacer client reads replies of up to 64 MiB (the SDK,
// pacerctl), gRPC's default client 4 MiB, and protobuf cannot serialize a message of 2 GiB or
// more at all — gRPC aborts the process when a reply fails to serialize. So every handler checks
// its reply's size before finishing the call: a reply over the limit is never serialized; the
// call gets RESOURCE_EXHAUSTED naming the method and the limit instead, and the caller asks for
// less (fewer keys, one dataset, a later page).
#pragma once

#include <google/protobuf/message_lite.h>
#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/status.h"

namespace pacer {

inline constexpr size_t kMaxReplyBytes = size_t{16} << 20;

// `s` when it is not OK or `reply` fits in kMaxReplyBytes; RESOURCE_EXHAUSTED naming `method`
// otherwise.
inline absl::Status CheckReplySize(const absl::Status& s, const google::protobuf::MessageLite& reply,
                                   std::string_view method) {
  if (!s.ok()) return s;
  const size_t bytes = reply.ByteSizeLong();
  if (bytes <= kMaxReplyBytes) return s;
  return absl::ResourceExhaustedError(std::string(method) + ": the reply would be " +
                                      std::to_string(bytes) + " bytes, over pacerd's reply limit of " +
                                      std::to_string(kMaxReplyBytes) + " bytes; ask for less");
}

// The gRPC status to finish a unary call with: ToGrpcStatus(CheckReplySize(s, reply, method)).
inline grpc::Status ReplyStatus(const absl::Status& s, const google::protobuf::MessageLite& reply,
                                std::string_view method) {
  return ToGrpcStatus(CheckReplySize(s, reply, method));
}

}  // namespace pacer
