// Addresses: "host:port" parsing and checks shared by the binaries.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace pacer {

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;
};

// Parses "host:port", "[v6]:port" or ":port" (host defaults to 127.0.0.1). Port 0 is allowed
// (the OS picks one).
absl::StatusOr<HostPort> ParseHostPort(const std::string& s);

// True for an IP literal in 127.0.0.0/8, ::1 (also [::1] and ::ffff:127.x.y.z) and the name
// "localhost" (any case; the name itself, never resolved): plaintext is acceptable only there.
// Anything else is not loopback, "127.attacker.example" included.
bool IsLoopbackHost(const std::string& host);

// A client's address of pacerd as a gRPC target. "host:port" and gRPC targets (dns:///..,
// ipv4:.., unix:..) are kept. A list "ip:port,ip:port,..." (the pacerds of a job: a leader and
// its standbys, docs/ha.md) becomes gRPC's "ipv4:" (or "ipv6:") target: the channel connects to
// the first address that accepts — a standby does not listen — and tries the list again when its
// connection breaks. Such a list names IP addresses; for names, give one DNS name with a record
// per pacerd (gRPC resolves them all). INVALID_ARGUMENT for a list it cannot use.
absl::StatusOr<std::string> ClientTarget(const std::string& address);
// The host:port a target names first (the TLS authority of a list); the target when none.
std::string FirstAddressOf(const std::string& target);

}  // namespace pacer
