// Transport security of pacerd: with a certificate it serves TLS (a TLS client with the CA
// works, a plaintext client fails), and it refuses plaintext on a non-loopback address unless
// told --allow-insecure. Certificates are made by openssl in the test's temp dir.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cmd/pacerd/pacerd.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

TEST(TlsTest, ServesTlsWithACertificateAndRefusesPlaintextClients) {
  testing::TempDir dir;
  const std::string key = dir.Sub("key.pem"), cert = dir.Sub("cert.pem");
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost"
                          " -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
                          key + " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl failed";
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.tls_cert = cert;
  o.tls_key = key;
  auto d = Pacerd::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();

  ShardingClientOptions co;
  co.address = "localhost:" + std::to_string((*d)->port());
  co.token = (*d)->job_token();
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
  testing::TempDir dir;
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "0.0.0.0:0";
  o.metrics_listen = "";
  auto refused = Pacerd::Start(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--tls-cert"), std::string::npos) << refused.status();
  o.allow_insecure = true;
  auto allowed = Pacerd::Start(o);
  EXPECT_TRUE(allowed.ok()) << allowed.status();
}

}  // namespace
}  // namespace pacer
