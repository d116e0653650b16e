#include "examples/consumer/reader_ledger.h"

namespace pacer {

absl::StatusOr<std::unique_ptr<ReaderLedger>> ReaderLedger::Attach(const std::string& path, Client* client,
                                                                   ShardReaderOptions* reader_options) {
  auto w = LedgerWriter::Open(path);
  if (!w.ok()) return w.status();
  std::unique_ptr<ReaderLedger> l(new ReaderLedger(std::move(*w), client));
  l->resolved_ = ResolvePendingIntents(path, client->registration(), l->writer_);
  client->AddListener(l.get());
  LedgerWriter* writer = &l->writer_;
  reader_options->on_lease = [writer](const Lease& lease) { writer->Leased(lease); };
  reader_options->on_report = [writer](uint64_t lease, uint64_t prefix) { writer->Intent(lease, prefix); };
  return l;
}

ReaderLedger::~ReaderLedger() { client_->RemoveListener(this); }

}  // namespace pacer
