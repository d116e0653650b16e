#include "tests/testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace pacer::testing {
namespace {

// Bytes held per direction before the proxy stops reading that side (back-pressure).
constexpr size_t kBufferBytes = 256 * 1024;

void CloseWithReset(int fd) {
  linger lg{1, 0};  // close() sends RST: the peer sees the connection fail, not a clean end
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  close(fd);
}

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace

struct TcpProxy::Connection {
  // fd[0]: the client's connection, fd[1]: ours to the upstream. Direction d carries the bytes
  // read from fd[d] to fd[1 - d]; buf[d] holds those not yet written.
  int fd[2] = {-1, -1};
  std::string buf[2];
  bool eof[2] = {false, false};       // fd[d] has sent its last byte
  bool shut[2] = {false, false};      // ... and fd[1 - d] was told (shutdown SHUT_WR)
  bool failed = false;

  bool done() const { return failed || (shut[0] && shut[1]); }
};

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(const std::string& upstream) {
  absl::StatusOr<HostPort> hp = ParseHostPort(upstream);
  if (!hp.ok()) return hp.status();
  std::string host = hp->host;
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (host == "localhost") host = "127.0.0.1";
  in_addr ip{};
  if (inet_pton(AF_INET, host.c_str(), &ip) != 1 || (ntohl(ip.s_addr) >> 24) != 127 || hp->port <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpProxy forwards only to an IPv4 loopback address (127.0.0.0/8) with a port, not '",
        upstream, "'"));
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("listen on 127.0.0.1:0: ", std::strerror(err)));
  }
  std::unique_ptr<TcpProxy> proxy(
      new TcpProxy(upstream, ip.s_addr, hp->port, fd, ntohs(addr.sin_port)));
  if (pipe2(proxy->wake_fds_, O_NONBLOCK | O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  proxy->thread_ = std::thread([p = proxy.get()] { p->Loop(); });
  return proxy;
}

TcpProxy::TcpProxy(std::string upstream, uint32_t upstream_ip, int upstream_port, int listen_fd, int port)
    : upstream_(std::move(upstream)),
      upstream_ip_(upstream_ip),
      upstream_port_(upstream_port),
      listen_fd_(listen_fd),
      port_(port) {}

TcpProxy::~TcpProxy() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    const char b = 0;
    [[maybe_unused]] ssize_t n = write(wake_fds_[1], &b, 1);
    thread_.join();
  }
  close(listen_fd_);
  for (int fd : wake_fds_) {
    if (fd >= 0) close(fd);
  }
}

std::string TcpProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

void TcpProxy::Stall() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stalled_ = true;
  }
  WaitApplied();
}

void TcpProxy::Resume() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stalled_ = false;
  }
  WaitApplied();
}

void TcpProxy::Cut() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++cut_requests_;
  }
  WaitApplied();
}

bool TcpProxy::stalled() {
  std::lock_guard<std::mutex> lock(mu_);
  return stalled_;
}

int TcpProxy::open_connections() {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

int64_t TcpProxy::accepted_connections() {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_;
}

void TcpProxy::WaitApplied() {
  int64_t target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    target = ++requested_;
  }
  const char b = 0;
  [[maybe_unused]] ssize_t n = write(wake_fds_[1], &b, 1);  // full pipe: a wake-up is pending anyway
  std::unique_lock<std::mutex> lock(mu_);
  applied_cv_.wait(lock, [&] { return applied_ >= target; });
}

