// KubeClient (agent/kube_client.h): URL and in-cluster configuration parsing, and DeletePod
// against FakeKubeApi, a real HTTPS server on a loopback port chosen by the OS with its own
// self-signed CA, so that TLS verification, the request line, the token and every reply class
// (done, gone, refused, retried, timed out) are exercised over the wire.
#include "agent/kube_client.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "tests/agent/fake_kube_api.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::FakeKubeApi;
using testing::FakeKubeReply;
using testing::KubeStatusBody;
using testing::TempDir;

TEST(ParseKubeApiUrlTest, AcceptsHostPortForms) {
  auto e = ParseKubeApiUrl("https://10.96.0.1:443");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->tls);
  EXPECT_EQ(e->host, "10.96.0.1");
  EXPECT_EQ(e->port, 443);
  EXPECT_EQ(e->HostHeader(), "10.96.0.1");

  e = ParseKubeApiUrl("https://kubernetes.default.svc");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "kubernetes.default.svc");
  EXPECT_EQ(e->port, 443);

  e = ParseKubeApiUrl("http://127.0.0.1:8080/");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FALSE(e->tls);
  EXPECT_EQ(e->port, 8080);
  EXPECT_EQ(e->HostHeader(), "127.0.0.1:8080");

  e = ParseKubeApiUrl("https://[fd00::1]:6443");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "fd00::1");
  EXPECT_EQ(e->port, 6443);
  EXPECT_EQ(e->HostHeader(), "[fd00::1]:6443");
}

TEST(ParseKubeApiUrlTest, RejectsWhatIsNotSchemeHostPort) {
  for (const char* bad : {"", "10.96.0.1:443", "ftp://h", "https://", "https://:443", "https://h:0",
                          "https://h:65536", "https://h:x", "https://h:", "https://h/api/v1",
                          "https://user@h", "https://h?x=1", "https://[fd00::1", "https://[nonsense]:1",
                          "https://[fd00::1]x"}) {
    auto e = ParseKubeApiUrl(bad);
    EXPECT_FALSE(e.ok()) << "'" << bad << "' was accepted";
    if (!e.ok()) {
      EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
  }
}

// A service account directory as the kubelet mounts it.
class KubeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(sa_);
    Write(sa_ + "/token", "sa-token\n");
    Write(sa_ + "/ca.crt", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
    Write(sa_ + "/namespace", "pacer-jobs");
    flags_.service_account_dir = sa_;
  }
  static void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

  TempDir dir_;
  std::string sa_ = dir_.Sub("serviceaccount");
  KubeFlags flags_;
  std::map<std::string, std::string> env_ = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                             {"KUBERNETES_SERVICE_PORT", "6443"},
                                             {"POD_NAME", "job-w3-7f9c"}};
};

TEST_F(KubeConfigTest, InClusterDefaultsComeFromTheEnvironmentAndTheServiceAccount) {
  auto o = ResolveKubeClientOptions(flags_, env_);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->endpoint.tls);
  EXPECT_EQ(o->endpoint.host, "10.96.0.1");
  EXPECT_EQ(o->endpoint.port, 6443);
  EXPECT_EQ(o->token_file, sa_ + "/token");
  EXPECT_EQ(o->ca_file, sa_ + "/ca.crt");
  EXPECT_EQ(o->namespace_name, "pacer-jobs");
  EXPECT_EQ(o->pod_name, "job-w3-7f9c");
  EXPECT_EQ(o->pod_uid, "");
  EXPECT_EQ(o->PodPath(), "/api/v1/namespaces/pacer-jobs/pods/job-w3-7f9c");

  env_["KUBERNETES_SERVICE_HOST"] = "fd00::1";
  env_["POD_NAMESPACE"] = "from-env";
  env_["POD_UID"] = "0b1f6e2a-8d3c-4c1e-9f00-123456789abc";
  o = ResolveKubeClientOptions(flags_, env_);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint.host, "fd00::1");
  EXPECT_EQ(o->namespace_name, "from-env");  // the downward API beats the mounted file
  EXPECT_EQ(o->pod_uid, "0b1f6e2a-8d3c-4c1e-9f00-123456789abc");
}

