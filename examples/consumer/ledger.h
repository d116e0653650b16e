// Ledger: a consumer's append-only record of the data it was given and what was counted done.
//
// Lines (text, one write(2) each, so a SIGKILL never leaves half a line):
//   L <lease> <epoch> <b>-<e>,<b>-<e>,... [ds=<dataset> part=<p> pos=<begin>-<end> start=<n>
//     backup=1]                              a lease and its record ids in delivery order
//   I <lease> <prefix>                       about to report `prefix` records of the lease done
//   A <lease> <prefix>                       the server acknowledged: `prefix` records done
// The key=value fields of an L line (written since tail backups) say where the lease lies in
// its epoch: its positions [begin, end) of partition p, the done prefix it was handed out with
// (`start`, records someone else counted) and whether it is a tail backup; readers ignore keys
// they do not know, and a line without them is read as before (start 0, no pair).
// A worker killed between I and A does not know whether its report landed; when it restarts,
// its registration lists the remembered leases of its earlier incarnations with their final
// done prefix (also when a process registered in between and died before resolving), and it
// appends the A line from that (Resolve).
//
// What a lease counted is the records of its positions [begin + start, begin + max(A)). A tail
// backup K re-leases the unconsumed suffix [b', end) of another worker's lease P (same epoch,
// partition and end, b' = P's done position then) and both go on; the sharding service counts
// a position of the pair once, when the first of them passes it (ShardingState::AdvanceDone:
// the pair's counted position is the larger of their done positions; the survivor of a failed
// partner skips what the partner counted). So a pair (P with each of its backups) counts the
// union of its members' position ranges, not their sum: ForEachCountedRange resolves pairs.
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
  // From the L line's key=value fields; has_position is false for ledgers written before them.
  bool has_position = false;
  std::string dataset;
  uint32_t partition = 0;
  uint64_t begin = 0, end = 0;  // positions [begin, end) of the epoch
  uint64_t start = 0;           // done prefix when handed out (counted by another lease)
  bool backup = false;          // a tail backup of another worker's lease
};

// Parses a ledger; INVALID_ARGUMENT names the line on garbage.
absl::StatusOr<std::map<uint64_t, LedgerLease>> ReadLedger(const std::string& path);

// Reads and merges the ledgers of every consumer of a job (lease ids are job-wide), so that a
// backup pair held by two consumers is resolved. INVALID_ARGUMENT on garbage or when two
// ledgers hold the same lease.
absl::StatusOr<std::map<uint64_t, LedgerLease>> ReadLedgers(const std::vector<std::string>& paths);

// Appends A lines for leases whose last intent was never acknowledged, using the final done
// prefix the server reported at registration. Returns how many were resolved.
int ResolvePendingIntents(const std::string& path, const RegisterWorkerResponse& registration,
                          LedgerWriter& writer);

// Calls fn(epoch, record_begin, record_end) for every record range counted done: each backup
// pair once (the union of what its members counted; pass the merged ledgers of all consumers,
// ReadLedgers, or a pair split over two ledgers counts twice).
void ForEachCountedRange(const std::map<uint64_t, LedgerLease>& ledger,
                         const std::function<void(uint32_t, uint64_t, uint64_t)>& fn);

}  // namespace pacer
