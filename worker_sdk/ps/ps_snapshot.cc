#include "worker_sdk/ps/ps_snapshot.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pacer {
namespace {

constexpr char kMagic[8] = {'P', 'A', 'C', 'E', 'R', 'P', 'S', '1'};
constexpr size_t kHeader = 8 + 8 + 4;

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(what + ": " + std::strerror(errno));
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write " + path);
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t Crc32c(const std::string& data) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

absl::Status WritePsSnapshot(const std::string& path, const PsSnapshot& snapshot) {
  std::string payload;
  if (!snapshot.SerializeToString(&payload)) {
    return absl::InternalError("cannot serialize the snapshot for " + path + " (over 2 GiB?)");
  }
  std::string data(kMagic, sizeof(kMagic));
  PutLe(&data, payload.size(), 8);
  PutLe(&data, Crc32c(payload), 4);
  data += payload;
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open " + tmp);
  absl::Status s = WriteAll(fd, data, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("fsync " + tmp);
  if (::close(fd) != 0 && s.ok()) s = Errno("close " + tmp);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) s = Errno("rename " + tmp + " to " + path);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // The rename is durable once the directory is.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PsSnapshot>> ReadPsSnapshot(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    if (!std::filesystem::exists(path)) return std::optional<PsSnapshot>();
    return absl::PermissionDeniedError("cannot read the snapshot " + path);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string data = ss.str();
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError("snapshot " + path + " is corrupt (" + why +
                               "); refusing to load it -- move it away to start empty");
  };
  if (data.size() < kHeader) return corrupt("shorter than its header: " + std::to_string(data.size()) + " bytes");
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) return corrupt("not a pacer-ps snapshot: bad magic");
  const uint64_t len = GetLe(data, 8, 8);
  if (len != data.size() - kHeader) {
    return corrupt("header says " + std::to_string(len) + " payload bytes, the file holds " +
                   std::to_string(data.size() - kHeader) + ": torn write?");
  }
  const std::string payload = data.substr(kHeader);
  if (static_cast<uint32_t>(GetLe(data, 16, 4)) != Crc32c(payload)) return corrupt("checksum mismatch");
  PsSnapshot snap;
  if (!snap.ParseFromString(payload)) return corrupt("payload does not parse");
  return std::optional<PsSnapshot>(std::move(snap));
}

}  // namespace pacer
