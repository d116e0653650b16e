// Every Pacer client against a TLS and an mTLS pacerd: the C++ SDK,
// the C API, pacerctl, pacer-consume, pacer-agent (with its workers, which get the agent's TLS
// files), and an example trainer (pacer-train-ctr) with pacer-ps serving mTLS too. Then the
// server certificate rotated without a restart (the new one is served once the files change;
// waited for with a deadline), and plaintext off loopback refused by every client and by the
// servers. Certificates come from openssl in the test's temp dir (test_pki.h); pacerd runs
// in-process on 127.0.0.1 port 0, every binary is a reaped child process.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "common/tls.h"
#include "proto/pacer/ps.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "tests/tls/test_pki.h"
#include "worker_sdk/c_api.h"
#include "worker_sdk/client.h"
#include "worker_sdk/ps/ps_client.h"

namespace pacer {
namespace {

using testing::BinaryPath;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

constexpr auto kDeadline = std::chrono::seconds(60);

// Runs a binary to completion (at most 2 minutes); returns its exit code (-1: killed or hung).
int RunToExit(const std::vector<std::string>& argv, const std::string& log,
              const std::map<std::string, std::string>& env = {}) {
  Subprocess p = Subprocess::Start(argv, env, log);
  const int status = p.Wait(std::chrono::minutes(2));
  return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int PortFrom(const std::string& port_file) {
  const std::string s = ReadFileOrEmpty(port_file);
  const size_t colon = s.find(':');
  return colon == std::string::npos ? 0 : std::atoi(s.c_str() + colon + 1);
}

class TlsClientsTest : public ::testing::TestWithParam<bool> {  // param: mTLS
 protected:
  void SetUp() override {
    pki_ = std::make_unique<testing::TestPki>(dir_);
    // pacerd serves copies, so the rotation test can replace them.
    served_ = {dir_.Sub("served.pem"), dir_.Sub("served.key")};
    testing::InstallCert(pki_->server(), served_);
    // pacerd in process (tests/testing/pacerd_harness.h), started once its PKI is made.
    PacerdOptions& o = h_.mutable_options();
    o.sharding.heartbeat_interval_ms = 100;
    o.tls_cert = served_.cert;
    o.tls_key = served_.key;
    if (mtls()) o.tls_client_ca = pki_->ca();
    o.tls_reload_s = 1;
    const absl::Status started = h_.TryStart();
    ASSERT_TRUE(started.ok()) << started;
    pacerd_ = &h_.pacerd();
  }
  bool mtls() const { return GetParam(); }
  std::string addr() const { return pacerd_->address(); }
  TlsClientOptions Tls() const {
    TlsClientOptions t;
    t.ca_file = pki_->ca();
    if (mtls()) {
      t.cert_file = pki_->client().cert;
      t.key_file = pki_->client().key;
    }
    return t;
  }
  // The TLS flags every C++ binary takes.
  std::vector<std::string> TlsFlags() const {
    std::vector<std::string> f = {"--tls-ca", pki_->ca()};
    if (mtls()) f.insert(f.end(), {"--tls-cert", pki_->client().cert, "--tls-key", pki_->client().key});
    return f;
  }
  std::vector<std::string> With(std::vector<std::string> argv, const std::vector<std::string>& more) const {
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  }
  // The common name of the certificate pacerd presents on a new connection ("" when none).
  std::string ServedCommonName() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection, a new handshake
    auto channel = DialChannel(addr(), Tls(), args);
    if (!channel.ok()) return "";
    auto stub = ShardingService::NewStub(*channel);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + pacerd_->job_token());
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ListDatasetsResponse resp;
    if (!stub->ListDatasets(&ctx, ListDatasetsRequest(), &resp).ok()) return "";
    auto cn = ctx.auth_context()->FindPropertyValues("x509_common_name");
    return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
  }

