#include "common/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/status/status.h"

namespace pacer {
namespace {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

constexpr std::string_view kCredentialPrefix = "pacer-cred-v1:";
constexpr size_t kMacHexDigits = 64;

std::string Hex(const unsigned char* bytes, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 15]);
  }
  return out;
}

// HMAC-SHA256 under the job token of "pacer-cred-v1\n<kind>\n<id>", as hex.
std::string CredentialMac(const std::string& job_token, std::string_view kind, std::string_view id) {
  std::string message = "pacer-cred-v1\n";
  message.append(kind);
  message.push_back('\n');
  message.append(id);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), job_token.data(), static_cast<int>(job_token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return Hex(mac, len);
}

Principal::Kind PrincipalKindOf(CredentialKind kind) {
  switch (kind) {
    case CredentialKind::kWorker: return Principal::Kind::kWorker;
    case CredentialKind::kChief: return Principal::Kind::kChief;
    case CredentialKind::kAgent: return Principal::Kind::kAgent;
    case CredentialKind::kServer: return Principal::Kind::kServer;
  }
  return Principal::Kind::kWorker;
}

}  // namespace

const char* RoleName(Role role) { return role == Role::kAdmin ? "admin" : "worker"; }

const char* CredentialKindName(CredentialKind kind) {
  switch (kind) {
    case CredentialKind::kWorker: return "worker";
    case CredentialKind::kChief: return "chief";
    case CredentialKind::kAgent: return "agent";
    case CredentialKind::kServer: return "server";
  }
  return "worker";
}

absl::StatusOr<CredentialKind> ParseCredentialKind(std::string_view name) {
  for (CredentialKind k : {CredentialKind::kWorker, CredentialKind::kChief, CredentialKind::kAgent,
                           CredentialKind::kServer}) {
    if (name == CredentialKindName(k)) return k;
  }
  return absl::InvalidArgumentError("unknown credential kind '" + std::string(name) +
                                    "' (worker, chief, agent or server)");
}

absl::StatusOr<std::string> MintCredential(const std::string& job_token, CredentialKind kind,
                                           const std::string& id) {
  if (job_token.empty()) return absl::InvalidArgumentError("cannot mint a credential: no job token");
  if (IsCredential(job_token)) {
    return absl::InvalidArgumentError(
        "cannot mint a credential from a credential: minting needs the job token itself");
  }
  if (id.empty()) return absl::InvalidArgumentError("cannot mint a credential for an empty id");
  if (id.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("a credential id cannot hold a line break");
  }
  const char* k = CredentialKindName(kind);
  return std::string(kCredentialPrefix) + k + ":" + id + ":" + CredentialMac(job_token, k, id);
}

bool IsCredential(std::string_view token) {
  return token.substr(0, kCredentialPrefix.size()) == kCredentialPrefix;
}

bool Principal::MayActAsWorker(std::string_view worker_id) const {
  if (unrestricted()) return true;
  return (kind == Kind::kWorker || kind == Kind::kChief) && id == worker_id;
}

bool Principal::MaySpeakForNode(std::string_view node) const {
  if (unrestricted()) return true;
  return kind == Kind::kAgent && id == node;
}

std::string Principal::Describe() const {
  switch (kind) {
    case Kind::kAdmin: return "the admin token";
    case Kind::kLauncher: return "the job token";
    case Kind::kWorker: return "the worker credential of '" + id + "'";
    case Kind::kChief: return "the chief credential of '" + id + "'";
    case Kind::kAgent: return "the agent credential of node '" + id + "'";
    case Kind::kServer: return "the server credential of '" + id + "'";
  }
  return "an unknown principal";
}

Authenticator::Authenticator(std::string job_token, std::string admin_token)
    : job_token_(std::move(job_token)), admin_token_(std::move(admin_token)) {}

absl::StatusOr<Principal> Authenticator::IdentifyToken(std::string_view token) const {
  if (!admin_token_.empty() && ConstantTimeEquals(token, admin_token_)) {
    return Principal{Principal::Kind::kAdmin, ""};
  }
  if (!job_token_.empty() && ConstantTimeEquals(token, job_token_)) {
    return Principal{Principal::Kind::kLauncher, ""};
  }
  if (IsCredential(token) && !job_token_.empty()) {
    std::string_view rest = token.substr(kCredentialPrefix.size());
    const size_t colon = rest.find(':');
    const size_t last = rest.rfind(':');
    if (colon == std::string_view::npos || last == colon || rest.size() - last - 1 != kMacHexDigits) {
      return absl::UnauthenticatedError("malformed credential");
    }
    auto kind = ParseCredentialKind(rest.substr(0, colon));
    if (!kind.ok()) return absl::UnauthenticatedError("malformed credential");
    std::string_view id = rest.substr(colon + 1, last - colon - 1);
    std::string_view mac = rest.substr(last + 1);
    if (id.empty()) return absl::UnauthenticatedError("malformed credential");
    if (!ConstantTimeEquals(mac, CredentialMac(job_token_, CredentialKindName(*kind), id))) {
      return absl::UnauthenticatedError("invalid credential (not minted under this job's token)");
    }
    return Principal{PrincipalKindOf(*kind), std::string(id)};
  }
  return absl::UnauthenticatedError("invalid token");
}

