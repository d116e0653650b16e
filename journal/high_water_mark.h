// HighWaterMark: a journal's durable high-water mark file (`<dir>.hwm`, beside the RocksDB
// folder): the highest update seq known durable in the log. RocksLog writes it after a group's
// synced write and before the group is acknowledged, so the mark is never below an
// acknowledged update and never above what the log holds durably; on open, a log that recovers
// less than its mark has lost acknowledged updates (a WAL cut back by any amount, a deleted
// folder), which a torn last record — never acknowledged, never marked — cannot be.
//
// Format v2 (pacer-journal-hwm-v2): 8 KiB, two slots of 4 KiB (one file-system block each),
// each one line followed by NUL padding:
//   "pacer-journal-hwm-v2 gen=<20 digits> seq=<20 digits> crc=<8 hex digits>\n"
// where crc is the CRC-32C of the line up to (not including) " crc=". The mark is the seq of
// the valid slot with the higher gen. Advance() writes the new mark in place into the *other*
// slot (pwrite + fdatasync: no rename, no directory fsync) with gen + 1, so a write torn by a
// power loss damages only the slot being written — whose group was never acknowledged — and
// the previous mark survives in the other. Create() writes a whole new file (both slots
// equal) as temp file + fsync + rename + directory fsync: at every open, which is also how a
// v1 mark is upgraded and how a mark is lowered when an operator accepts a loss.
// Format v1 (pacer-journal-hwm-v1, written before): one line "pacer-journal-hwm-v1 seq=N\n",
// replaced whole every 100 ms; read, and replaced by v2 at the open.
// Read() refuses a mark in another version ("pacer-journal-hwm-v3": a newer pacerd) with
// FAILED_PRECONDITION naming both, and a file with no valid slot with DATA_LOSS naming it.
//
// Not thread-safe: the owner serialises calls (RocksLog: hwm_mu_). All I/O goes through the
// given file system (tests inject a fault-injecting one).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace rocksdb {
class FileSystem;
class FSRandomRWFile;
}  // namespace rocksdb

namespace pacer {

inline constexpr char kHwmFormatV1[] = "pacer-journal-hwm-v1";
inline constexpr char kHwmFormatV2[] = "pacer-journal-hwm-v2";

class HighWaterMark {
 public:
  struct Found {
    uint64_t seq = 0;
    std::string format;  // kHwmFormatV1 or kHwmFormatV2
    bool torn = false;   // v2: one slot did not verify (a torn write); the other holds the mark
  };
  // The mark at `path`: nullopt when there is no file.
  static absl::StatusOr<std::optional<Found>> Read(rocksdb::FileSystem* fs, const std::string& path);
  // Replaces the file at `path` by a v2 mark holding `seq` (durably: temp file, fsync, rename,
  // directory fsync) and opens it for Advance().
  static absl::StatusOr<std::unique_ptr<HighWaterMark>> Create(rocksdb::FileSystem* fs,
                                                               const std::string& path, uint64_t seq);
  ~HighWaterMark();

  // Makes `seq` the mark, durably, in place (the other slot; pwrite + fdatasync). After a
  // failure the previous mark still holds, and the next call writes the same slot again.
  absl::Status Advance(uint64_t seq);
  uint64_t seq() const { return seq_; }

  // One slot's bytes (the line and its padding), for tests that damage a slot.
  static std::string SlotForTest(uint64_t gen, uint64_t seq);
  static constexpr uint64_t kSlotBytes = 4096;

 private:
  HighWaterMark(std::string path, std::unique_ptr<rocksdb::FSRandomRWFile> file, uint64_t seq);

  const std::string path_;
  std::unique_ptr<rocksdb::FSRandomRWFile> file_;
  uint64_t gen_ = 1;   // of the slot holding the mark
  int slot_ = 0;       // the slot holding the mark (Advance writes 1 - slot_)
  uint64_t seq_ = 0;
};

}  // namespace pacer