  testing::PacerdHarness h_{{.real_clock = true, .start = false}};
  const TempDir& dir_ = h_.dir();
  std::unique_ptr<testing::TestPki> pki_;
  testing::CertFiles served_;
  Pacerd* pacerd_ = nullptr;
};

TEST_P(TlsClientsTest, CppSdkAndCApiConnectWithTheRightFilesOnly) {
  ClientOptions o;
  o.address = addr();
  o.worker_id = "w0";
  o.token = pacerd_->job_token();
  o.connect_budget_ms = 1'500;
  o.tls = Tls();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->sharding().ListDatasets().ok());

  ClientOptions plain = o;
  plain.worker_id = "w1";
  plain.tls = TlsClientOptions();  // plaintext against a TLS pacerd never gets through
  EXPECT_FALSE(Client::Connect(plain).ok());
  if (mtls()) {
    ClientOptions no_cert = plain;
    no_cert.tls.ca_file = pki_->ca();  // TLS, but no client certificate
    EXPECT_FALSE(Client::Connect(no_cert).ok());
    ClientOptions foreign = no_cert;
    foreign.tls.cert_file = pki_->foreign_client().cert;  // a certificate pacerd's CA did not sign
    foreign.tls.key_file = pki_->foreign_client().key;
    EXPECT_FALSE(Client::Connect(foreign).ok());
  }
  ClientOptions wrong_name = o;
  wrong_name.worker_id = "w2";
  wrong_name.tls.server_name = "not-pacerd.test";  // the certificate names localhost and pacerd.test
  EXPECT_FALSE(Client::Connect(wrong_name).ok());
  wrong_name.tls.server_name = "pacerd.test";
  EXPECT_TRUE(Client::Connect(wrong_name).ok());

