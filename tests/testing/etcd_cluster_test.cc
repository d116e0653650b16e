// The etcd test harness itself: a real 3-member cluster on loopback (writes survive losing a
// follower and then the leader; members come back with their data), and the TCP proxy that
// fencing tests put between a pacerd and etcd (bytes flow, a stall holds them, a cut resets).
#include "tests/testing/etcd_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/testing/test_util.h"

namespace pacer::testing {
namespace {

using std::chrono::milliseconds;

class EtcdClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdAvailable()) GTEST_SKIP() << kEtcdMissing;
  }
  std::unique_ptr<EtcdCluster> StartCluster() {
    absl::StatusOr<std::unique_ptr<EtcdCluster>> c = EtcdCluster::Start(dir_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  TempDir dir_;
};

// The value of `key` read through member i only (a linearizable read: it goes through raft).
std::string GetVia(EtcdCluster& c, int i, const std::string& key) {
  absl::StatusOr<std::string> out = c.Etcdctl({"get", key, "--print-value-only"}, c.endpoint(i));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

TEST_F(EtcdClusterTest, PutThroughOneMemberIsReadThroughAnother) {
  auto c = StartCluster();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->size(), 3);
  ASSERT_EQ(c->endpoints().size(), 3u);
  for (const std::string& e : c->endpoints()) EXPECT_EQ(e.rfind("127.0.0.1:", 0), 0u) << e;
  EXPECT_EQ(c->endpoints_csv(), c->endpoint(0) + "," + c->endpoint(1) + "," + c->endpoint(2));
  for (int i = 0; i < 3; ++i) EXPECT_NE(c->endpoint(i), "127.0.0.1:2379");

  ASSERT_TRUE(c->Etcdctl({"put", "greeting", "hello"}, c->endpoint(0)).ok());
  EXPECT_EQ(GetVia(*c, 2, "greeting"), "hello\n");
  EXPECT_EQ(GetVia(*c, 1, "greeting"), "hello\n");
  EXPECT_GE(c->LeaderIndex(), 0);

  // A failing command is an error carrying etcdctl's stderr.
  absl::StatusOr<std::string> bad = c->Etcdctl({"no-such-command"});
  EXPECT_FALSE(bad.ok());

  // The destructor kills and reaps every member.
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) pids.push_back(c->pid(i));
  c.reset();
  for (pid_t pid : pids) {
    ASSERT_GT(pid, 0);
    EXPECT_EQ(kill(pid, 0), -1) << "etcd member " << pid << " still exists";
  }
}

TEST_F(EtcdClusterTest, WritableAfterLosingAFollowerThenTheLeader) {
  auto c = StartCluster();
  ASSERT_NE(c, nullptr);
  const int leader = c->WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % 3;

  c->Kill(follower);
  EXPECT_FALSE(c->running(follower));
  ASSERT_TRUE(c->Etcdctl({"put", "a", "1"}).ok());
  ASSERT_TRUE(c->Restart(follower).ok());
  EXPECT_EQ(GetVia(*c, follower, "a"), "1\n");  // caught up with the write it missed

  c->Kill(leader);
  const int new_leader = c->WaitForLeader();
  ASSERT_GE(new_leader, 0);
  EXPECT_NE(new_leader, leader);
  // A proposal caught in the election fails ("request timed out, possibly due to previous
  // leader failure"); once the survivors agree on a leader, a write goes through.
  absl::StatusOr<std::string> put;
  EXPECT_TRUE(WaitFor([&] { return (put = c->Etcdctl({"put", "b", "2"})).ok(); }, milliseconds(20000),
                      milliseconds(100)))
      << put.status();
  absl::Status restarted = c->Restart(leader);
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_EQ(GetVia(*c, leader, "a"), "1\n");
  EXPECT_EQ(GetVia(*c, leader, "b"), "2\n");
  EXPECT_TRUE(c->WaitHealthy(milliseconds(10000)).ok());
}

TEST_F(EtcdClusterTest, StoppedAndPausedMembersComeBack) {
  auto c = StartCluster();
  ASSERT_NE(c, nullptr);
  const int leader = c->WaitForLeader();
  ASSERT_GE(leader, 0);
  const int stopped = (leader + 1) % 3;
  const int paused = (leader + 2) % 3;

  ASSERT_TRUE(c->Stop(stopped).ok());  // SIGTERM: a clean exit
  EXPECT_FALSE(c->running(stopped));
  ASSERT_TRUE(c->Etcdctl({"put", "k", "while-stopped"}).ok());
  ASSERT_TRUE(c->Restart(stopped).ok());

  c->Pause(paused);
  EXPECT_TRUE(c->running(paused));
  EXPECT_FALSE(c->Healthy(paused, milliseconds(300)));  // frozen: answers nothing
  ASSERT_TRUE(c->Etcdctl({"put", "k", "while-paused"}, c->endpoint(leader)).ok());
  c->Resume(paused);
  ASSERT_TRUE(c->WaitHealthy(milliseconds(10000)).ok());
  EXPECT_EQ(GetVia(*c, paused, "k"), "while-paused\n");
  EXPECT_EQ(GetVia(*c, stopped, "k"), "while-paused\n");
}

