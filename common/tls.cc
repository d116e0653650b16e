#include "common/tls.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "common/net.h"

namespace pacer {
namespace {

constexpr int64_t kMaxPemBytes = 1 << 20;  // a certificate bundle or key file, at most 1 MiB

void FromEnv(std::string& field, const char* name) {
  if (!field.empty()) return;
  if (const char* v = std::getenv(name); v != nullptr && *v != '\0') field = v;
}

bool TruthyEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s == "1" || s == "true" || s == "yes";
}

// Reads a regular file of at most kMaxPemBytes (never a device or a FIFO that would not end).
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(what + " '" + path + "': cannot read it (" +
                                      std::strerror(errno) + ")");
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(what + " '" + path + "': not a regular file");
  if (st.st_size > kMaxPemBytes) {
    return absl::InvalidArgumentError(what + " '" + path + "': larger than 1 MiB, not a PEM file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(what + " '" + path + "': cannot open it");
  std::string data(static_cast<size_t>(st.st_size), '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(in.gcount()));
  return data;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM data";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// The first certificate of a PEM file (INVALID_ARGUMENT naming the file when there is none).
absl::StatusOr<std::unique_ptr<X509, X509Free>> FirstCertificate(const std::string& path,
                                                                const std::string& what) {
  auto pem = ReadPemFile(path, what);
  if (!pem.ok()) return pem.status();
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return absl::InvalidArgumentError(what + " '" + path + "': no PEM certificate in it (" +
                                      OpenSslError() + ")");
  }
  return cert;
}

void RequireMinimumInterval(int& s) { s = std::max(1, s); }

}  // namespace

void TlsClientOptions::FillFromEnvironment() {
  FromEnv(ca_file, "PACER_TLS_CA");
  FromEnv(cert_file, "PACER_TLS_CERT");
  FromEnv(key_file, "PACER_TLS_KEY");
  FromEnv(server_name, "PACER_TLS_SERVER_NAME");
  if (!allow_insecure) allow_insecure = TruthyEnv("PACER_ALLOW_INSECURE");
}

void AddTlsClientFlags(boost::program_options::options_description& desc, TlsClientOptions* o,
                       bool with_allow_insecure) {
  namespace po = boost::program_options;
  desc.add_options()
      ("tls-ca", po::value(&o->ca_file), "CA bundle (PEM) that signs pacerd's certificate; turns TLS on (default $PACER_TLS_CA)")
      ("tls-cert", po::value(&o->cert_file), "client certificate (PEM) for mTLS, with --tls-key (default $PACER_TLS_CERT)")
      ("tls-key", po::value(&o->key_file), "client private key (PEM) for mTLS (default $PACER_TLS_KEY)")
      ("tls-server-name", po::value(&o->server_name),
       "name to verify in the server certificate instead of the address's host (default $PACER_TLS_SERVER_NAME)");
  if (with_allow_insecure) {
    desc.add_options()("allow-insecure", po::bool_switch(&o->allow_insecure),
                       "allow plaintext to a non-loopback address (tokens in clear text; $PACER_ALLOW_INSECURE=1)");
  }
}

absl::Status CheckCertificateFiles(const std::string& cert_file, const std::string& key_file,
                                   const std::string& what) {
  auto cert = FirstCertificate(cert_file, what);
  if (!cert.ok()) return cert.status();
  if (key_file.empty()) return absl::OkStatus();
  const std::string key_what = what == "--tls-cert" ? "--tls-key" : what + " key";
  auto pem = ReadPemFile(key_file, key_what);
  if (!pem.ok()) return pem.status();
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  std::unique_ptr<EVP_PKEY, PkeyFree> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(key_what + " '" + key_file +
                                      "': no unencrypted PEM private key in it (" + OpenSslError() + ")");
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(key_what + " '" + key_file + "' does not match the certificate in '" +
                                      cert_file + "'");
  }
  return absl::OkStatus();
}

bool IsLoopbackTarget(const std::string& target) {
  std::string t = target;
  if (t.rfind("unix:", 0) == 0 || t.rfind("unix-abstract:", 0) == 0) return true;
  if (t.rfind("dns:", 0) == 0) {
    t = t.substr(4);
    if (t.rfind("//", 0) == 0) {  // dns://[authority]/host:port; the authority is a DNS server
      auto slash = t.find('/', 2);
      if (slash == std::string::npos) return false;
      t = t.substr(slash + 1);
    }
  } else if (t.rfind("ipv4:", 0) == 0 || t.rfind("ipv6:", 0) == 0) {
    std::stringstream list(t.substr(5));
    std::string one;
    bool any = false;
    while (std::getline(list, one, ',')) {
      auto hp = ParseHostPort(one);
      if (!hp.ok() || !IsLoopbackHost(hp->host)) return false;
      any = true;
    }
    return any;
  }
  auto hp = ParseHostPort(t);
  if (hp.ok()) return IsLoopbackHost(hp->host);
  return IsLoopbackHost(t);  // a bare host (gRPC's default port)
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientOptions& o, const std::string& target) {
  if (!o.enabled()) {
    if (!IsLoopbackTarget(target) && !o.allow_insecure) {
      return absl::InvalidArgumentError(
          "refusing plaintext to non-loopback address '" + target +
          "' (the token would travel in clear text): give --tls-ca (PACER_TLS_CA) for TLS, with "
          "--tls-cert/--tls-key (PACER_TLS_CERT/PACER_TLS_KEY) for mTLS, or --allow-insecure "
          "(PACER_ALLOW_INSECURE=1)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError(
        "mTLS needs both a client certificate and its key: give --tls-cert and --tls-key "
        "(PACER_TLS_CERT and PACER_TLS_KEY) together");
  }
  if (!o.ca_file.empty()) {
    if (auto ca = FirstCertificate(o.ca_file, "--tls-ca"); !ca.ok()) return ca.status();
  }
  if (!o.cert_file.empty()) {
    if (absl::Status s = CheckCertificateFiles(o.cert_file, o.key_file, "--tls-cert"); !s.ok()) return s;
  }
  int interval = o.reload_interval_s;
  RequireMinimumInterval(interval);
  grpc::experimental::TlsChannelCredentialsOptions opts;
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.key_file, o.cert_file, o.ca_file, static_cast<unsigned>(interval));
  opts.set_certificate_provider(provider);
  if (!o.ca_file.empty()) opts.watch_root_certs();
  if (!o.cert_file.empty()) opts.watch_identity_key_cert_pairs();
  opts.set_verify_server_certs(true);
  opts.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  auto creds = grpc::experimental::TlsCredentials(opts);
  if (creds == nullptr) return absl::InvalidArgumentError("gRPC refused the TLS client options");
  return creds;
}

void ApplyTlsChannelArgs(const TlsClientOptions& o, grpc::ChannelArguments* args) {
  if (o.enabled() && !o.server_name.empty()) args->SetSslTargetNameOverride(o.server_name);
}

absl::StatusOr<std::string> PrepareTarget(const std::string& address, grpc::ChannelArguments* args) {
  auto target = ClientTarget(address);
  if (!target.ok()) return target.status();
  if (*target != address) args->SetString(GRPC_ARG_DEFAULT_AUTHORITY, FirstAddressOf(*target));
  return target;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialChannel(const std::string& address,
                                                           const TlsClientOptions& o,
                                                           grpc::ChannelArguments args) {
  auto prepared = PrepareTarget(address, &args);
  if (!prepared.ok()) return prepared.status();
  const std::string& target = *prepared;
  auto creds = MakeChannelCredentials(o, target);
  if (!creds.ok()) return creds.status();
  ApplyTlsChannelArgs(o, &args);
  return grpc::CreateCustomChannel(target, *creds, args);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerOptions& o, const std::string& listen_host, const std::string& binary) {
  if (o.cert_file.empty() && o.key_file.empty()) {
    if (!o.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca needs --tls-cert and --tls-key: mTLS without a server certificate "
          "would serve plaintext");
    }
    if (!IsLoopbackHost(listen_host) && !o.allow_insecure) {
      return absl::InvalidArgumentError("refusing plaintext on non-loopback address '" + listen_host +
                                        "': give --tls-cert/--tls-key, or --allow-insecure");
    }
    PACER_LOG(WARNING) << binary << ": serving plaintext gRPC on " << listen_host
                       << (IsLoopbackHost(listen_host) ? " (loopback only)" : " (INSECURE)");
    return grpc::InsecureServerCredentials();
  }
  if (o.cert_file.empty() || o.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  if (absl::Status s = CheckCertificateFiles(o.cert_file, o.key_file, "--tls-cert"); !s.ok()) return s;
  if (!o.client_ca_file.empty()) {
    if (auto ca = FirstCertificate(o.client_ca_file, "--tls-client-ca"); !ca.ok()) return ca.status();
  }
  int interval = o.reload_interval_s;
  RequireMinimumInterval(interval);
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.key_file, o.cert_file, o.client_ca_file, static_cast<unsigned>(interval));
  grpc::experimental::TlsServerCredentialsOptions opts(provider);
  opts.watch_identity_key_cert_pairs();
  if (!o.client_ca_file.empty()) {
    opts.watch_root_certs();
    opts.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    opts.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  auto creds = grpc::experimental::TlsServerCredentials(opts);
  if (creds == nullptr) return absl::InvalidArgumentError(binary + ": gRPC refused the TLS server options");
  PACER_LOG(INFO) << binary << ": serving " << (o.client_ca_file.empty() ? "TLS" : "mTLS") << " on "
                  << listen_host << " (certificates re-read every " << interval << " s)";
  return creds;
}

}  // namespace pacer
