// Transport security of pacerd: with a certificate it serves TLS (a TLS client with the CA
// works, a plaintext client fails), and it refuses plaintext on a non-loopback address unless
// told --allow-insecure. Certificates are made by openssl in the harness's temp dir (pacerd runs
// in process: tests/testing/pacerd_harness.h).
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/testing/pacerd_harness.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

TEST(TlsTest, ServesTlsWithACertificateAndRefusesPlaintextClients) {
  testing::PacerdHarness h({.real_clock = true, .start = false});
  const std::string key = h.dir().Sub("key.pem"), cert = h.dir().Sub("cert.pem");
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost"
                          " -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
                          key + " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl failed";
  h.mutable_options().tls_cert = cert;
  h.mutable_options().tls_key = key;
  ASSERT_TRUE(h.TryStart().ok());

  ShardingClientOptions co;
  co.address = "localhost:" + std::to_string(h->port());
  co.token = h.job_token();
  co.worker_id = "w0";
  co.retry_budget_ms = 1500;
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = testing::ReadFileOrEmpty(cert);
  co.credentials = grpc::SslCredentials(ssl);
  auto tls = ShardingClient::Connect(co);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE((*tls)->ListDatasets().ok());

  co.credentials = nullptr;  // plaintext against a TLS server: never gets through
  auto plain = ShardingClient::Connect(co);
  EXPECT_FALSE(plain.ok());
}

TEST(TlsTest, PlaintextOnANonLoopbackAddressIsRefusedUnlessAllowed) {
  testing::PacerdHarness h(
      {.real_clock = true, .start = false, .adjust = [](PacerdOptions& o) { o.listen = "0.0.0.0:0"; }});
  const absl::Status refused = h.TryStart();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("--tls-cert"), std::string::npos) << refused;
  h.mutable_options().allow_insecure = true;
  const absl::Status allowed = h.TryStart();
  EXPECT_TRUE(allowed.ok()) << allowed;
}

}  // namespace
}  // namespace pacer