TEST_F(EtcdClusterTest, OptionsReachTheMembers) {
  EtcdCluster::Options options;
  options.quota_backend_bytes = 64 << 20;
  options.auto_compaction_mode = "revision";
  options.auto_compaction_retention = "100";
  options.extra_flags = {"--max-request-bytes=2097152"};
  absl::StatusOr<std::unique_ptr<EtcdCluster>> c = EtcdCluster::Start(dir_, 3, options);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string log = ReadFileOrEmpty((*c)->member_dir(0) + "/etcd.log");
  EXPECT_NE(log.find("\"quota-backend-bytes\":67108864"), std::string::npos) << (*c)->LogTail(0);
  EXPECT_NE(log.find("\"auto-compaction-mode\":\"revision\""), std::string::npos);
  EXPECT_NE(log.find("\"max-request-bytes\":2097152"), std::string::npos);
}

// A small quota fills up (NOSPACE: writes refused, reads served); a member still restarts, and
// the operator's way out -- delete, compact, defragment, disarm -- makes the cluster writable.
TEST_F(EtcdClusterTest, QuotaReachedThenRecovered) {
  EtcdCluster::Options options;
  options.quota_backend_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<EtcdCluster>> started = EtcdCluster::Start(dir_, 3, options);
  ASSERT_TRUE(started.ok()) << started.status();
  EtcdCluster& c = **started;
  const std::string value(100000, 'x');  // under the kernel's 128 KiB limit on one argument
  absl::StatusOr<std::string> put;
  int n = 0;
  while (n < 100 && (put = c.Etcdctl({"put", "big/" + std::to_string(n), value})).ok()) ++n;
  ASSERT_FALSE(put.ok()) << "1 MiB quota not reached after " << n << " puts of 100 kB";
  EXPECT_NE(put.status().message().find("database space exceeded"), std::string::npos) << put.status();
  absl::StatusOr<std::string> alarms = c.Etcdctl({"alarm", "list"});
  ASSERT_TRUE(alarms.ok()) << alarms.status();
  EXPECT_NE(alarms->find("NOSPACE"), std::string::npos) << *alarms;
  EXPECT_EQ(GetVia(c, 1, "big/0"), value + "\n");

  const int follower = (c.WaitForLeader() + 1) % 3;
  c.Kill(follower);
  absl::Status restarted = c.Restart(follower);
  ASSERT_TRUE(restarted.ok()) << restarted;

  ASSERT_TRUE(c.Etcdctl({"del", "--prefix", "big/"}).ok());
  absl::StatusOr<std::string> status = c.Etcdctl({"endpoint", "status", "-w", "json"}, c.endpoint(0));
  ASSERT_TRUE(status.ok()) << status.status();
  const size_t at = status->find("\"revision\":");
  ASSERT_NE(at, std::string::npos) << *status;
  const std::string revision = std::to_string(std::stoll(status->substr(at + 11)));
  ASSERT_TRUE(c.Etcdctl({"compact", revision}).ok());
  absl::StatusOr<std::string> defrag = c.Etcdctl({"defrag"});
  ASSERT_TRUE(defrag.ok()) << defrag.status();
  ASSERT_TRUE(c.Etcdctl({"alarm", "disarm"}).ok());
  put = c.Etcdctl({"put", "after", "recovery"});
  EXPECT_TRUE(put.ok()) << put.status();
}