  // The C API.
  const std::string token = pacerd_->job_token(), address = addr();
  const TlsClientOptions t = Tls();
  pacer_client_options co = {};
  co.address = address.c_str();
  co.token = token.c_str();
  co.worker_id = "c0";
  co.connect_budget_ms = 1'500;
  co.tls_ca = t.ca_file.c_str();
  if (mtls()) {
    co.tls_cert = t.cert_file.c_str();
    co.tls_key = t.key_file.c_str();
  }
  pacer_client* client = nullptr;
  pacer_error err = {};
  ASSERT_EQ(pacer_client_connect(&co, &client, &err), PACER_OK) << err.message;
  pacer_client_destroy(client, 1'000);
  co.tls_ca = nullptr;
  co.tls_cert = nullptr;
  co.tls_key = nullptr;
  co.worker_id = "c1";
  EXPECT_NE(pacer_client_connect(&co, &client, &err), PACER_OK);
}

TEST_P(TlsClientsTest, PacerctlAndPacerConsume) {
  const std::string admin = dir_.Sub("data/admin.token"), job = dir_.Sub("data/job.token");
  const std::vector<std::string> ctl = {BinaryPath("pacerctl"), "--addr", addr(), "--token-file", admin};
  EXPECT_EQ(RunToExit(With(With(ctl, TlsFlags()), {"status"}), dir_.Sub("ctl.log")), 0)
      << ReadFileOrEmpty(dir_.Sub("ctl.log"));
  EXPECT_NE(RunToExit(With(With(ctl, {"--timeout", "2"}), {"status"}), dir_.Sub("ctl-plain.log")), 0)
      << "plaintext pacerctl got through";
  const std::vector<std::string> consume = {BinaryPath("pacer-consume"), "--addr", addr(), "--token-file", job,
                                            "--worker-id", "c0", "--register-records", "64", "--shard-size",
                                            "16", "--quiet"};
  EXPECT_EQ(RunToExit(With(consume, TlsFlags()), dir_.Sub("consume.log")), 0)
      << ReadFileOrEmpty(dir_.Sub("consume.log"));
}

TEST_P(TlsClientsTest, PacerAgentAndTheWorkersItLaunches) {
  // The worker is pacer-consume with no flags at all: address, credential and TLS files come
  // from the agent's environment (PACER_ADDR, PACER_TOKEN, PACER_TLS_*).
  const std::string job = dir_.Sub("data/job.token");
  ASSERT_EQ(RunToExit(With({BinaryPath("pacer-consume"), "--addr", addr(), "--token-file", job, "--worker-id",
                            "setup", "--register-records", "32", "--shard-size", "8", "--epochs", "1",
                            "--dataset", "agent-data", "--quiet"},
                           TlsFlags()),
                      dir_.Sub("setup.log")),
            0)
      << ReadFileOrEmpty(dir_.Sub("setup.log"));
  const int rc = RunToExit(With(With({BinaryPath("pacer-agent"), "--addr", addr(), "--token-file", job, "--node",
                                      "n0", "--workers", "1"},
                                     TlsFlags()),
                                {"--", BinaryPath("pacer-consume"), "--dataset", "agent-data", "--quiet"}),
                           dir_.Sub("agent.log"));
  EXPECT_EQ(rc, 0) << ReadFileOrEmpty(dir_.Sub("agent.log"));
  bool seen = false;
  for (const auto& a : pacerd_->agents()->Agents()) seen = seen || a.node == "n0";
  EXPECT_TRUE(seen) << "the agent never registered over TLS; log:\n" << ReadFileOrEmpty(dir_.Sub("agent.log"));
}

TEST_P(TlsClientsTest, ExampleTrainerWithPacerPsOverTls) {
  const std::string job = dir_.Sub("data/job.token"), port_file = dir_.Sub("ps0.port");
  std::vector<std::string> ps = {BinaryPath("pacer-ps"), "--server-id", "ps0", "--listen", "127.0.0.1:0",
                                 "--token-file", job, "--port-file", port_file, "--tls-cert",
                                 pki_->server().cert, "--tls-key", pki_->server().key};
  if (mtls()) ps.insert(ps.end(), {"--tls-client-ca", pki_->ca()});
  Subprocess server = Subprocess::Start(ps, {}, dir_.Sub("ps0.log"));
  ASSERT_TRUE(WaitFor([&] { return PortFrom(port_file) > 0 || !server.running(); }, kDeadline));
  ASSERT_GT(PortFrom(port_file), 0) << ReadFileOrEmpty(dir_.Sub("ps0.log"));
  const std::string ps_addr = "127.0.0.1:" + std::to_string(PortFrom(port_file));
  const int rc = RunToExit(With({BinaryPath("pacer-train-ctr"), "--addr", addr(), "--token-file", job,
                                 "--worker-id", "w0", "--ps", ps_addr, "--register-records", "400",
                                 "--shard-size", "100", "--epochs", "1", "--eval-records", "200"},
                                TlsFlags()),
                           dir_.Sub("ctr.log"));
  EXPECT_EQ(rc, 0) << ReadFileOrEmpty(dir_.Sub("ctr.log")) << ReadFileOrEmpty(dir_.Sub("ps0.log"));
  // The trainer pushed through TLS: pacer-ps holds rows.
  auto channel = DialChannel(ps_addr, Tls());
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto stub = ParameterServer::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + pacerd_->job_token());
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  PsStatsResponse stats;
  ASSERT_TRUE(stub->Stats(&ctx, PsStatsRequest(), &stats).ok());
  EXPECT_GT(stats.rows(), 0u);
  // A plaintext client does not get through to the TLS pacer-ps.
  auto plain = ParameterServer::NewStub(grpc::CreateChannel(ps_addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext pctx;
  pctx.AddMetadata("authorization", "Bearer " + pacerd_->job_token());
  pctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  EXPECT_FALSE(plain->Stats(&pctx, PsStatsRequest(), &stats).ok());
  if (mtls()) {  // TLS without a client certificate does not get through to the mTLS pacer-ps
    TlsClientOptions no_cert;
    no_cert.ca_file = pki_->ca();
    auto ch = DialChannel(ps_addr, no_cert);
    ASSERT_TRUE(ch.ok());
    grpc::ClientContext nctx;
    nctx.AddMetadata("authorization", "Bearer " + pacerd_->job_token());
    nctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    EXPECT_FALSE(ParameterServer::NewStub(*ch)->Stats(&nctx, PsStatsRequest(), &stats).ok());
  }
}

TEST_P(TlsClientsTest, PacerPsCertificateRotatesWithoutARestart) {
  const testing::CertFiles served = {dir_.Sub("ps-served.pem"), dir_.Sub("ps-served.key")};
  testing::InstallCert(pki_->server(), served);
  const std::string port_file = dir_.Sub("ps1.port");
  std::vector<std::string> ps = {BinaryPath("pacer-ps"), "--server-id", "ps1", "--listen", "127.0.0.1:0",
                                 "--token-file", dir_.Sub("data/job.token"), "--port-file", port_file,
                                 "--tls-cert", served.cert, "--tls-key", served.key, "--tls-reload-s", "1"};
  if (mtls()) ps.insert(ps.end(), {"--tls-client-ca", pki_->ca()});
  Subprocess server = Subprocess::Start(ps, {}, dir_.Sub("ps1.log"));
  ASSERT_TRUE(WaitFor([&] { return PortFrom(port_file) > 0 || !server.running(); }, kDeadline));
  ASSERT_GT(PortFrom(port_file), 0) << ReadFileOrEmpty(dir_.Sub("ps1.log"));
  const std::string ps_addr = "127.0.0.1:" + std::to_string(PortFrom(port_file));
  auto served_cn = [&]() -> std::string {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = DialChannel(ps_addr, Tls(), args);
    if (!channel.ok()) return "";
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + pacerd_->job_token());
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    PsStatsResponse stats;
    if (!ParameterServer::NewStub(*channel)->Stats(&ctx, PsStatsRequest(), &stats).ok()) return "";
    auto cn = ctx.auth_context()->FindPropertyValues("x509_common_name");
    return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
  };
  ASSERT_EQ(served_cn(), "server-a");
  testing::InstallCert(pki_->Issue("ps-server-b"), served);
  std::string cn;
  EXPECT_TRUE(WaitFor([&] { return (cn = served_cn()) == "ps-server-b"; }, kDeadline, std::chrono::milliseconds(100)))
      << "still served: '" << cn << "'";
  EXPECT_TRUE(server.running()) << "rotated without a restart";
}

TEST_P(TlsClientsTest, ServerCertificateRotatesWithoutARestart) {
  ASSERT_EQ(ServedCommonName(), "server-a");
  ClientOptions o;
  o.address = addr();
  o.worker_id = "w0";
  o.token = pacerd_->job_token();
  o.connect_budget_ms = 5'000;
  o.tls = Tls();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  testing::InstallCert(pki_->Issue("server-b"), served_);
  std::string cn;
  EXPECT_TRUE(WaitFor([&] { return (cn = ServedCommonName()) == "server-b"; }, kDeadline,
                      std::chrono::milliseconds(100)))
      << "still served: '" << cn << "'";
  EXPECT_TRUE((*c)->sharding().ListDatasets().ok()) << "a client connected before the rotation";
}

// mTLS: a client re-reads its own certificate files too. One set of credentials (one file
// watcher) starts with a certificate pacerd's CA did not sign and is refused; once the files
// hold a good one, a new connection made with the same credentials gets through.
TEST_P(TlsClientsTest, ClientCertificateRotatesWithoutRecreatingTheClient) {
  if (!mtls()) GTEST_SKIP() << "only an mTLS pacerd checks client certificates";
  const testing::CertFiles mine = {dir_.Sub("me.pem"), dir_.Sub("me.key")};
  testing::InstallCert(pki_->foreign_client(), mine);
  TlsClientOptions t;
  t.ca_file = pki_->ca();
  t.cert_file = mine.cert;
  t.key_file = mine.key;
  t.reload_interval_s = 1;
  auto creds = MakeChannelCredentials(t, addr());
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto call_ok = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection each time
    auto stub = ShardingService::NewStub(grpc::CreateCustomChannel(addr(), *creds, args));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + pacerd_->job_token());
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    ListDatasetsResponse resp;
    return stub->ListDatasets(&ctx, ListDatasetsRequest(), &resp).ok();
  };
  EXPECT_FALSE(call_ok()) << "a certificate from a foreign CA got through";
  testing::InstallCert(pki_->client(), mine);
  EXPECT_TRUE(WaitFor(call_ok, kDeadline, std::chrono::milliseconds(100)));
}

