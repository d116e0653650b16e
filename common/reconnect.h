// The reconnect backoff of a client channel to pacerd (or pacer-ps).
//
// gRPC (1.51) has three arguments for it, and the one named GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is
// not a floor of the backoff: it is the time one connection attempt (TCP connect plus the TLS
// handshake) is given before it is abandoned (the attempt's deadline is the later of now + that
// and the next backoff time). Set to 50 ms with a 500 ms maximum backoff, an attempt had at most
// ~500 ms; a TLS handshake needs several reads, each made only when some thread polls the
// channel, so after a pacerd restart a client that retried meanwhile timed out every handshake
// and never reconnected (tls_restart_test). SetReconnectBackoff sets the initial and the largest
// pause between attempts and leaves the attempt's timeout at gRPC's default (20 s). The other
// half, a synchronous client polling its channel while it waits to retry, is
// PauseWatchingChannel (common/channel_wait.h).
#pragma once

#include <grpcpp/grpcpp.h>

namespace pacer {

// Reconnect backoff: the first pause after a failed connection attempt, growing (x1.6, with
// gRPC's jitter) to at most `max_ms`. Each attempt keeps gRPC's default connect timeout.
void SetReconnectBackoff(grpc::ChannelArguments* args, int initial_ms, int max_ms);

}  // namespace pacer