absl::StatusOr<Principal> Authenticator::Identify(const Metadata& metadata) const {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kPrefix = "Bearer ";
  if (value.substr(0, kPrefix.size()) != kPrefix) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  return IdentifyToken(value.substr(kPrefix.size()));
}

absl::StatusOr<Role> Authenticator::Authenticate(const Metadata& metadata) const {
  auto p = Identify(metadata);
  if (!p.ok()) return p.status();
  return p->admin() ? Role::kAdmin : Role::kWorker;
}

absl::Status Authenticator::Require(const Metadata& metadata, Role required) const {
  auto role = Authenticate(metadata);
  if (!role.ok()) return role.status();
  if (static_cast<int>(*role) < static_cast<int>(required)) {
    return absl::PermissionDeniedError(std::string("this call needs the ") + RoleName(required) +
                                       " token");
  }
  return absl::OkStatus();
}

absl::Status Authenticator::RequireWorker(const Metadata& metadata, std::string_view worker_id,
                                          std::string_view what) const {
  auto p = Identify(metadata);
  if (!p.ok()) return p.status();
  if (p->MayActAsWorker(worker_id)) return absl::OkStatus();
  return absl::PermissionDeniedError(std::string(what) + ": " + p->Describe() +
                                     " cannot act as worker '" + std::string(worker_id) + "'");
}

absl::Status Authenticator::RequireNode(const Metadata& metadata, std::string_view node,
                                        std::string_view what) const {
  auto p = Identify(metadata);
  if (!p.ok()) return p.status();
  if (p->MaySpeakForNode(node)) return absl::OkStatus();
  return absl::PermissionDeniedError(std::string(what) + ": " + p->Describe() +
                                     " cannot speak for node '" + std::string(node) + "'");
}

absl::Status Authenticator::RequireChief(const Metadata& metadata, std::string_view what) const {
  auto p = Identify(metadata);
  if (!p.ok()) return p.status();
  if (p->chief()) return absl::OkStatus();
  return absl::PermissionDeniedError(std::string(what) + " needs the chief credential (rank 0), "
                                     "the job token or the admin token, not " + p->Describe());
}

absl::Status Authenticator::RequireWorkerSide(const Metadata& metadata, std::string_view what) const {
  auto p = Identify(metadata);
  if (!p.ok()) return p.status();
  if (p->worker_side()) return absl::OkStatus();
  return absl::PermissionDeniedError(std::string(what) + " needs a worker credential, the job token or "
                                     "the admin token, not " + p->Describe());
}

absl::Status Authenticator::RequireToken(const Metadata& metadata, std::string_view what) const {
  auto p = Identify(metadata);
  if (!p.ok()) return p.status();
  if (p->unrestricted()) return absl::OkStatus();
  return absl::PermissionDeniedError(std::string(what) + " needs the job token or the admin token, not " +
                                     p->Describe());
}

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  context->AddMetadata("authorization", "Bearer " + token);
}

std::string GenerateToken() {
  unsigned char bytes[32];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    std::random_device rd;  // fallback; still a CSPRNG on Linux
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  return Hex(bytes, sizeof(bytes));
}

absl::StatusOr<std::string> LoadToken(const std::string& path, bool create) {
  std::ifstream in(path);
  if (in) {
    // Like ssh with a private key: a secret others can read (or anyone but its owner and group
    // can change) is refused. Group-read stays allowed (a Kubernetes Secret mounted with fsGroup).
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        (st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP)) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return absl::PermissionDeniedError("token file '" + path + "' is accessible by other users (mode " +
                                         mode + "): chmod 600 '" + path + "'");
    }
    std::string token;
    std::getline(in, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    if (token.empty()) return absl::InvalidArgumentError("token file '" + path + "' is empty");
    return token;
  }
  if (!create) return absl::NotFoundError("token file '" + path + "' not found");
  std::string token = GenerateToken();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return absl::UnavailableError("cannot create token file '" + path + "'");
  std::string line = token + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ok = ::fsync(fd) == 0 && ok;
  ::close(fd);
  if (!ok) return absl::UnavailableError("cannot write token file '" + path + "'");
  return token;
}

}  // namespace pacer
