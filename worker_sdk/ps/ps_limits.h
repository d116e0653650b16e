// PsLimits: how much one pacer-ps server lets its clients make it hold (docs/tls.md has the
// security side; the flags are in docs/configuration.md).
//
// Every limit a client can reach is here and answered with RESOURCE_EXHAUSTED naming the flag:
//   per request  keys (max_keys_per_request) and keys x dim values (max_values_per_request), for
//                Pull and Push alike; a request over either is refused before any work.
//   per table    rows (max_table_rows) and bytes (max_table_bytes)
//   per server   tables (max_tables), rows (max_server_rows) and bytes (max_server_bytes)
// Rows are created only by Push, and only within the limits: a push whose new rows would pass
// one is refused whole (nothing applied). A Pull never creates rows: a missing row is returned
// as its deterministic initial value (seed, key) without being stored.
//
// Bytes count a row's floats (dim x 4, twice for Adagrad) plus kRowOverheadBytes for the hash
// map node and vectors around them, so max_server_bytes tracks the process's real growth.
// max_server_bytes = 0 means "auto": a quarter of the memory this process may use (its cgroup's
// memory limit, v1 or v2, else the machine's RAM), leaving room for a snapshot's copy and the
// requests in flight.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace pacer {

struct PsLimits {
  uint64_t max_keys_per_request = 1u << 20;    // 1 Mi keys
  uint64_t max_values_per_request = 4u << 20;  // 4 Mi floats (16 MiB) per Pull or Push
  uint64_t max_tables = 1024;
  uint64_t max_table_rows = 1ull << 26;        // 64 Mi rows
  uint64_t max_table_bytes = 0;                // 0: max_server_bytes
  uint64_t max_server_rows = 1ull << 27;       // 128 Mi rows
  uint64_t max_server_bytes = 0;               // 0: auto (above)

  // Fills the automatic values (max_server_bytes, max_table_bytes) and checks every limit is
  // > 0 and consistent (INVALID_ARGUMENT naming the flag).
  absl::Status Resolve();
};

// What one row of `dim` floats costs (weights, Adagrad accumulators, overhead).
constexpr uint64_t kRowOverheadBytes = 128;
inline uint64_t RowBytes(uint32_t dim, bool adagrad) {
  return static_cast<uint64_t>(dim) * sizeof(float) * (adagrad ? 2 : 1) + kRowOverheadBytes;
}

// The memory this process may use: the lowest memory limit of its cgroup and the cgroup's
// ancestors (cgroup v1 memory.limit_in_bytes or v2 memory.max), else the machine's RAM.
uint64_t ProcessMemoryLimitBytes();

}  // namespace pacer
