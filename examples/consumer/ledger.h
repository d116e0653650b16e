// Ledger: a consumer's append-only record of the data it was given and what was counted done.
//
// Lines (text, one write(2) each, so a SIGKILL never leaves half a line):
//   L <lease> <epoch> <b>-<e>,<b>-<e>,...   a lease and its record ids in delivery order
//   I <lease> <prefix>                       about to report `prefix` records of the lease done
//   A <lease> <prefix>                       the server acknowledged: `prefix` records counted
// A worker killed between I and A does not know whether its report landed; when it restarts,
// its registration lists its previous leases with their final done prefix, and it appends the
// A line from that (Resolve). The records a lease counted are the first max(A) of its ids.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/pacer/sharding.pb.h"

namespace pacer {

class LedgerWriter {
 public:
  static absl::StatusOr<LedgerWriter> Open(const std::string& path);
  LedgerWriter(LedgerWriter&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ~LedgerWriter();
  void Leased(const Lease& lease);
  void Intent(uint64_t lease, uint64_t prefix);
  void Ack(uint64_t lease, uint64_t prefix);

 private:
  explicit LedgerWriter(int fd) : fd_(fd) {}
  void Write(const std::string& line);
  int fd_;
};

struct LedgerLease {
  uint32_t epoch = 0;
  std::vector<std::pair<uint64_t, uint64_t>> records;  // ranges in delivery order
  uint64_t intent = 0;  // highest I
  uint64_t acked = 0;   // highest A
};

// Parses a ledger; INVALID_ARGUMENT names the line on garbage.
absl::StatusOr<std::map<uint64_t, LedgerLease>> ReadLedger(const std::string& path);

// Appends A lines for leases whose last intent was never acknowledged, using the final done
// prefix the server reported at registration. Returns how many were resolved.
int ResolvePendingIntents(const std::string& path, const RegisterWorkerResponse& registration,
                          LedgerWriter& writer);

// Calls fn(epoch, record_begin, record_end) for every record range counted done.
void ForEachCountedRange(const std::map<uint64_t, LedgerLease>& ledger,
                         const std::function<void(uint32_t, uint64_t, uint64_t)>& fn);

}  // namespace pacer
