// The snapshot file of a pacer-ps server (--state-dir DIR: DIR/ps.snapshot).
//
// Format, little-endian, one file:
//   bytes 0..7    magic "PACERPS1"
//   bytes 8..15   payload length L (uint64)
//   bytes 16..19  CRC-32C of the payload (uint32)
//   bytes 20..    payload: a serialized PsSnapshot (proto/pacer/ps.proto), exactly L bytes
// A file with another magic, a length that does not match the file size, a wrong checksum or a
// payload that does not parse is refused with DATA_LOSS naming the file -- never loaded.
//
// Writing is atomic: the file is written to PATH.tmp, fsynced, renamed over PATH and the
// directory fsynced, so a crash leaves either the old snapshot or the new one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/pacer/ps.pb.h"

namespace pacer {

inline constexpr char kPsSnapshotFile[] = "ps.snapshot";

absl::Status WritePsSnapshot(const std::string& path, const PsSnapshot& snapshot);
// nullopt when `path` does not exist (a fresh server); DATA_LOSS for a torn or corrupt file.
absl::StatusOr<std::optional<PsSnapshot>> ReadPsSnapshot(const std::string& path);

uint32_t Crc32c(const std::string& data);

}  // namespace pacer
