// pacer-consume: a sample worker that consumes a dataset through the sharding service.
//
// It leases shards, "trains" on each batch (a configurable pause or busy loop), reports
// progress per batch and completes each shard, until the dataset ends. With --ledger it keeps
// the append-only ledger the crash tests verify (see ledger.h). It is also the demo's stand-in
// trainer until the SDK's example trainers replace it.
#include <chrono>
#include <optional>
#include <iostream>
#include <thread>

#include "common/auth.h"
#include "common/flags.h"
#include "common/log.h"
#include "examples/consumer/ledger.h"
#include "worker_sdk/sharding_client.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  pacer::SetLogProgramName("pacer-consume");
  pacer::ShardingClientOptions opts;
  std::string token_file, dataset = "train", ledger_path, shuffle = "none";
  uint64_t register_records = 0, shard_size = 0, batch = 32;
  uint32_t epochs = 1, max_attempts = 0;
  double step_ms = 0;
  bool quiet = false;
  po::options_description desc("Options");
  desc.add_options()
      ("addr", po::value(&opts.address), "pacerd address (default $PACER_ADDR or 127.0.0.1:7070)")
      ("token-file", po::value(&token_file), "file holding the job token (without it: $PACER_TOKEN, the token itself)")
      ("worker-id", po::value(&opts.worker_id), "worker id (default $PACER_WORKER_ID)")
      ("node", po::value(&opts.node), "node name")
      ("dataset", po::value(&dataset)->default_value(dataset), "dataset to consume")
      ("register-records", po::value(&register_records), "register the dataset with this many records first")
      ("shard-size", po::value(&shard_size), "shard size when registering")
      ("epochs", po::value(&epochs)->default_value(epochs), "epochs when registering")
      ("shuffle", po::value(&shuffle)->default_value(shuffle), "none|shards|records when registering")
      ("max-attempts", po::value(&max_attempts), "poison threshold when registering")
      ("batch", po::value(&batch)->default_value(batch), "records per batch (progress granularity)")
      ("step-ms", po::value(&step_ms)->default_value(step_ms), "simulated compute time per batch")
      ("ledger", po::value(&ledger_path), "append counted records to this ledger")
      ("quiet", po::bool_switch(&quiet), "no per-shard log lines");
  pacer::AddTlsClientFlags(desc, &opts.tls);  // --tls-ca/--tls-cert/--tls-key (common/tls.h)
  pacer::ParseFlagsOrExit(argc, argv, "Usage: pacer-consume [options]", desc);
  opts.FillFromEnvironment();
  if (!token_file.empty()) {
    auto t = pacer::LoadToken(token_file, false);
    if (!t.ok()) pacer::ExitWithError("pacer-consume", std::string(t.status().message()));
    opts.token = *t;
  }
  if (batch == 0) pacer::ExitWithError("pacer-consume", "--batch must be > 0");
  if (step_ms < 0 || step_ms > 3'600'000) pacer::ExitWithError("pacer-consume", "--step-ms must be in 0..3600000");

  auto client = pacer::ShardingClient::Connect(opts);
  if (!client.ok()) pacer::ExitWithError("pacer-consume", std::string(client.status().message()), 1);
  auto& c = **client;

  std::optional<pacer::LedgerWriter> ledger;
  if (!ledger_path.empty()) {
    auto w = pacer::LedgerWriter::Open(ledger_path);
    if (!w.ok()) pacer::ExitWithError("pacer-consume", std::string(w.status().message()), 1);
    ledger.emplace(std::move(*w));
    int resolved = pacer::ResolvePendingIntents(ledger_path, c.registration(), *ledger);
    if (resolved > 0) PACER_LOG(INFO) << "resolved " << resolved << " unacknowledged reports";
  }
  if (register_records > 0) {
    pacer::DatasetSpec spec;
    spec.set_name(dataset);
    spec.set_num_records(register_records);
    spec.set_shard_size(shard_size);
    spec.set_batch_size(batch);
    spec.set_num_epochs(epochs);
    spec.set_max_attempts(max_attempts);
    spec.set_seed(17);
    if (shuffle == "shards") spec.set_shuffle(pacer::SHUFFLE_SHARDS);
    else if (shuffle == "records") spec.set_shuffle(pacer::SHUFFLE_RECORDS);
    else if (shuffle != "none") pacer::ExitWithError("pacer-consume", "--shuffle: none|shards|records");
    auto created = c.RegisterDataset(spec);
    if (!created.ok()) pacer::ExitWithError("pacer-consume", std::string(created.status().message()), 1);
  }

  uint64_t shards = 0, records = 0;
  const auto start = std::chrono::steady_clock::now();
  // The answer the last completion got for the next shard (one durable call per shard).
  std::optional<pacer::FetchShardResponse> next_lease;
  for (;;) {
    absl::StatusOr<pacer::FetchShardResponse> resp =
        next_lease ? absl::StatusOr<pacer::FetchShardResponse>(std::move(*next_lease))
                   : c.Fetch(dataset);
    next_lease.reset();
    if (!resp.ok() && pacer::ShardingClient::IsIncarnationGone(resp.status())) {
      // Silent too long (e.g. starved on a loaded node): the service ended our leases and
      // declared us lost. Register again, settle what the ledger left open, carry on.
      PACER_LOG(WARNING) << resp.status().message() << "; registering again";
      if (absl::Status s = c.Reregister(); !s.ok()) {
        pacer::ExitWithError("pacer-consume", std::string(s.message()), 1);
      }
      if (ledger) pacer::ResolvePendingIntents(ledger_path, c.registration(), *ledger);
      continue;
    }
    if (!resp.ok()) pacer::ExitWithError("pacer-consume", std::string(resp.status().message()), 1);
    if (resp->outcome() == pacer::FetchShardResponse::END_OF_DATA) break;
    if (resp->outcome() == pacer::FetchShardResponse::WAIT) {
      std::this_thread::sleep_for(std::chrono::milliseconds(resp->retry_after_ms()));  // backoff
      continue;
    }
    const pacer::Lease& lease = resp->lease();
    if (ledger) ledger->Leased(lease);
    const uint64_t total = lease.end() - lease.begin();
    uint64_t done = lease.records_done();
    bool lost = false;
    while (done < total) {
      const uint64_t next = std::min(total, done + batch);
      if (step_ms > 0) {  // "training" on records [done, next) of the lease
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(step_ms * 1000)));
      }
      if (ledger) ledger->Intent(lease.lease_id(), next);
      absl::Status s;
      if (next == total) {
        // Complete and lease the next shard in one call; a pacerd without the combined call
        // answers without `next` and the loop fetches.
        auto r = c.CompleteAndFetch(lease, dataset);
        s = r.status();
        if (r.ok() && r->has_next()) next_lease = r->next();
      } else {
        auto r = c.ReportProgress(lease, next);
        s = r.status();
      }
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        PACER_LOG(WARNING) << "lease " << lease.lease_id() << " lost: " << s.message();
        lost = true;
        break;
      }
      if (!s.ok()) pacer::ExitWithError("pacer-consume", std::string(s.message()), 1);
      if (ledger) ledger->Ack(lease.lease_id(), next);
      records += next - done;
      done = next;
    }
    if (!lost) ++shards;
    if (!quiet && !lost) {
      PACER_LOG(INFO) << "shard " << lease.shard_id() << " done (" << total << " records)";
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "pacer-consume " << c.worker_id() << ": end of data; " << shards << " shards, "
            << records << " records in " << secs << " s" << std::endl;
  return 0;
}