TEST_F(KubeConfigTest, FlagsOverrideTheEnvironment) {
  Write(dir_.Sub("other-token"), "other\n");
  Write(dir_.Sub("other-ca.crt"), "-----BEGIN CERTIFICATE-----\n");
  flags_.api_url = "https://127.0.0.1:9443";
  flags_.token_file = dir_.Sub("other-token");
  flags_.ca_file = dir_.Sub("other-ca.crt");
  flags_.namespace_name = "ns2";
  flags_.pod_name = "pod-2";
  flags_.pod_uid = "uid-2";
  auto o = ResolveKubeClientOptions(flags_, env_);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint.HostHeader(), "127.0.0.1:9443");
  EXPECT_EQ(o->token_file, dir_.Sub("other-token"));
  EXPECT_EQ(o->ca_file, dir_.Sub("other-ca.crt"));
  EXPECT_EQ(o->PodPath(), "/api/v1/namespaces/ns2/pods/pod-2");
  EXPECT_EQ(o->pod_uid, "uid-2");
}

TEST_F(KubeConfigTest, BadConfigurationIsAClearErrorNamingTheFix) {
  auto expect_error = [&](const KubeFlags& f, const std::map<std::string, std::string>& env,
                          const std::string& needle) {
    auto o = ResolveKubeClientOptions(f, env);
    ASSERT_FALSE(o.ok()) << "accepted; wanted an error with '" << needle << "'";
    EXPECT_NE(o.status().message().find(needle), std::string::npos) << o.status().message();
  };
  KubeFlags f = flags_;
  f.token_file = dir_.Sub("missing-token");
  expect_error(f, env_, "cannot read the service account token file " + dir_.Sub("missing-token"));
  expect_error(f, env_, "--k8s-token-file");
  Write(dir_.Sub("empty-token"), "\n");
  f.token_file = dir_.Sub("empty-token");
  expect_error(f, env_, "is empty");
  Write(dir_.Sub("two-lines"), "a\nb\n");
  f.token_file = dir_.Sub("two-lines");
  expect_error(f, env_, "more than one line");

  f = flags_;
  f.ca_file = dir_.Sub("missing-ca");
  expect_error(f, env_, "--k8s-ca-file");
  Write(dir_.Sub("not-pem"), "hello");
  f.ca_file = dir_.Sub("not-pem");
  expect_error(f, env_, "no PEM certificate");

  auto env = env_;
  env.erase("KUBERNETES_SERVICE_HOST");
  expect_error(flags_, env, "KUBERNETES_SERVICE_HOST is not set");
  env = env_;
  env.erase("POD_NAME");
  expect_error(flags_, env, "POD_NAME");
  env = env_;
  env["POD_NAME"] = "../../nodes/n1";
  expect_error(flags_, env, "not a valid Kubernetes name");
  f = flags_;
  f.namespace_name = "Bad_NS";
  expect_error(f, env_, "not a valid Kubernetes name");
  std::filesystem::remove(sa_ + "/namespace");
  expect_error(flags_, env_, "--k8s-namespace");
  f = flags_;
  f.namespace_name = "ns";
  f.pod_uid = "x/y";
  expect_error(f, env_, "not a uid");

  f = flags_;
  f.namespace_name = "ns";
  f.api_url = "http://127.0.0.1:8080";
  expect_error(f, env_, "plain http is for tests only");
  f.allow_insecure_http = true;
  EXPECT_TRUE(ResolveKubeClientOptions(f, env_).ok());
  f.api_url = "https://127.0.0.1:8080/api";
  expect_error(f, env_, "without path");
}

