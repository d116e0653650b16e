// TcpProxy: a TCP proxy on 127.0.0.1 (an OS-chosen port) forwarding every connection to one
// upstream address on loopback, which a test can stall (a partition: connections stay open, no
// byte moves either way) and cut (every current connection closed with a reset). For fencing
// tests that put it between a pacerd and an etcd member. All traffic stays on 127.0.0.0/8: the
// upstream must be a loopback address, and nothing here touches routes or namespaces.
//
// One thread owns the sockets: a poll() loop over the listener, a wake-up pipe and both ends of
// every connection, forwarding through a bounded buffer per direction. Stall, Resume and Cut are
// called from any thread and return once the loop has applied them: after Stall() returns no
// further byte is forwarded; after Cut() returns every connection open before it is closed.
// While stalled, new connections wait in the listener's backlog (the kernel completes their
// handshake) and are accepted and forwarded after Resume(). The destructor stops the loop and
// closes every socket.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace pacer::testing {

class TcpProxy {
 public:
  // Listens on 127.0.0.1:0 and forwards to `upstream` ("127.x.y.z:PORT" or "localhost:PORT").
  // INVALID_ARGUMENT for an address off loopback.
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(const std::string& upstream);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // "127.0.0.1:PORT": what a client dials instead of the upstream.
  std::string address() const;
  const std::string& upstream() const { return upstream_; }

  // Stops forwarding in both directions; connections stay open (a partition).
  void Stall();
  // Forwards again, buffered bytes first, and accepts the connections that waited.
  void Resume();
  // Closes every current connection (a reset to both ends); new ones are still accepted, or wait
  // in the backlog while stalled.
  void Cut();

  bool stalled();
  // Connections open now, and accepted since the start.
  int open_connections();
  int64_t accepted_connections();

 private:
  struct Connection;
  TcpProxy(std::string upstream, uint32_t upstream_ip, int upstream_port, int listen_fd, int port);
  void Loop();
  // Blocks until the loop has run once after this call (it saw every change made before it).
  void WaitApplied();

  const std::string upstream_;
  const uint32_t upstream_ip_;  // network order
  const int upstream_port_;
  const int listen_fd_;
  const int port_;
  int wake_fds_[2] = {-1, -1};

  // std::mutex rather than absl::Mutex: Debian's absl is not instrumented, so ThreadSanitizer
  // would not see this lock and would report the fields below as races.
  std::mutex mu_;
  std::condition_variable applied_cv_;
  // Guarded by mu_:
  bool stalled_ = false;
  bool stopping_ = false;
  int64_t cut_requests_ = 0;
  int64_t requested_ = 0;  // changes asked for
  int64_t applied_ = 0;    // changes the loop has applied
  int open_ = 0;
  int64_t accepted_ = 0;

  std::thread thread_;
};

}  // namespace pacer::testing
