#include "common/net.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <vector>

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

bool IsLoopbackHost(const std::string& host_in) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string lower = host;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  // The name only, never what it resolves to: a resolver could map anything to 127.0.0.1.
  if (lower == "localhost") return true;
  // An IP literal, parsed (inet_pton takes only four decimal octets): "127.attacker.example"
  // or "127.0.0.1.nip.io" are names, not loopback.
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.y.z, an IPv4 loopback address mapped into IPv6
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace pacer

namespace pacer {

absl::StatusOr<std::string> ClientTarget(const std::string& address) {
  if (address.find(',') == std::string::npos) return address;
  for (const char* scheme : {"ipv4:", "ipv6:", "dns:", "unix:", "unix-abstract:"}) {
    if (address.rfind(scheme, 0) == 0) return address;
  }
  std::vector<std::string> v4, v6;
  size_t start = 0;
  while (start <= address.size()) {
    size_t comma = address.find(',', start);
    if (comma == std::string::npos) comma = address.size();
    const std::string one = address.substr(start, comma - start);
    start = comma + 1;
    if (one.empty()) continue;
    auto hp = ParseHostPort(one);
    if (!hp.ok()) {
      return absl::InvalidArgumentError("address list '" + address + "': '" + one + "' is not host:port");
    }
    in_addr a4;
    in6_addr a6;
    if (inet_pton(AF_INET, hp->host.c_str(), &a4) == 1) {
      v4.push_back(hp->host + ":" + std::to_string(hp->port));
    } else if (inet_pton(AF_INET6, hp->host.c_str(), &a6) == 1) {
      v6.push_back("[" + hp->host + "]:" + std::to_string(hp->port));
    } else {
      return absl::InvalidArgumentError("address list '" + address + "': '" + hp->host +
                                        "' is a name; a list names IP addresses (for names, give one "
                                        "DNS name with a record per pacerd)");
    }
  }
  if (!v4.empty() && !v6.empty()) {
    return absl::InvalidArgumentError("address list '" + address + "' mixes IPv4 and IPv6");
  }
  const std::vector<std::string>& all = v4.empty() ? v6 : v4;
  if (all.empty()) return absl::InvalidArgumentError("address list '" + address + "' is empty");
  std::string out = v4.empty() ? "ipv6:" : "ipv4:";
  for (size_t i = 0; i < all.size(); ++i) out += (i ? "," : "") + all[i];
  return out;
}

std::string FirstAddressOf(const std::string& target) {
  std::string t = target;
  if (t.rfind("ipv4:", 0) == 0 || t.rfind("ipv6:", 0) == 0) t = t.substr(5);
  const size_t comma = t.find(',');
  return comma == std::string::npos ? t : t.substr(0, comma);
}

}  // namespace pacer