// DeletePod over real TLS to the fake API server.
class DeletePodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Sub("token")) << "the-bearer-token\n";
    options_.endpoint = *ParseKubeApiUrl(api_.url());
    options_.token_file = dir_.Sub("token");
    options_.ca_file = api_.ca_file();
    options_.namespace_name = "pacer-jobs";
    options_.pod_name = "job-w1";
    options_.attempt_timeout_ms = 5000;
    options_.max_attempts = 3;
    options_.backoff_initial_ms = 50;
  }
  // Runs one DeletePod to completion on a private loop.
  absl::StatusOr<PodDeletion> Delete() {
    boost::asio::io_context io;
    KubeClient client(io, options_);
    std::optional<absl::StatusOr<PodDeletion>> result;
    client.DeletePod([&](absl::StatusOr<PodDeletion> r) { result = std::move(r); });
    io.run_for(std::chrono::seconds(60));
    if (!result) return absl::InternalError("DeletePod did not finish");
    return *result;
  }

  TempDir dir_;
  FakeKubeApi api_{dir_.path()};
  KubeClientOptions options_;
};

TEST_F(DeletePodTest, SendsTheDeleteForTheOwnPodWithTheBearerToken) {
  auto r = Delete();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->http_status, 200);
  EXPECT_FALSE(r->already_gone);
  EXPECT_EQ(r->attempts, 1);
  auto reqs = api_.Requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].method, "DELETE");
  EXPECT_EQ(reqs[0].target, "/api/v1/namespaces/pacer-jobs/pods/job-w1");
  EXPECT_EQ(reqs[0].authorization, "Bearer the-bearer-token");
  EXPECT_EQ(reqs[0].body, "");  // no uid: no preconditions
}

TEST_F(DeletePodTest, TheUidPreconditionProtectsAReplacementPod) {
  options_.pod_uid = "uid-1234";
  api_.Push({409, KubeStatusBody(409, "Conflict", "Precondition failed: UID in precondition: uid-1234")});
  auto r = Delete();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->already_gone);  // the name belongs to a replacement: ours is gone
  auto reqs = api_.Requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].content_type, "application/json");
  EXPECT_NE(reqs[0].body.find(R"("preconditions":{"uid":"uid-1234"})"), std::string::npos) << reqs[0].body;
}

TEST_F(DeletePodTest, NotFoundCountsAsAlreadyGone) {
  api_.Push({404, KubeStatusBody(404, "NotFound", "pods \"job-w1\" not found")});
  auto r = Delete();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->http_status, 404);
  EXPECT_TRUE(r->already_gone);
  EXPECT_EQ(api_.Requests().size(), 1u);
}

TEST_F(DeletePodTest, ForbiddenFailsAtOnceWithTheRbacHint) {
  api_.SetDefault({403, KubeStatusBody(403, "Forbidden",
                                       "pods \\\"job-w1\\\" is forbidden: User \\\"system:serviceaccount:pacer-jobs:default\\\" cannot delete resource")});
  auto r = Delete();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  const std::string m(r.status().message());
  EXPECT_NE(m.find("403 Forbidden"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot delete resource"), std::string::npos) << m;  // the API's own message
  EXPECT_NE(m.find("RBAC"), std::string::npos) << m;
  EXPECT_NE(m.find("deploy/base/agent-rbac.yaml"), std::string::npos) << m;
  EXPECT_EQ(api_.Requests().size(), 1u);  // not retried
}

TEST_F(DeletePodTest, UnauthorizedFailsAtOnce) {
  api_.SetDefault({401, KubeStatusBody(401, "Unauthorized", "Unauthorized")});
  auto r = Delete();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(api_.Requests().size(), 1u);
}

TEST_F(DeletePodTest, ServerErrorsAreRetriedWithBackoff) {
  api_.Push({503, KubeStatusBody(503, "ServiceUnavailable", "etcd leader changed")});
  api_.Push({500, "not json"});
  // The kubelet rotates the token file: every attempt reads it again.
  api_.SetOnRequest([&](const testing::FakeKubeRequest&) {
    std::ofstream(dir_.Sub("token")) << "rotated-token\n";
  });
  const auto start = std::chrono::steady_clock::now();
  auto r = Delete();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->attempts, 3);
  auto reqs = api_.Requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].authorization, "Bearer the-bearer-token");
  EXPECT_EQ(reqs[1].authorization, "Bearer rotated-token");
  EXPECT_GE(took, std::chrono::milliseconds(50 + 100));  // the two backoff waits
}

