// A retry's pause that keeps a gRPC channel connecting.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>

namespace pacer {

// Waits up to `pause` between two attempts of a call, watching `channel`'s state, and returns
// early once it is connected again. A synchronous client has no thread polling its channel
// between calls: a connection attempt (to the pacerd that took over as leader, or one that
// restarted) would not complete until gRPC's backup poller ran, every 5 s, and a failover of 2 s
// would look like 10-30 s to the caller. Watching the state polls the channel, so the connection
// completes during the pause. A channel that stays READY (the server answers errors) waits the
// whole pause.
inline void PauseWatchingChannel(grpc::Channel* channel, std::chrono::milliseconds pause) {
  const auto until = std::chrono::system_clock::now() + pause;
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (channel->WaitForStateChange(state, until)) {
    const grpc_connectivity_state now = channel->GetState(/*try_to_connect=*/true);
    if (now == GRPC_CHANNEL_READY && state != GRPC_CHANNEL_READY) return;
    state = now;
  }
}

}  // namespace pacer