void TcpProxy::Loop() {
  std::vector<Connection> conns;
  int64_t cuts_done = 0;
  auto close_all = [&] {
    for (Connection& c : conns) {
      for (int fd : c.fd) CloseWithReset(fd);
    }
    conns.clear();
  };
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, int>> owner;  // fds[j] (j >= 2) is conns[owner.first].fd[owner.second]
  while (true) {
    bool stalled;
    {
      // Every change asked for before this point is applied from here on.
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      stalled = stalled_;
      if (cut_requests_ > cuts_done) {
        close_all();
        cuts_done = cut_requests_;
      }
      open_ = static_cast<int>(conns.size());
      applied_ = requested_;
    }
    applied_cv_.notify_all();

    fds.clear();
    owner.clear();
    fds.push_back({wake_fds_[0], POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(stalled ? 0 : POLLIN), 0});
    if (!stalled) {
      for (size_t i = 0; i < conns.size(); ++i) {
        const Connection& c = conns[i];
        for (int k = 0; k < 2; ++k) {
          short events = 0;
          if (!c.eof[k] && c.buf[k].size() < kBufferBytes) events |= POLLIN;
          if (!c.buf[1 - k].empty()) events |= POLLOUT;
          if (events == 0) continue;
          fds.push_back({c.fd[k], events, 0});
          owner.emplace_back(i, k);
        }
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) {
      char drain[64];
      while (read(wake_fds_[0], drain, sizeof(drain)) > 0) {
      }
    }
    if (stalled) continue;  // state may have changed: look again before touching a connection

    for (size_t j = 2; j < fds.size(); ++j) {
      if (fds[j].revents == 0) continue;
      Connection& c = conns[owner[j - 2].first];
      const int k = owner[j - 2].second;
      if (c.failed) continue;
      if ((fds[j].events & POLLIN) != 0 && (fds[j].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        char buf[65536];
        const size_t room = kBufferBytes - c.buf[k].size();
        ssize_t n = recv(c.fd[k], buf, std::min(room, sizeof(buf)), 0);
        if (n > 0) {
          c.buf[k].append(buf, static_cast<size_t>(n));
        } else if (n == 0) {
          c.eof[k] = true;
        } else if (!WouldBlock(errno)) {
          c.failed = true;
          continue;
        }
      }
      if ((fds[j].events & POLLOUT) != 0 && (fds[j].revents & (POLLOUT | POLLHUP | POLLERR)) != 0) {
        std::string& out = c.buf[1 - k];
        ssize_t n = send(c.fd[k], out.data(), out.size(), MSG_NOSIGNAL);
        if (n > 0) {
          out.erase(0, static_cast<size_t>(n));
        } else if (n < 0 && !WouldBlock(errno)) {
          c.failed = true;
        }
      }
    }
    for (Connection& c : conns) {
      for (int d = 0; d < 2; ++d) {
        if (!c.failed && c.eof[d] && c.buf[d].empty() && !c.shut[d]) {
          shutdown(c.fd[1 - d], SHUT_WR);
          c.shut[d] = true;
        }
      }
    }
    for (size_t i = 0; i < conns.size();) {
      if (conns[i].done()) {
        // A failed side is reset so the other learns at once; a clean end is closed cleanly.
        for (int fd : conns[i].fd) conns[i].failed ? CloseWithReset(fd) : static_cast<void>(close(fd));
        conns[i] = std::move(conns.back());
        conns.pop_back();
      } else {
        ++i;
      }
    }

    if ((fds[1].revents & POLLIN) != 0) {
      while (true) {
        int client = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (client < 0) break;
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++accepted_;
        }
        // A blocking connect: on loopback it completes or is refused at once; the timeout bounds
        // the case of an upstream whose backlog is full (a frozen server).
        int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        timeval tv{1, 0};
        if (up >= 0) setsockopt(up, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = upstream_ip_;
        addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
        if (up < 0 || connect(up, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
          if (up >= 0) close(up);
          CloseWithReset(client);  // the upstream is down: so is this connection
          continue;
        }
        fcntl(up, F_SETFL, fcntl(up, F_GETFL) | O_NONBLOCK);
        Connection c;
        c.fd[0] = client;
        c.fd[1] = up;
        conns.push_back(std::move(c));
      }
    }
  }
  close_all();
  std::lock_guard<std::mutex> lock(mu_);
  open_ = 0;
}

}  // namespace pacer::testing
