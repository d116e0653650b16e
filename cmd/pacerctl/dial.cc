#include "cmd/pacerctl/dial.h"

#include <cstdlib>
#include <iostream>

#include "common/auth.h"
#include "common/version.h"

namespace pacer::ctl {
namespace {

bool Contains(const std::string& text, const char* needle) {
  return text.find(needle) != std::string::npos;
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "OK";
  }
}

// gRPC's connect failures read "failed to connect to all addresses; last error: UNKNOWN:
// ipv4:127.0.0.1:7070: Failed to connect to remote host: Connection refused".
bool IsConnectFailure(const grpc::Status& s) {
  const std::string& m = s.error_message();
  // Something that is not a gRPC server (a web server, a proxy) answered with an HTTP status.
  if (Contains(m, "http2 header with status")) return true;
  return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         (Contains(m, "failed to connect") || Contains(m, "Failed to connect") ||
          Contains(m, "DNS resolution failed") || Contains(m, "Connection refused") ||
          Contains(m, "Socket closed") || Contains(m, "Connection reset") ||
          Contains(m, "Handshake") || Contains(m, "handshake") || Contains(m, "Endpoint"));
}

}  // namespace

std::shared_ptr<grpc::Channel> Dial(const Target& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);  // a report's timeline can reach a few MB
  auto channel = DialChannel(target.addr, target.tls, args);
  if (!channel.ok()) {
    std::cerr << "pacerctl: " << channel.status().message() << std::endl;
    std::exit(kExitUsage);
  }
  return *channel;
}

std::unique_ptr<grpc::ClientContext> NewContext(const Target& target) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!target.token.empty()) AttachToken(ctx.get(), target.token);
  ctx->set_deadline(std::chrono::system_clock::now() + target.timeout);
  return ctx;
}

int ExitCodeFor(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::OK: return kExitOk;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return kExitUnreachable;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED: return kExitUnauthorized;
    case grpc::StatusCode::UNIMPLEMENTED: return IsConnectFailure(s) ? kExitUnreachable : kExitTooOld;
    case grpc::StatusCode::UNAVAILABLE: return IsConnectFailure(s) ? kExitUnreachable : kExitFailed;
    default: return kExitFailed;
  }
}

std::string Explain(const grpc::Status& s, const Target& t, const std::string& what) {
  const std::string& m = s.error_message();
  const std::string where = "pacerd at " + t.addr;
  const std::string check = " (--addr, PACER_ADDR)";
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return "cannot reach " + where + ": no answer within " +
           std::to_string(t.timeout.count() / 1000.0).substr(0, 4) +
           " s — is the address right and pacerd running?" + check;
  }
  if (IsConnectFailure(s)) {
    std::string why = "it does not answer";
    if (Contains(m, "http2 header with status")) {
      return "cannot reach pacerd at " + t.addr + ": something else answers there (" + m +
             ") — is the address right?" + check;
    }
    if (Contains(m, "Connection refused")) why = "connection refused";
    else if (Contains(m, "DNS resolution failed")) why = "the host name does not resolve";
    else if (Contains(m, "andshake")) why = "the TLS handshake failed (does pacerd use TLS?)";
    else if (Contains(m, "Socket closed") || Contains(m, "Connection reset"))
      why = "the connection was closed (TLS on one side only?)";
    return "cannot reach " + where + ": " + why + " — is it running?" + check;
  }
  switch (s.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return where + " refused the token for " + what + ": " + m +
             " (the admin token: --token-file, PACER_TOKEN_FILE, PACER_ADMIN_TOKEN, or --data-dir "
             "of pacerd's data dir)";
    case grpc::StatusCode::UNIMPLEMENTED:
      return where + " does not know " + what + ": it is older than this pacerctl (" +
             PacerVersion() + "), or not pacerd (" + m + ")";
    default:
      return what + ": " + m + " (" + CodeName(s.error_code()) + ")";
  }
}

void Fail(const grpc::Status& s, const Target& t, const std::string& what) {
  std::cerr << "pacerctl: " << Explain(s, t, what) << std::endl;
  std::exit(ExitCodeFor(s));
}

}  // namespace pacer::ctl
