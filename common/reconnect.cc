#include "common/reconnect.h"

namespace pacer {

void SetReconnectBackoff(grpc::ChannelArguments* args, int initial_ms, int max_ms) {
  args->SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, initial_ms);
  args->SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is deliberately not set: it is the connect timeout of one
  // attempt (common/reconnect.h), and gRPC's default gives a TLS handshake time to finish.
}

void WaitOutPause(grpc::Channel* channel, std::chrono::milliseconds pause) {
  const auto end = std::chrono::system_clock::now() + pause;
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  // WaitForStateChange polls the channel (its connection attempt progresses) until the state
  // differs from `state` or `end` passes.
  while (channel->WaitForStateChange(state, end)) {
    const grpc_connectivity_state now = channel->GetState(/*try_to_connect=*/true);
    if (now == GRPC_CHANNEL_READY) return;  // connected (again): retry at once
    state = now;
  }
}

}  // namespace pacer
