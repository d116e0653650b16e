// FakeKubeApi: a stand-in for the Kubernetes API server in tests, a real HTTPS (or HTTP)
// server on 127.0.0.1 with a port chosen by the OS, so that the agent's KubeClient is tested
// over real TCP and TLS, CA verification included.
//
// Owns: a self-signed certificate for 127.0.0.1 made at construction (its PEM in
// `<dir>/ca.crt`, the file the client must trust), a thread running the server's io_context,
// every request received, and a script of replies (FIFO, then a default). A reply may "hang":
// the request is read and never answered, for timeout tests. Thread-safe: Push/Requests may be
// called from the test thread while the server runs.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pacer::testing {

struct FakeKubeReply {
  int status = 200;
  std::string body = R"({"kind":"Pod","apiVersion":"v1"})";
  bool hang = false;  // read the request, never answer
};

struct FakeKubeRequest {
  std::string method, target, authorization, content_type, body;
  int64_t time_ms = 0;  // when it was received (system clock, ms since the epoch)
};

// A self-signed certificate (CA:TRUE, subjectAltName `san`) and its key, PEM.
struct TestCertificate {
  std::string cert_pem, key_pem;
};
constexpr char kLoopbackSan[] = "IP:127.0.0.1,DNS:localhost";
TestCertificate MakeSelfSignedCertificate(const std::string& common_name,
                                          const std::string& san = kLoopbackSan);

// Status object bodies the real API server sends.
std::string KubeStatusBody(int code, const std::string& reason, const std::string& message);

class FakeKubeApi {
 public:
  // Writes `<dir>/ca.crt` (tls; its certificate names `san`) and starts serving.
  explicit FakeKubeApi(const std::string& dir, bool tls = true, const std::string& san = kLoopbackSan);
  ~FakeKubeApi();
  FakeKubeApi(const FakeKubeApi&) = delete;
  FakeKubeApi& operator=(const FakeKubeApi&) = delete;

  int port() const { return port_; }
  std::string url() const;  // https://127.0.0.1:PORT
  const std::string& ca_file() const { return ca_file_; }

  void Push(FakeKubeReply reply);        // the next unanswered request gets this
  void SetDefault(FakeKubeReply reply);  // once the script is used up
  std::vector<FakeKubeRequest> Requests() const;
  // Called on the server's thread for each request, before the reply is chosen.
  void SetOnRequest(std::function<void(const FakeKubeRequest&)> hook);

 private:
  struct Impl;
  friend struct Impl;
  FakeKubeReply Next(const FakeKubeRequest& request);

  bool tls_;
  std::string ca_file_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::deque<FakeKubeReply> script_;
  FakeKubeReply default_;
  std::vector<FakeKubeRequest> requests_;
  std::function<void(const FakeKubeRequest&)> on_request_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace pacer::testing
