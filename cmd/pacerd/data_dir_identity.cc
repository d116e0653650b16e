#include "cmd/pacerd/data_dir_identity.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pacer {
namespace {

constexpr char kMagic[] = "pacer-data-dir-v1";

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(what + ": " + std::strerror(errno));
}

// Writes `bytes` to `path` and fsyncs it; O_APPEND when `append`.
absl::Status WriteSynced(const std::string& path, const std::string& bytes, bool append) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return Errno("cannot open '" + path + "'");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = Errno("cannot write '" + path + "'");
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = Errno("cannot fsync '" + path + "'");
    ::close(fd);
    return s;
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open '" + dir + "'");
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot fsync '" + dir + "'");
}

}  // namespace

bool DataDirIdentity::Has(const std::string& store) const {
  return std::find(stores.begin(), stores.end(), store) != stores.end();
}

DataDirIdentity NewDataDirIdentity(int64_t now_unix_ms, std::vector<std::string> stores) {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  DataDirIdentity id;
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  id.id = buf;
  id.created_unix_ms = now_unix_ms;
  id.stores = std::move(stores);
  return id;
}

absl::StatusOr<std::optional<DataDirIdentity>> ReadDataDirIdentity(const std::string& data_dir) {
  const std::string path = data_dir + "/" + kIdentityFile;
  std::ifstream in(path);
  if (!in) {
    if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::optional<DataDirIdentity>();
    return absl::UnavailableError("cannot read '" + path + "'");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError("the data dir identity '" + path + "' is damaged (" + why +
                               "); it says which stores must exist, so pacerd does not guess");
  };
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kMagic) return damaged("no '" + std::string(kMagic) + "' header");
  DataDirIdentity id;
  bool has_id = false, has_time = false, has_stores = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto eq = lines[i].find('=');
    if (eq == std::string::npos) return damaged("line '" + lines[i] + "'");
    const std::string key = lines[i].substr(0, eq), value = lines[i].substr(eq + 1);
    if (key == "id") {
      id.id = value;
      has_id = !value.empty();
    } else if (key == "created_unix_ms") {
      char* end = nullptr;
      id.created_unix_ms = std::strtoll(value.c_str(), &end, 10);
      has_time = end && *end == '\0' && !value.empty();
    } else if (key == "stores") {
      id.stores = absl::StrSplit(value, ',', absl::SkipEmpty());
      has_stores = true;
    }  // unknown keys: from a newer pacerd, ignored
  }
  if (!has_id || !has_time || !has_stores) return damaged("a field is missing");
  return std::optional<DataDirIdentity>(std::move(id));
}

absl::Status WriteDataDirIdentity(const std::string& data_dir, const DataDirIdentity& identity) {
  const std::string path = data_dir + "/" + kIdentityFile;
  const std::string text = absl::StrCat(kMagic, "\nid=", identity.id, "\ncreated_unix_ms=",
                                        identity.created_unix_ms, "\nstores=",
                                        absl::StrJoin(identity.stores, ","), "\n");
  if (absl::Status s = WriteSynced(path + ".tmp", text, false); !s.ok()) return s;
  if (::rename((path + ".tmp").c_str(), path.c_str()) != 0) return Errno("cannot rename to '" + path + "'");
  return SyncDir(data_dir);
}

absl::Status RecordAcceptedDataLoss(const std::string& data_dir, const std::string& line) {
  std::string one = line;
  std::replace(one.begin(), one.end(), '\n', ' ');
  if (absl::Status s = WriteSynced(data_dir + "/" + kDataLossFile, one + "\n", true); !s.ok()) return s;
  return SyncDir(data_dir);
}

}  // namespace pacer
