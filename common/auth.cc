#include "common/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "absl/status/status.h"

namespace pacer {
namespace {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

const char* RoleName(Role role) { return role == Role::kAdmin ? "admin" : "worker"; }

Authenticator::Authenticator(std::string job_token, std::string admin_token)
    : job_token_(std::move(job_token)), admin_token_(std::move(admin_token)) {}

absl::StatusOr<Role> Authenticator::Authenticate(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kPrefix = "Bearer ";
  if (value.substr(0, kPrefix.size()) != kPrefix) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  std::string_view token = value.substr(kPrefix.size());
  if (!admin_token_.empty() && ConstantTimeEquals(token, admin_token_)) return Role::kAdmin;
  if (!job_token_.empty() && ConstantTimeEquals(token, job_token_)) return Role::kWorker;
  return absl::UnauthenticatedError("invalid token");
}

absl::Status Authenticator::Require(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata, Role required) const {
  auto role = Authenticate(metadata);
  if (!role.ok()) return role.status();
  if (static_cast<int>(*role) < static_cast<int>(required)) {
    return absl::PermissionDeniedError(std::string("this call needs the ") + RoleName(required) +
                                       " token");
  }
  return absl::OkStatus();
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
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::StatusOr<std::string> LoadToken(const std::string& path, bool create) {
  std::ifstream in(path);
  if (in) {
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
