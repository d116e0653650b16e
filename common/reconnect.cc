#include "common/reconnect.h"

namespace pacer {

void SetReconnectBackoff(grpc::ChannelArguments* args, int initial_ms, int max_ms) {
  args->SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, initial_ms);
  args->SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is deliberately not set: it is the connect timeout of one
  // attempt (common/reconnect.h), and gRPC's default gives a TLS handshake time to finish.
}

}  // namespace pacer
