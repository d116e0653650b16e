// TLS for every Pacer client and server: one seam that turns certificate files into gRPC
// credentials (docs/tls.md).
//
// Clients (pacerctl, the C++/C/Python SDK, pacer-agent, pacer-consume, the trainers, the
// pacer-ps client) describe TLS with TlsClientOptions, filled from flags (AddTlsClientFlags) and
// then from the environment (FillFromEnvironment):
//   --tls-ca          PACER_TLS_CA           CA bundle that signs the server certificate
//   --tls-cert        PACER_TLS_CERT         client certificate (mTLS), with --tls-key
//   --tls-key         PACER_TLS_KEY          client private key (mTLS)
//   --tls-server-name PACER_TLS_SERVER_NAME  name to check in the server certificate (default:
//                                            the host of the address)
//   --allow-insecure  PACER_ALLOW_INSECURE=1 plaintext to a non-loopback address (tokens in
//                                            clear text; never in production)
// TLS is on when any of CA / cert / key is set. Without TLS a client dials only a loopback
// address (IsLoopbackTarget); anything else is refused with an error naming the flag and the
// variable to set.
//
// Servers (pacerd, pacer-ps) describe TLS with TlsServerOptions (--tls-cert, --tls-key,
// --tls-client-ca for mTLS). Without cert and key they serve plaintext only on loopback unless
// allow_insecure; a client CA alone is refused (it would silently serve plaintext).
//
// Rotation: both sides hand the files to gRPC's FileWatcherCertificateProvider, which re-reads
// them every reload_interval_s (1 s at least); a new certificate is served (or presented) on the
// next handshake without a restart. Replace files atomically (write aside, rename), key first.
// Every file is checked once when the credentials are made (readable, PEM, key matches
// certificate) so a mistake is an error at start naming the file, not a failed handshake later.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace boost::program_options {
class options_description;
}

namespace pacer {

struct TlsClientOptions {
  std::string ca_file;      // PEM CA bundle; empty with TLS on: the system's roots
  std::string cert_file;    // client certificate chain (mTLS); needs key_file
  std::string key_file;     // client private key (mTLS); needs cert_file
  std::string server_name;  // overrides the name checked in the server certificate
  bool allow_insecure = false;  // plaintext also off loopback
  int reload_interval_s = 10;   // how often the files are re-read (>= 1)

  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
  // Fills empty fields from PACER_TLS_CA / _CERT / _KEY / _SERVER_NAME; allow_insecure from
  // PACER_ALLOW_INSECURE ("1", "true", "yes"). Explicit fields (flags) win.
  void FillFromEnvironment();
};

// Adds --tls-ca, --tls-cert, --tls-key, --tls-server-name and --allow-insecure (the last only
// when `with_allow_insecure`: a binary that already has its own --allow-insecure passes false
// and copies it in).
void AddTlsClientFlags(boost::program_options::options_description& desc, TlsClientOptions* o,
                       bool with_allow_insecure = true);

// The credentials to dial `target` (host:port, [v6]:port, or a gRPC target such as
// dns:///host:port, ipv4:..., unix:...). INVALID_ARGUMENT for plaintext to a non-loopback
// target without allow_insecure, for a cert without a key (or the reverse), for a file that is
// unreadable or not the PEM it should be, or a key that does not match its certificate.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientOptions& o, const std::string& target);

// Adds what TLS needs in the channel arguments (the server name override); a no-op without TLS.
void ApplyTlsChannelArgs(const TlsClientOptions& o, grpc::ChannelArguments* args);

// ClientTarget (common/net.h) of a client's pacerd address; for a list of addresses also sets
// the channel's authority to the first one (TLS checks the server certificate against it unless
// --tls-server-name names another).
absl::StatusOr<std::string> PrepareTarget(const std::string& address, grpc::ChannelArguments* args);

// PrepareTarget + MakeChannelCredentials + ApplyTlsChannelArgs + grpc::CreateCustomChannel.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialChannel(const std::string& target,
                                                           const TlsClientOptions& o,
                                                           grpc::ChannelArguments args = {});

// True when every address `target` names is loopback (IsLoopbackHost) or a unix socket.
bool IsLoopbackTarget(const std::string& target);

struct TlsServerOptions {
  std::string cert_file, key_file;  // TLS when both are set
  std::string client_ca_file;       // mTLS: clients must present a certificate it signed
  bool allow_insecure = false;      // plaintext on a non-loopback address
  int reload_interval_s = 10;       // how often the files are re-read (>= 1)
};

// The credentials to listen on `listen_host`. `binary` names the program in errors
// ("pacerd", "pacer-ps"); plaintext off loopback is refused naming --tls-cert/--tls-key and
// --allow-insecure. A plaintext listener is logged at WARNING.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerOptions& o, const std::string& listen_host, const std::string& binary);

// Checks a PEM certificate file (at least one certificate) and, when key_file is not empty, that
// the PEM private key in it matches the first certificate. `what` names the flag in errors.
absl::Status CheckCertificateFiles(const std::string& cert_file, const std::string& key_file,
                                   const std::string& what);

}  // namespace pacer
