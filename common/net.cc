#include "common/net.h"

#include <charconv>

#include "absl/status/status.h"

namespace pacer {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& s) {
  HostPort hp;
  std::string port_str;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return absl::InvalidArgumentError("address '" + s + "': expected [v6-host]:port");
    }
    hp.host = s.substr(1, close - 1);
    port_str = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError("address '" + s + "': expected host:port");
    }
    hp.host = s.substr(0, colon);
    port_str = s.substr(colon + 1);
  }
  if (hp.host.empty()) hp.host = "127.0.0.1";
  int port = -1;
  auto [ptr, ec] = std::from_chars(port_str.data(), port_str.data() + port_str.size(), port);
  if (ec != std::errc() || ptr != port_str.data() + port_str.size() || port < 0 || port > 65535) {
    return absl::InvalidArgumentError("address '" + s + "': port must be a number in 0..65535");
  }
  hp.port = port;
  return hp;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace pacer