TEST_F(DeletePodTest, RetriesAreBounded) {
  api_.SetDefault({500, KubeStatusBody(500, "InternalError", "boom")});
  auto r = Delete();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("gave up after 3 attempts"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("boom"), std::string::npos) << r.status().message();
  EXPECT_EQ(api_.Requests().size(), 3u);
}

TEST_F(DeletePodTest, AServerThatNeverAnswersTimesOut) {
  api_.SetDefault({200, "", /*hang=*/true});
  // The attempt's deadline covers connect and the TLS handshake too: 300 ms was within reach of
  // a loaded 2-core machine, where the attempt then timed out before the fake server had the
  // request (and Requests() missed it). 2 s leaves the handshake room; the server still never
  // answers.
  options_.attempt_timeout_ms = 2000;
  options_.max_attempts = 2;
  const auto start = std::chrono::steady_clock::now();
  auto r = Delete();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find("no reply within 2000 ms"), std::string::npos) << r.status().message();
  EXPECT_EQ(api_.Requests().size(), 2u);
  EXPECT_GE(took, std::chrono::milliseconds(2 * 2000 + 50));
  EXPECT_LT(took, std::chrono::seconds(30));
}

TEST_F(DeletePodTest, AServerTheCaDoesNotVouchForIsNeverSentTheToken) {
  const auto other = testing::MakeSelfSignedCertificate("someone-else");
  std::ofstream(dir_.Sub("other-ca.crt")) << other.cert_pem;
  options_.ca_file = dir_.Sub("other-ca.crt");
  options_.max_attempts = 2;
  auto r = Delete();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("TLS handshake"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("certificate verify failed"), std::string::npos) << r.status().message();
  EXPECT_TRUE(api_.Requests().empty());
}

TEST_F(DeletePodTest, TheCertificateMustNameTheHostAskedFor) {
  // A server whose certificate (trusted CA) names only kubernetes.default.svc, reached as
  // 127.0.0.1: the right CA is not enough, the name must match too.
  std::filesystem::create_directories(dir_.Sub("other"));
  FakeKubeApi other(dir_.Sub("other"), true, "DNS:kubernetes.default.svc");
  options_.endpoint = *ParseKubeApiUrl(other.url());
  options_.ca_file = other.ca_file();
  options_.max_attempts = 1;
  auto r = Delete();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("certificate verify failed"), std::string::npos) << r.status().message();
  EXPECT_TRUE(other.Requests().empty());
}

TEST_F(DeletePodTest, ConnectionRefusedIsRetriedThenUnavailable) {
  // A port that was free a moment ago: bind, read it, close.
  int port = 0;
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    port = a.local_endpoint().port();
  }
  options_.endpoint.port = static_cast<uint16_t>(port);
  auto r = Delete();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("connect"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("gave up after 3 attempts"), std::string::npos);
}

TEST(KubeClientTest, DestroyingTheClientCancelsACallInFlightWithoutCallingBack) {
  TempDir dir;
  FakeKubeApi api(dir.path());
  api.SetDefault({200, "", /*hang=*/true});
  std::ofstream(dir.Sub("token")) << "t\n";
  KubeClientOptions o;
  o.endpoint = *ParseKubeApiUrl(api.url());
  o.token_file = dir.Sub("token");
  o.ca_file = api.ca_file();
  o.namespace_name = "ns";
  o.pod_name = "p";
  boost::asio::io_context io;
  bool called = false;
  {
    auto client = std::make_unique<KubeClient>(io, o);
    client->DeletePod([&](absl::StatusOr<PodDeletion>) { called = true; });
    // Run until the request reached the server, then drop the client.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (api.Requests().empty() && std::chrono::steady_clock::now() < deadline) {
      io.run_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(api.Requests().size(), 1u);
  }
  io.run_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace pacer
