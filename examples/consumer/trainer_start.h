// TrainerStart: what every example trainer (pacer-train-mlp, pacer-train-ctr) does before its
// loop, in one place: connect the Client, attach the exactly-once ledger when a path is given
// (ReaderLedger, which also sets the reader options' hooks), and register the dataset when asked.
// The trainer then creates its ShardReader with `reader_options`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "examples/consumer/reader_ledger.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"

namespace pacer {

struct TrainerStartOptions {
  std::string dataset;
  std::string ledger_path;        // empty: no ledger
  uint64_t register_records = 0;  // 0: the dataset is registered elsewhere
  uint64_t shard_size = 0;        // when registering; 0: pacerd's default
  uint32_t epochs = 1;            // when registering
  uint64_t shuffle_seed = 0;      // when registering (shards shuffled per epoch)
  // When registering: the local batch (samples per step), so that pacerd never leases less
  // than one batch (leases shrink near an epoch's end; docs/sharding.md). 0: undeclared.
  uint64_t batch_size = 0;
};

struct TrainerStart {
  std::unique_ptr<Client> client;
  std::unique_ptr<ReaderLedger> ledger;  // null without a ledger; destroyed before the client
  ShardReaderOptions reader_options;     // the dataset, and the ledger's hooks
};

// Errors name the step that failed: "connect: ...", "ledger: ...", "register dataset: ...".
absl::StatusOr<TrainerStart> StartTrainer(ClientOptions client_options, const TrainerStartOptions& options);

}  // namespace pacer
