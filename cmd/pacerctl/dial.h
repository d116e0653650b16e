// How pacerctl reaches pacerd: the address and token it uses (flags, then the environment),
// the one place its channel is created (Dial), and what it tells a person when a call fails.
//
// Exit codes (documented in --help and docs/configuration.md):
//   0 done; 1 pacerd refused or could not do it (the reason is printed); 2 bad usage;
//   3 cannot reach pacerd (not running, wrong address, no answer in time);
//   4 the token was refused (missing, wrong or not an admin token); 5 pacerd is older than
//   this pacerctl and lacks the call.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/tls.h"

namespace pacer::ctl {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailed = 1,
  kExitUsage = 2,
  kExitUnreachable = 3,
  kExitUnauthorized = 4,
  kExitTooOld = 5,
};

struct Target {
  std::string addr;            // HOST:PORT
  std::string token;           // admin (or job) token sent with every call
  std::chrono::milliseconds timeout{10'000};  // deadline of one call
  TlsClientOptions tls;        // --tls-ca/--tls-cert/--tls-key, PACER_TLS_* (common/tls.h)
};

// The channel to pacerd. Every pacerctl call goes through it. Plaintext to a non-loopback
// address without --allow-insecure, or a TLS file that is missing or wrong, prints the reason
// (naming the flag) and exits kExitUsage.
std::shared_ptr<grpc::Channel> Dial(const Target& target);

// A context with the token and the deadline.
std::unique_ptr<grpc::ClientContext> NewContext(const Target& target);

// A sentence for a person: what failed, the likely reason and the flag or variable to check.
std::string Explain(const grpc::Status& status, const Target& target, const std::string& what);
int ExitCodeFor(const grpc::Status& status);

// Prints "pacerctl: <Explain(...)>" and exits with ExitCodeFor(status).
[[noreturn]] void Fail(const grpc::Status& status, const Target& target, const std::string& what);

}  // namespace pacer::ctl
