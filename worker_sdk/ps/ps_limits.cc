#include "worker_sdk/ps/ps_limits.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace pacer {
namespace {

// The number in a cgroup limit file; 0 for "max", a missing file or garbage.
uint64_t ReadLimit(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return 0;
  uint64_t v = 0;
  for (char c : word) {
    if (c < '0' || c > '9') return 0;
    if (v > (UINT64_MAX - 9) / 10) return 0;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

// The lowest limit in `file` of cgroup `path` under `root` and of its ancestors (0: none).
uint64_t LowestLimit(const std::string& root, std::string path, const std::string& file) {
  uint64_t lowest = 0;
  for (;;) {
    const uint64_t v = ReadLimit(root + path + "/" + file);
    if (v > 0 && (lowest == 0 || v < lowest)) lowest = v;
    if (path.empty() || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos ? "" : path.substr(0, slash);
  }
  return lowest;
}

}  // namespace

uint64_t ProcessMemoryLimitBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const uint64_t ram = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  uint64_t limit = ram;
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    // "<id>:<controllers>:<path>": v1 "7:memory:/a/b", v2 "0::/a/b"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    uint64_t v = 0;
    std::stringstream list(controllers);
    std::string c;
    bool memory = false;
    while (std::getline(list, c, ',')) memory = memory || c == "memory";
    if (memory) v = LowestLimit("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes");
    else if (controllers.empty()) v = LowestLimit("/sys/fs/cgroup", path, "memory.max");
    if (v > 0 && (limit == 0 || v < limit)) limit = v;  // v1's "no limit" is a huge number: ram wins
  }
  return limit;
}

absl::Status PsLimits::Resolve() {
  if (max_server_bytes == 0) {
    const uint64_t memory = ProcessMemoryLimitBytes();
    max_server_bytes = std::max<uint64_t>(memory / 4, 64ull << 20);
  }
  if (max_table_bytes == 0) max_table_bytes = max_server_bytes;
  auto positive = [](uint64_t v, const char* flag) {
    return v > 0 ? absl::OkStatus() : absl::InvalidArgumentError(std::string(flag) + " must be > 0");
  };
  for (absl::Status s : {positive(max_keys_per_request, "--max-keys-per-request"),
                         positive(max_values_per_request, "--max-values-per-request"),
                         positive(max_tables, "--max-tables"), positive(max_table_rows, "--max-table-rows"),
                         positive(max_server_rows, "--max-server-rows")}) {
    if (!s.ok()) return s;
  }
  if (max_values_per_request > (64ull << 20) / sizeof(float)) {
    return absl::InvalidArgumentError(
        "--max-values-per-request must be at most 16777216 (64 MiB of floats, gRPC's message cap here)");
  }
  if (max_keys_per_request > (64ull << 20) / sizeof(uint64_t)) {
    return absl::InvalidArgumentError("--max-keys-per-request must be at most 8388608 (64 MiB of keys)");
  }
  if (max_table_bytes > max_server_bytes) {
    return absl::InvalidArgumentError("--max-table-bytes (" + std::to_string(max_table_bytes) +
                                      ") must not exceed --max-server-bytes (" +
                                      std::to_string(max_server_bytes) + ")");
  }
  if (max_table_rows > max_server_rows) {
    return absl::InvalidArgumentError("--max-table-rows must not exceed --max-server-rows");
  }
  return absl::OkStatus();
}

}  // namespace pacer
