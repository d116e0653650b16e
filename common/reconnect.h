// Reconnecting to a pacerd that went away (killed, restarted on the same port): the two things
// every client channel of Pacer's needs, whatever API it calls gRPC with.
//
// 1. The reconnect backoff. gRPC (1.51) has three arguments for it, and the one named
//    GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is not a floor of the backoff: it is the time one
//    connection attempt (TCP connect plus the TLS handshake) is given before it is abandoned
//    (the attempt's deadline is the later of now + that and the next backoff time). Set low, a
//    TLS handshake that needs a few hundred ms on a loaded machine never finishes.
//    SetReconnectBackoff sets the initial and the largest pause between attempts and leaves
//    the attempt's timeout at gRPC's default (20 s).
// 2. Someone polling the connection attempt. gRPC makes progress on a channel's sockets only
//    while a thread polls them: a call waiting for its reply, a watcher of the channel's state,
//    the callback API's own threads, or else gRPC's backup poller, every 5 s. A synchronous
//    call that is not wait-for-ready fails at once while the channel is in TRANSIENT_FAILURE
//    (pick_first keeps it there while it reconnects), so a client that only makes such calls and
//    sleeps in between leaves the reconnection to the backup poller: a plaintext connection
//    needs one poll and comes back within 5 s, a TLS handshake needs several and runs out of
//    time at every attempt. WaitOutPause spends a client's pause between retries watching the
//    channel instead of sleeping, which polls the attempt, and ends early once it connects.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>

namespace pacer {

// Reconnect backoff: the first pause after a failed connection attempt, growing (x1.6, with
// gRPC's jitter) to at most `max_ms`. Each attempt keeps gRPC's default connect timeout.
void SetReconnectBackoff(grpc::ChannelArguments* args, int initial_ms, int max_ms);

// Waits `pause` (a retry backoff) while watching `channel`'s connectivity, which drives its
// connection attempts; returns early when the channel becomes READY. Asks the channel to
// connect when it is idle.
void WaitOutPause(grpc::Channel* channel, std::chrono::milliseconds pause);

}  // namespace pacer
