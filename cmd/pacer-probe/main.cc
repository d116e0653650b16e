// pacer-probe: one gRPC health check (grpc.health.v1.Health/Check) against pacerd, for a
// Kubernetes exec probe (deploy/base/pacerd-statefulset.yaml, docs/kubernetes.md).
//
// Why not the kubelet's own `grpc:` probe: it speaks plaintext only, and pacerd off loopback
// serves TLS (mTLS in the prod overlay). This program dials the way any client does: TLS with
// --tls-ca, a client certificate with --tls-cert/--tls-key, plaintext only with --plaintext.
//
//   pacer-probe --addr 127.0.0.1:7070 --tls-ca /tls/ca.crt --server-name pacerd
//
// Exit codes (what the kubelet reads): 0 SERVING; 1 NOT_SERVING, UNKNOWN, unreachable or timed
// out (the message says which); 2 bad flags or unreadable files. The health service needs no
// token; the request and reply are the two tiny messages of grpc/health/v1/health.proto, encoded
// here by hand (field 1: service name; field 1: status enum) so no generated code is needed.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/synchronization/mutex.h"
#include "common/flags.h"

namespace po = boost::program_options;

namespace {

// HealthCheckRequest{service}: field 1, wire type 2 (length-delimited).
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0a);
  size_t n = service.size();
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  return out + service;
}

// HealthCheckResponse.status (field 1, varint); -1 when the bytes are not that message.
int DecodeStatus(const std::string& bytes) {
  if (bytes.empty()) return 0;  // proto3 default: UNKNOWN
  if (bytes.size() < 2 || bytes[0] != 0x08) return -1;
  const auto v = static_cast<unsigned char>(bytes[1]);
  return v < 0x80 ? v : -1;
}

const char* StatusName(int s) {
  switch (s) {
    case 0: return "UNKNOWN";
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return "unreadable reply";
  }
}

std::string ReadOrExit(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  if (!in || !(text << in.rdbuf())) {
    pacer::ExitWithError("pacer-probe", "--" + flag + " " + path + ": cannot read it");
  }
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr = "127.0.0.1:7070", service, tls_ca, tls_cert, tls_key, server_name;
  int64_t timeout_ms = 2000;
  bool plaintext = false;
  po::options_description desc("Options");
  desc.add_options()
      ("addr", po::value(&addr)->default_value(addr), "pacerd HOST:PORT")
      ("service", po::value(&service), "service name to check (default: the whole server)")
      ("tls-ca", po::value(&tls_ca), "CA certificate (PEM) that signed pacerd's certificate")
      ("tls-cert", po::value(&tls_cert), "client certificate (PEM), for an mTLS pacerd")
      ("tls-key", po::value(&tls_key), "client private key (PEM)")
      ("server-name", po::value(&server_name),
       "name to verify in pacerd's certificate (default: the host of --addr)")
      ("plaintext", po::bool_switch(&plaintext), "no TLS (pacerd on loopback without a certificate)")
      ("timeout-ms", po::value(&timeout_ms)->default_value(timeout_ms), "deadline of the check");
  pacer::ParseFlagsOrExit(argc, argv,
                          "Usage: pacer-probe [options]\n\n"
                          "Asks pacerd's gRPC health service once; exit 0 when it is SERVING.",
                          desc);
  if (timeout_ms <= 0 || timeout_ms > 600'000) {
    pacer::ExitWithError("pacer-probe", "--timeout-ms must be in 1..600000");
  }
  if (plaintext == !tls_ca.empty()) {
    pacer::ExitWithError("pacer-probe", "give exactly one of --tls-ca and --plaintext");
  }
  if (tls_cert.empty() != tls_key.empty()) {
    pacer::ExitWithError("pacer-probe", "--tls-cert and --tls-key go together");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments args;
  if (plaintext) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadOrExit("tls-ca", tls_ca);
    if (!tls_cert.empty()) {
      ssl.pem_cert_chain = ReadOrExit("tls-cert", tls_cert);
      ssl.pem_private_key = ReadOrExit("tls-key", tls_key);
    }
    creds = grpc::SslCredentials(ssl);
    if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
  }
  auto channel = grpc::CreateCustomChannel(addr, creds, args);
  grpc::GenericStub stub(channel);

  const std::string request = EncodeRequest(service);
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &reply,
                 [&](grpc::Status s) {
                   absl::MutexLock l(&mu);
                   status = std::move(s);
                   done = true;
                 });
  {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(&done));  // the call's own deadline bounds this wait
  }
  if (!status.ok()) {
    std::cerr << "pacer-probe: " << addr << ": health check failed: code " << status.error_code()
              << ": " << status.error_message() << std::endl;
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (reply.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const int health = DecodeStatus(bytes);
  if (health != 1) {
    std::cerr << "pacer-probe: " << addr << ": " << StatusName(health) << std::endl;
    return 1;
  }
  std::cout << "pacer-probe: " << addr << ": SERVING" << std::endl;
  return 0;
}
