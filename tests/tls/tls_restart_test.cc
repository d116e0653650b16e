// Clients over TLS after pacerd is killed (-9) and started again on the same port: the pacerd
// binary is a child process (tests/testing/pacerd_process.h) serving TLS with certificates from
// openssl (test_pki.h). A client connected before the kill must be served again within a few
// seconds of the new pacerd listening, also when it saw pacerd gone and kept retrying meanwhile:
// the C++ SDK's Client (heartbeats, and the synchronous ShardingClient the Python pacer.Client
// and pacer-consume use) and a lone ShardingClient. Each call is timed from the restart; none
// may wait for a TLS handshake that never ends (common/reconnect.h and common/channel_wait.h say
// why one could).
#include <gtest/gtest.h>

#include <chrono>

#include "common/auth.h"
#include "common/tls.h"
#include "tests/testing/pacerd_process.h"
#include "tests/testing/test_util.h"
#include "tests/tls/test_pki.h"
#include "worker_sdk/client.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

using testing::PacerdProcess;
using testing::TempDir;
using testing::WaitFor;

// A restarted pacerd serves within a second here; gRPC's reconnect backoff in the SDK is at most
// 500 ms. Five seconds leaves room for a loaded machine, and is far below the minutes a client
// stuck in failing handshakes would need (it never recovers).
constexpr auto kServedAgainWithin = std::chrono::seconds(5);

class TlsRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_ = std::make_unique<testing::TestPki>(dir_);
    pacerd_ = std::make_unique<PacerdProcess>(
        dir_, std::vector<std::string>{"--tls-cert", pki_->server().cert, "--tls-key", pki_->server().key,
                                       "--heartbeat-interval-ms", "100"});
    pacerd_->Start();
    ASSERT_FALSE(HasFatalFailure());
    auto token = LoadToken(dir_.Sub("data/job.token"), false);
    ASSERT_TRUE(token.ok()) << token.status();
    token_ = *token;
  }
  void TearDown() override {
    if (pacerd_) pacerd_->Kill9();
  }
  TlsClientOptions Tls() const {
    TlsClientOptions t;
    t.ca_file = pki_->ca();
    t.server_name = "pacerd.test";  // as in a deployment: a name from the certificate
    return t;
  }
  // Kills pacerd with SIGKILL; `gone` is a call of the client's that must fail while pacerd is
  // down (after retrying for its budget: the client has seen pacerd gone, its channel is in
  // TRANSIENT_FAILURE, reconnecting); then starts pacerd again on the same port and data dir.
  template <typename Call>
  void KillAndRestart(Call gone) {
    pacerd_->Kill9();
    const absl::Status s = gone();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    pacerd_->Start();
  }
  // How long `call` took to succeed after the restart (called again while it fails with
  // UNAVAILABLE); fails the test when it does not succeed within kServedAgainWithin.
  template <typename Call>
  void ExpectServedAgainSoon(const char* what, Call call) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s;
    do {
      s = call();
    } while (s.code() == absl::StatusCode::kUnavailable &&
             std::chrono::steady_clock::now() - t0 < kServedAgainWithin);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    std::cout << what << " after the restart: " << s << " in " << ms.count() << " ms" << std::endl;
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    EXPECT_LE(ms, kServedAgainWithin) << what << " took " << ms.count() << " ms after pacerd restarted";
  }

  TempDir dir_;
  std::unique_ptr<testing::TestPki> pki_;
  std::unique_ptr<PacerdProcess> pacerd_;
  std::string token_;
};

TEST_F(TlsRestartTest, SdkClientIsServedAgainSoonAfterPacerdRestarts) {
  ClientOptions o;
  o.address = pacerd_->address();
  o.worker_id = "w0";
  o.token = token_;
  o.tls = Tls();
  o.rpc_timeout_ms = 2'000;
  o.connect_budget_ms = 1'000;  // the retry budget of each call
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->sharding().ListDatasets().ok());
  ASSERT_TRUE(WaitFor([&] { return (*c)->stats().heartbeats_ok > 0; }, std::chrono::seconds(10)));

  KillAndRestart([&] { return (*c)->sharding().ListDatasets().status(); });
  ASSERT_FALSE(HasFatalFailure());
  ExpectServedAgainSoon("Client::sharding().ListDatasets", [&] { return (*c)->sharding().ListDatasets().status(); });
  const uint64_t beats = (*c)->stats().heartbeats_ok;
  EXPECT_TRUE(WaitFor([&] { return (*c)->stats().heartbeats_ok > beats; }, kServedAgainWithin))
      << "no heartbeat answered after the restart";
  (*c)->Close(1'000);
}

TEST_F(TlsRestartTest, ShardingClientIsServedAgainSoonAfterPacerdRestarts) {
  ShardingClientOptions o;
  o.address = pacerd_->address();
  o.worker_id = "w1";
  o.token = token_;
  o.tls = Tls();
  o.rpc_timeout_ms = 2'000;
  o.retry_budget_ms = 1'000;
  auto c = ShardingClient::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->ListDatasets().ok());

  KillAndRestart([&] { return (*c)->ListDatasets().status(); });
  ASSERT_FALSE(HasFatalFailure());
  ExpectServedAgainSoon("ShardingClient::ListDatasets", [&] { return (*c)->ListDatasets().status(); });
}

}  // namespace
}  // namespace pacer