// An echo server on 127.0.0.1:0, one thread per connection; for the proxy tests below.
class EchoServer {
 public:
  EchoServer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::abort();
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] {
      while (true) {
        int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) return;  // shut down
        std::lock_guard<std::mutex> lock(mu_);
        fds_.push_back(fd);
        threads_.emplace_back([fd] {
          char buf[4096];
          ssize_t n;
          while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
            if (send(fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
          }
          shutdown(fd, SHUT_WR);  // the client's end ends ours
        });
      }
    });
  }
  ~EchoServer() {
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    close(listen_fd_);
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    for (std::thread& t : threads_) t.join();
    for (int fd : fds_) close(fd);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// A client socket to 127.0.0.1:port whose reads give up after `timeout`.
int Dial(int port, milliseconds timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  return fd;
}

void SetReadTimeout(int fd, milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

// Sends `text` and reads the same number of bytes back; "" on a timeout, EOF or error.
std::string RoundTrip(int fd, const std::string& text) {
  if (send(fd, text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) return "";
  std::string got;
  char buf[256];
  while (got.size() < text.size()) {
    ssize_t n = recv(fd, buf, std::min(sizeof(buf), text.size() - got.size()), 0);
    if (n <= 0) return "";
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(TcpProxyTest, RefusesAnUpstreamOffLoopback) {
  EXPECT_FALSE(TcpProxy::Start("10.0.0.1:80").ok());
  EXPECT_FALSE(TcpProxy::Start("example.com:80").ok());
  EXPECT_TRUE(TcpProxy::Start("localhost:9").ok());
}

TEST(TcpProxyTest, StallHoldsBytesResumeDeliversThem) {
  EchoServer echo;
  auto proxy = TcpProxy::Start(echo.address());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  TcpProxy& p = **proxy;
  EXPECT_NE(p.port(), 0);

  int fd = Dial(p.port(), milliseconds(10000));
  EXPECT_EQ(RoundTrip(fd, "one"), "one");
  ASSERT_TRUE(WaitFor([&] { return p.open_connections() == 1; }, milliseconds(5000)));

  p.Stall();
  EXPECT_TRUE(p.stalled());
  SetReadTimeout(fd, milliseconds(300));  // the client's own timeout: nothing may arrive
  EXPECT_EQ(RoundTrip(fd, "two"), "");
  // A new connection waits too (its handshake completes in the listener's backlog).
  int late = Dial(p.port(), milliseconds(300));
  EXPECT_EQ(RoundTrip(late, "late"), "");
  EXPECT_EQ(p.open_connections(), 1);  // held open, not closed

  p.Resume();
  SetReadTimeout(fd, milliseconds(10000));
  SetReadTimeout(late, milliseconds(10000));
  char buf[16];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);  // "two", held by the stall, now delivered
  ASSERT_EQ(n, 3);
  EXPECT_EQ(std::string(buf, 3), "two");
  n = recv(late, buf, sizeof(buf), 0);
  ASSERT_EQ(n, 4);
  EXPECT_EQ(std::string(buf, 4), "late");
  EXPECT_EQ(RoundTrip(fd, "three"), "three");
  EXPECT_EQ(p.accepted_connections(), 2);
  close(fd);
  close(late);
  EXPECT_TRUE(WaitFor([&] { return p.open_connections() == 0; }, milliseconds(5000)));
}

TEST(TcpProxyTest, CutClosesEveryConnectionAndNewOnesWork) {
  EchoServer echo;
  auto proxy = TcpProxy::Start(echo.address());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  TcpProxy& p = **proxy;
  int a = Dial(p.port(), milliseconds(10000));
  int b = Dial(p.port(), milliseconds(10000));
  EXPECT_EQ(RoundTrip(a, "a"), "a");
  EXPECT_EQ(RoundTrip(b, "b"), "b");
  ASSERT_TRUE(WaitFor([&] { return p.open_connections() == 2; }, milliseconds(5000)));

  p.Cut();
  EXPECT_EQ(p.open_connections(), 0);
  char buf[4];
  EXPECT_LE(recv(a, buf, sizeof(buf), 0), 0);  // reset (or EOF), not a timeout
  EXPECT_NE(errno, EAGAIN);
  EXPECT_LE(recv(b, buf, sizeof(buf), 0), 0);

  int c = Dial(p.port(), milliseconds(10000));
  EXPECT_EQ(RoundTrip(c, "again"), "again");
  // Cut while stalled closes the held connections too.
  p.Stall();
  p.Cut();
  EXPECT_EQ(p.open_connections(), 0);
  EXPECT_LE(recv(c, buf, sizeof(buf), 0), 0);
  p.Resume();
  for (int fd : {a, b, c}) close(fd);
}

TEST_F(EtcdClusterTest, ProxyInFrontOfAMember) {
  auto c = StartCluster();
  ASSERT_NE(c, nullptr);
  auto proxy = TcpProxy::Start(c->endpoint(0));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  TcpProxy& p = **proxy;

  ASSERT_TRUE(c->Etcdctl({"put", "k", "through-proxy"}, p.address()).ok());
  EXPECT_EQ(GetVia(*c, 1, "k"), "through-proxy\n");

  p.Stall();
  const auto before = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> stalled = c->Etcdctl({"get", "k"}, p.address(), milliseconds(1000));
  EXPECT_FALSE(stalled.ok());  // etcdctl gives up: its dial or its command times out
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(10));

  p.Resume();
  absl::StatusOr<std::string> resumed =
      c->Etcdctl({"get", "k", "--print-value-only"}, p.address());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, "through-proxy\n");
}

}  // namespace
}  // namespace pacer::testing
