// ReaderLedger: a trainer's exactly-once ledger (ledger.h) wired to its Client and ShardReader.
// Attach() opens the ledger, resolves the reports earlier incarnations left unacknowledged
// (from the registration's previous leases), and sets the reader's hooks so that every lease
// read from and every report about to be queued is written down; as a ReportListener it writes
// every acknowledgement. The example trainers (pacer-train-mlp, pacer-train-ctr) attach it through
// StartTrainer (trainer_start.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "examples/consumer/ledger.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"

namespace pacer {

class ReaderLedger final : public ReportListener {
 public:
  // `client` must outlive the ledger; pass `reader_options` to ShardReader::Create afterwards.
  static absl::StatusOr<std::unique_ptr<ReaderLedger>> Attach(const std::string& path, Client* client,
                                                              ShardReaderOptions* reader_options);
  ~ReaderLedger() override;
  ReaderLedger(const ReaderLedger&) = delete;
  ReaderLedger& operator=(const ReaderLedger&) = delete;

  // Reports of earlier incarnations resolved at Attach.
  int resolved() const { return resolved_; }

  void OnAcknowledged(uint64_t lease_id, uint64_t records_done) override { writer_.Ack(lease_id, records_done); }

 private:
  ReaderLedger(LedgerWriter writer, Client* client) : writer_(std::move(writer)), client_(client) {}
  LedgerWriter writer_;
  Client* client_;
  int resolved_ = 0;
};

}  // namespace pacer