INSTANTIATE_TEST_SUITE_P(TlsAndMtls, TlsClientsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "mTLS" : "TLS"; });

// Plaintext to a non-loopback address: every client refuses before sending anything, naming the
// flag; the servers refuse to listen in plaintext there.
TEST(PlaintextOffLoopbackTest, EveryClientAndServerRefuses) {
  TempDir dir;
  const std::string token = dir.Sub("token");
  {
    std::ofstream(token) << "0123456789abcdef0123456789abcdef\n";
    std::filesystem::permissions(token, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  const std::string far = "10.255.255.1:7070", named = "127.attacker.example:7070";
  for (const std::string& target : {far, named}) {
    ClientOptions o;
    o.address = target;
    o.worker_id = "w0";
    o.token = "t";
    auto c = Client::Connect(o);
    ASSERT_FALSE(c.ok()) << target;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(std::string(c.status().message()).find("--allow-insecure"), std::string::npos) << c.status();
  }
  pacer_client_options co = {};
  co.address = far.c_str();
  co.token = "t";
  co.worker_id = "c0";
  pacer_client* client = nullptr;
  pacer_error err = {};
  EXPECT_EQ(pacer_client_connect(&co, &client, &err), PACER_INVALID_ARGUMENT);
  PsClientOptions po;  // the parameter-server client
  po.servers = {"127.0.0.1:1", far};
  auto ps = PsClient::Connect(po);
  ASSERT_FALSE(ps.ok());
  EXPECT_NE(std::string(ps.status().message()).find("--allow-insecure"), std::string::npos) << ps.status();

  struct Case {
    std::string name;
    std::vector<std::string> argv;
  };
  const std::vector<Case> cases = {
      {"pacerctl", {BinaryPath("pacerctl"), "--addr", named, "--token-file", token, "status"}},
      {"pacer-consume", {BinaryPath("pacer-consume"), "--addr", far, "--token-file", token, "--worker-id", "w0"}},
      {"pacer-agent", {BinaryPath("pacer-agent"), "--addr", far, "--token-file", token, "--node", "n0", "--",
                       "/bin/true"}},
      {"pacer-train-ctr", {BinaryPath("pacer-train-ctr"), "--addr", far, "--token-file", token, "--worker-id",
                           "w0", "--ps", "127.0.0.1:1"}},
      {"pacer-train-mlp", {BinaryPath("pacer-train-mlp"), "--addr", far, "--token-file", token, "--worker-id",
                           "w0"}},
      {"pacer-ps", {BinaryPath("pacer-ps"), "--listen", "0.0.0.0:0", "--token-file", token}},
      {"pacerd", {BinaryPath("pacerd"), "--listen", "0.0.0.0:0", "--metrics-listen", "", "--data-dir",
                  dir.Sub("data")}},
  };
  for (const Case& c : cases) {
    const std::string log = dir.Sub("refused.log");
    std::filesystem::remove(log);
    const int rc = RunToExit(c.argv, log);
    const std::string out = ReadFileOrEmpty(log);
    EXPECT_NE(rc, 0) << c.name << " accepted plaintext off loopback:\n" << out;
    EXPECT_NE(rc, -1) << c.name << " hung";
    EXPECT_NE(out.find("--allow-insecure"), std::string::npos) << c.name << ":\n" << out;
    EXPECT_NE(out.find(c.name == "pacer-ps" || c.name == "pacerd" ? "--tls-cert" : "--tls-ca"), std::string::npos)
        << c.name << ":\n" << out;
  }
}

}  // namespace
}  // namespace pacer
