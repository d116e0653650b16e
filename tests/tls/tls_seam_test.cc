// The TLS seam every client and server goes through (common/tls.h) and the exact loopback test
// (common/net.h): plaintext is only for loopback addresses, and "loopback" is an IP literal in
// 127.0.0.0/8, ::1 or the name "localhost" — never a name that merely starts with "127.".
// Certificate files are checked when the credentials are made, naming the flag.
#include <gtest/gtest.h>

#include <fstream>

#include "common/net.h"
#include "common/tls.h"
#include "tests/testing/test_util.h"
#include "tests/tls/test_pki.h"

namespace pacer {
namespace {

TEST(LoopbackTest, OnlyIpLiteralsInLoopbackAndTheNameLocalhost) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "127.255.255.254", "::1", "[::1]", "::ffff:127.0.0.1",
                        "localhost", "LocalHost", "0:0:0:0:0:0:0:1"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"127.attacker.example", "127.0.0.1.nip.io", "127.0.0.1.", "127.1", "0127.0.0.1",
                        "localhost.attacker.example", "attacker-localhost", "0.0.0.0", "10.0.0.1", "::",
                        "::ffff:10.0.0.1", "128.0.0.1", "", "127.0.0.1:80", " 127.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

TEST(LoopbackTest, GrpcTargetsAreJudgedByEveryAddressTheyName) {
  for (const char* t : {"127.0.0.1:7070", "localhost:7070", "[::1]:7070", "dns:///localhost:7070",
                        "dns:127.0.0.1:1", "ipv4:127.0.0.1:1,127.0.0.2:2", "unix:/tmp/pacerd.sock"}) {
    EXPECT_TRUE(IsLoopbackTarget(t)) << t;
  }
  for (const char* t : {"127.attacker.example:7070", "dns:///127.attacker.example:7070",
                        "dns://8.8.8.8/127.attacker.example:7070", "ipv4:127.0.0.1:1,10.0.0.1:2",
                        "10.0.0.1:7070", "pacerd.svc:7070", "xds:///pacerd"}) {
    EXPECT_FALSE(IsLoopbackTarget(t)) << t;
  }
}

TEST(TlsSeamTest, ClientsRefusePlaintextOffLoopbackNamingTheFlags) {
  TlsClientOptions o;
  for (const char* target : {"10.1.2.3:7070", "127.attacker.example:7070", "pacerd.default.svc:7070"}) {
    auto c = MakeChannelCredentials(o, target);
    ASSERT_FALSE(c.ok()) << target;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string m(c.status().message());
    for (const char* named : {"--tls-ca", "PACER_TLS_CA", "--allow-insecure", "PACER_ALLOW_INSECURE"}) {
      EXPECT_NE(m.find(named), std::string::npos) << m;
    }
  }
  EXPECT_TRUE(MakeChannelCredentials(o, "127.0.0.1:7070").ok());
  o.allow_insecure = true;
  EXPECT_TRUE(MakeChannelCredentials(o, "10.1.2.3:7070").ok());
}

TEST(TlsSeamTest, EnvironmentFillsWhatFlagsLeftEmpty) {
  setenv("PACER_TLS_CA", "/env/ca.pem", 1);
  setenv("PACER_TLS_CERT", "/env/cert.pem", 1);
  setenv("PACER_ALLOW_INSECURE", "1", 1);
  TlsClientOptions o;
  o.cert_file = "/flag/cert.pem";
  o.FillFromEnvironment();
  EXPECT_EQ(o.ca_file, "/env/ca.pem");
  EXPECT_EQ(o.cert_file, "/flag/cert.pem");
  EXPECT_TRUE(o.allow_insecure);
  unsetenv("PACER_TLS_CA");
  unsetenv("PACER_TLS_CERT");
  unsetenv("PACER_ALLOW_INSECURE");
}

TEST(TlsSeamTest, BadCertificateFilesAreErrorsNamingTheFileAndFlag) {
  testing::TempDir dir;
  testing::TestPki pki(dir);
  const std::string garbage = dir.Sub("garbage.pem");
  std::ofstream(garbage) << "not a certificate\n";
  auto expect_error = [](const TlsClientOptions& o, const std::string& needle) {
    auto c = MakeChannelCredentials(o, "127.0.0.1:7070");
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(c.status().message()).find(needle), std::string::npos) << c.status();
  };
  TlsClientOptions o;
  o.ca_file = dir.Sub("missing.pem");
  expect_error(o, "missing.pem");
  o.ca_file = garbage;
  expect_error(o, "--tls-ca");
  o.ca_file = "/dev/zero";  // never read forever
  expect_error(o, "not a regular file");
  o.ca_file = pki.ca();
  o.cert_file = pki.client().cert;
  expect_error(o, "--tls-key");  // a certificate without its key
  o.key_file = pki.server().key;  // someone else's key
  expect_error(o, "does not match");
  o.key_file = pki.client().key;
  EXPECT_TRUE(MakeChannelCredentials(o, "127.0.0.1:7070").ok());
}

TEST(TlsSeamTest, ServersRefusePlaintextOffLoopbackAndAClientCaAlone) {
  testing::TempDir dir;
  testing::TestPki pki(dir);
  TlsServerOptions o;
  auto off = MakeServerCredentials(o, "0.0.0.0", "test");
  ASSERT_FALSE(off.ok());
  EXPECT_NE(std::string(off.status().message()).find("--tls-cert"), std::string::npos) << off.status();
  EXPECT_FALSE(MakeServerCredentials(o, "127.attacker.example", "test").ok());
  EXPECT_TRUE(MakeServerCredentials(o, "127.0.0.1", "test").ok());
  o.client_ca_file = pki.ca();  // mTLS asked for, but no server certificate: would be plaintext
  auto ca_alone = MakeServerCredentials(o, "127.0.0.1", "test");
  ASSERT_FALSE(ca_alone.ok());
  EXPECT_NE(std::string(ca_alone.status().message()).find("--tls-client-ca"), std::string::npos);
  o.cert_file = pki.server().cert;
  o.key_file = pki.client().key;
  EXPECT_FALSE(MakeServerCredentials(o, "0.0.0.0", "test").ok());  // key of another certificate
  o.key_file = pki.server().key;
  EXPECT_TRUE(MakeServerCredentials(o, "0.0.0.0", "test").ok());
}

}  // namespace
}  // namespace pacer
