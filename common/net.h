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

}  // namespace pacer
