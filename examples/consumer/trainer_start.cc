#include "examples/consumer/trainer_start.h"

#include "common/log.h"

namespace pacer {
namespace {

absl::Status Named(const char* step, const absl::Status& s) {
  return absl::Status(s.code(), std::string(step) + ": " + std::string(s.message()));
}

}  // namespace

absl::StatusOr<TrainerStart> StartTrainer(ClientOptions client_options, const TrainerStartOptions& options) {
  TrainerStart start;
  auto client = Client::Connect(std::move(client_options));
  if (!client.ok()) return Named("connect", client.status());
  start.client = std::move(*client);
  start.reader_options.dataset = options.dataset;
  if (!options.ledger_path.empty()) {
    auto ledger = ReaderLedger::Attach(options.ledger_path, start.client.get(), &start.reader_options);
    if (!ledger.ok()) return Named("ledger", ledger.status());
    start.ledger = std::move(*ledger);
    if (start.ledger->resolved() > 0) {
      PACER_LOG(INFO) << "resolved " << start.ledger->resolved() << " unacknowledged reports";
    }
  }
  if (options.register_records > 0) {
    DatasetSpec spec;
    spec.set_name(options.dataset);
    spec.set_num_records(options.register_records);
    spec.set_shard_size(options.shard_size);
    spec.set_num_epochs(options.epochs);
    spec.set_shuffle(SHUFFLE_SHARDS);
    spec.set_seed(options.shuffle_seed);
    spec.set_batch_size(options.batch_size);
    auto created = start.client->sharding().RegisterDataset(spec);
    if (created.status().code() == absl::StatusCode::kAlreadyExists) {
      // Ranks may start with different local batches (the batch plan evens them out): a
      // dataset another rank registered with its batch is ours too. Register again with that
      // batch (and the shard size it implied when ours is pacerd's default), so any other
      // difference is still refused.
      auto listed = start.client->sharding().ListDatasets();
      if (!listed.ok()) return Named("register dataset", listed.status());
      for (const auto& d : listed->datasets()) {
        if (d.spec().name() != options.dataset) continue;
        spec.set_batch_size(d.spec().batch_size());
        if (options.shard_size == 0) spec.set_shard_size(d.spec().shard_size());
        created = start.client->sharding().RegisterDataset(spec);
      }
    }
    if (!created.ok()) return Named("register dataset", created.status());
  }
  return start;
}

}  // namespace pacer
