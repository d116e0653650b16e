// DataDirIdentity: <data-dir>/IDENTITY — which data dir this is and which stores it holds, so
// that a store that disappears is noticed instead of silently recreated empty.
//
// Written once, when pacerd first opened both stores of a data dir (a fresh one, or one from
// before identities, which is thereby adopted), through a temp file + fsync + rename +
// directory fsync. Text, one field a line:
//   pacer-data-dir-v1
//   id=<32 hex digits, random>
//   created_unix_ms=<ms>
//   stores=journal,controller
// Also here: the durable record of an accepted data loss (<data-dir>/DATA-LOSS-ACCEPTED, one
// line per acceptance, appended and fsynced).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pacer {

struct DataDirIdentity {
  std::string id;
  int64_t created_unix_ms = 0;
  std::vector<std::string> stores;  // "journal", "controller"

  bool Has(const std::string& store) const;
};

inline constexpr char kIdentityFile[] = "IDENTITY";
inline constexpr char kDataLossFile[] = "DATA-LOSS-ACCEPTED";

DataDirIdentity NewDataDirIdentity(int64_t now_unix_ms, std::vector<std::string> stores);
// nullopt when the data dir has no IDENTITY; DATA_LOSS (naming the file) when it does not parse.
absl::StatusOr<std::optional<DataDirIdentity>> ReadDataDirIdentity(const std::string& data_dir);
absl::Status WriteDataDirIdentity(const std::string& data_dir, const DataDirIdentity& identity);
// Appends `line` (one line) to <data-dir>/DATA-LOSS-ACCEPTED and fsyncs it.
absl::Status RecordAcceptedDataLoss(const std::string& data_dir, const std::string& line);

}  // namespace pacer
