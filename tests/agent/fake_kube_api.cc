#include "tests/agent/fake_kube_api.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <fstream>
#include <stdexcept>

namespace pacer::testing {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

std::string BioString(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

void Check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("test certificate: ") + what);
}

}  // namespace

TestCertificate MakeSelfSignedCertificate(const std::string& common_name, const std::string& san) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  Check(key != nullptr, "EVP_EC_gen");
  X509* x = X509_new();
  Check(x != nullptr, "X509_new");
  X509_set_version(x, 2);
  static long serial = 1;
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE"},
                            std::pair{NID_key_usage, "critical,digitalSignature,keyCertSign"},
                            std::pair{NID_subject_alt_name, san.c_str()}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    Check(ext != nullptr, "extension");
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  Check(X509_sign(x, key, EVP_sha256()) > 0, "X509_sign");
  TestCertificate out;
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, x);
  out.cert_pem = BioString(bio);
  BIO_free(bio);
  bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  out.key_pem = BioString(bio);
  BIO_free(bio);
  X509_free(x);
  EVP_PKEY_free(key);
  return out;
}

std::string KubeStatusBody(int code, const std::string& reason, const std::string& message) {
  return R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":")" +
         message + R"(","reason":")" + reason + R"(","code":)" + std::to_string(code) + "}";
}

struct FakeKubeApi::Impl {
  explicit Impl(FakeKubeApi* api) : api(api), ssl(asio::ssl::context::tls_server), acceptor(io) {}

  // One connection: [TLS handshake,] read one request, reply (or hang), close.
  template <class Stream>
  struct Session : std::enable_shared_from_this<Session<Stream>> {
    template <class... Args>
    Session(Impl* impl, Args&&... args) : impl(impl), stream(std::forward<Args>(args)...) {}
    void Start() {
      auto self = this->shared_from_this();
      if constexpr (std::is_same_v<Stream, asio::ssl::stream<tcp::socket>>) {
        stream.async_handshake(asio::ssl::stream_base::server, [self](const boost::system::error_code& ec) {
          if (!ec) self->Read();
        });
      } else {
        Read();
      }
    }
    void Read() {
      auto self = this->shared_from_this();
      http::async_read(stream, buffer, request, [self](const boost::system::error_code& ec, size_t) {
        if (ec) return;
        FakeKubeRequest r;
        r.method = std::string(self->request.method_string());
        r.target = std::string(self->request.target());
        r.authorization = std::string(self->request[http::field::authorization]);
        r.content_type = std::string(self->request[http::field::content_type]);
        r.body = self->request.body();
        r.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
        const FakeKubeReply reply = self->impl->api->Next(r);
        if (reply.hang) {
          self->impl->held.push_back(self);  // open and silent until the server stops
          return;
        }
        self->response.result(static_cast<unsigned>(reply.status));
        self->response.version(11);
        self->response.set(http::field::content_type, "application/json");
        self->response.set(http::field::connection, "close");
        self->response.body() = reply.body;
        self->response.prepare_payload();
        http::async_write(self->stream, self->response, [self](const boost::system::error_code&, size_t) {
          boost::system::error_code ignored;
          self->stream.lowest_layer().close(ignored);
        });
      });
    }
    Impl* impl;
    Stream stream;
    boost::beast::flat_buffer buffer;
    http::request<http::string_body> request;
    http::response<http::string_body> response;
  };

  void Accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec) return;
      if (api->tls_) {
        std::make_shared<Session<asio::ssl::stream<tcp::socket>>>(this, std::move(socket), ssl)->Start();
      } else {
        std::make_shared<Session<tcp::socket>>(this, std::move(socket))->Start();
      }
      Accept();
    });
  }

  FakeKubeApi* api;
  asio::ssl::context ssl;  // outlives the io_context and the sessions it holds
  asio::io_context io;
  tcp::acceptor acceptor;
  std::vector<std::shared_ptr<void>> held;
};

FakeKubeApi::FakeKubeApi(const std::string& dir, bool tls, const std::string& san) : tls_(tls), impl_(std::make_unique<Impl>(this)) {
  if (tls_) {
    const TestCertificate cert = MakeSelfSignedCertificate("pacer-fake-kube-api", san);
    ca_file_ = dir + "/ca.crt";
    std::ofstream(ca_file_) << cert.cert_pem;
    impl_->ssl.use_certificate_chain(asio::buffer(cert.cert_pem));
    impl_->ssl.use_private_key(asio::buffer(cert.key_pem), asio::ssl::context::pem);
  }
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(ep.protocol());
  impl_->acceptor.bind(ep);
  impl_->acceptor.listen();
  port_ = impl_->acceptor.local_endpoint().port();
  impl_->Accept();
  thread_ = std::thread([this] { impl_->io.run(); });
}

FakeKubeApi::~FakeKubeApi() {
  impl_->io.stop();
  thread_.join();
}

std::string FakeKubeApi::url() const {
  return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_);
}

void FakeKubeApi::Push(FakeKubeReply reply) {
  std::lock_guard<std::mutex> l(mu_);
  script_.push_back(std::move(reply));
}

void FakeKubeApi::SetDefault(FakeKubeReply reply) {
  std::lock_guard<std::mutex> l(mu_);
  default_ = std::move(reply);
}

std::vector<FakeKubeRequest> FakeKubeApi::Requests() const {
  std::lock_guard<std::mutex> l(mu_);
  return requests_;
}

void FakeKubeApi::SetOnRequest(std::function<void(const FakeKubeRequest&)> hook) {
  std::lock_guard<std::mutex> l(mu_);
  on_request_ = std::move(hook);
}

FakeKubeReply FakeKubeApi::Next(const FakeKubeRequest& request) {
  std::lock_guard<std::mutex> l(mu_);
  if (on_request_) on_request_(request);
  requests_.push_back(request);
  if (script_.empty()) return default_;
  FakeKubeReply r = script_.front();
  script_.pop_front();
  return r;
}

}  // namespace pacer::testing
