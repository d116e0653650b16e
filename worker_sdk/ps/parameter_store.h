// ParameterStore: the rows one pacer-ps server holds (proto/pacer/ps.proto), with the
// server-side optimizers. Pure state: no RPC, no clock, no I/O; the gRPC adapter (ps_server.h)
// validates nothing itself and forwards here.
//
// Owns every table's rows (weights + Adagrad accumulators). A row starts from (table seed, key)
// deterministically, so every server and every restart initialises a key the same way. Only
// Push stores a row; Pull returns a missing row's initial value without storing it. Push sums
// duplicate keys' gradients, then applies one optimizer step per row: SGD w -= lr g; Adagrad
// a += g^2, w -= lr g / sqrt(a).
//
// Limits (ps_limits.h): a request over max_keys_per_request or max_values_per_request, a table
// past max_tables, a push whose new rows would pass a table's or the server's rows or bytes is
// RESOURCE_EXHAUSTED naming the flag, with nothing applied.
//
// Durability (pacer-ps --state-dir) is the caller's: Snapshot() copies every table (spec, push
// count, materialised rows with their optimizer state) into a PsSnapshot, Restore() loads one
// into an empty store; ps_snapshot.h writes and reads the file. Rows only pulled are not
// "changed" (they are re-created identically from (seed, key)); changes() counts the mutations
// (table created, push applied) so a caller can skip a snapshot when nothing changed.
//
// Thread-safe: one mutex per table (tables are only added, never removed); pulls and pushes of
// different tables do not contend. Snapshot() locks one table at a time, so it is consistent
// per table, not across tables (asynchronous training tolerates that, as it tolerates losing
// the pushes since the last snapshot).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/pacer/ps.pb.h"
#include "worker_sdk/ps/ps_limits.h"

namespace pacer {

class ParameterStore {
 public:
  // `limits` zero fields take their automatic values (PsLimits::Resolve; callers that take
  // limits from flags resolve and validate them first).
  explicit ParameterStore(PsLimits limits = {});

  // True when created, false when an identical table exists; ALREADY_EXISTS for a different
  // spec under the same name, INVALID_ARGUMENT for a bad spec.
  absl::StatusOr<bool> CreateTable(const PsTableSpec& spec);
  // Appends keys.size() x dim values to `values`. NOT_FOUND for an unknown table,
  // RESOURCE_EXHAUSTED over a per-request limit.
  absl::Status Pull(const std::string& table, absl::Span<const uint64_t> keys, std::vector<float>* values);
  // The same, into the room `out(n)` returns for n floats (called once, after every check): the
  // server writes straight into its reply.
  absl::Status PullInto(const std::string& table, absl::Span<const uint64_t> keys,
                        const std::function<float*(size_t)>& out);
  // Applies the optimizer; returns the table's push count. INVALID_ARGUMENT when the gradient
  // count is not keys.size() x dim or a gradient is not finite; RESOURCE_EXHAUSTED over a
  // limit (nothing applied).
  absl::StatusOr<uint64_t> Push(const std::string& table, absl::Span<const uint64_t> keys,
                                absl::Span<const float> gradients);
  uint64_t rows() const;
  uint64_t bytes() const { return bytes_.load(); }  // what the stored rows cost (RowBytes)
  const PsLimits& limits() const { return limits_; }

  // Copies every table, sorted by key within a table (a deterministic file for equal state).
  PsSnapshot Snapshot() const;
  // Loads `snapshot` into this store, which must hold no table (FAILED_PRECONDITION otherwise).
  // Validates everything first (specs as CreateTable, array sizes, finite values, no duplicate
  // key or table): INVALID_ARGUMENT names what is wrong and the store stays empty;
  // RESOURCE_EXHAUSTED when it holds more than the limits allow (raise them to load it).
  absl::Status Restore(const PsSnapshot& snapshot);
  // Mutations so far (tables created + pushes applied); grows monotonically.
  uint64_t changes() const { return changes_.load(); }

 private:
  struct Row {
    std::vector<float> w;
    std::vector<float> acc;  // Adagrad only
  };
  struct Table {
    explicit Table(PsTableSpec s) : spec(std::move(s)) {}
    const PsTableSpec spec;
    absl::Mutex mu;
    std::unordered_map<uint64_t, Row> rows ABSL_GUARDED_BY(mu);
    uint64_t pushes ABSL_GUARDED_BY(mu) = 0;
    uint64_t bytes ABSL_GUARDED_BY(mu) = 0;  // rows.size() x RowBytes
  };
  absl::StatusOr<Table*> Find(const std::string& name) const;
  static absl::Status ValidateSpec(const PsTableSpec& spec);
  static void InitialRow(const PsTableSpec& spec, uint64_t key, float* w);
  static Row NewRow(const PsTableSpec& spec, uint64_t key);
  absl::Status CheckRequest(const std::string& table, uint64_t keys, uint32_t dim) const;
  // Takes `rows` rows of `bytes` from the server-wide budget; RESOURCE_EXHAUSTED (nothing taken)
  // when that would pass max_server_rows / max_server_bytes.
  absl::Status Reserve(uint64_t rows, uint64_t bytes);

  PsLimits limits_;
  std::atomic<uint64_t> rows_{0}, bytes_{0};  // every table's stored rows and their bytes

  mutable absl::Mutex mu_;  // guards the map, not the tables
  std::map<std::string, std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> changes_{0};
};

// The server (0..num_servers-1) holding (table, key): a stable hash, the same in every process.
uint32_t PsServerFor(const std::string& table, uint64_t key, uint32_t num_servers);

}  // namespace pacer
