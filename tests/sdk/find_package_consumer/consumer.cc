// The find_package(pacer) consumer: registers with a pacerd, registers a dataset, leases one
// shard, reports it done through the Client's reporter, and checks the dataset is then
// finished. Also touches the C API (pacer::c_api) so its link is checked.
//   pacer_consumer <pacerd host:port> <token file> <records>
// Prints "consumer ok: leased N records, dataset finished" and exits 0; exits 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker_sdk/c_api.h"
#include "worker_sdk/client.h"

namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: pacer_consumer ADDR TOKEN_FILE RECORDS\n");
    return 2;
  }
  pacer::ClientOptions o;
  o.address = argv[1];
  o.token_file = argv[2];
  o.worker_id = "consumer";
  o.report_steps = false;
  o.connect_budget_ms = 20'000;
  const uint64_t records = std::strtoull(argv[3], nullptr, 10);
  auto client = pacer::Client::Connect(o);
  if (!client.ok()) return Fail("connect", client.status());
  pacer::Client& c = **client;

  pacer::DatasetSpec spec;
  spec.set_name("consumer");
  spec.set_num_records(records);
  spec.set_shard_size(records);
  spec.set_num_epochs(1);
  if (auto r = c.sharding().RegisterDataset(spec); !r.ok()) return Fail("register dataset", r.status());
  auto fetched = c.sharding().Fetch("consumer");
  if (!fetched.ok()) return Fail("fetch", fetched.status());
  if (fetched->outcome() != pacer::FetchShardResponse::LEASED) {
    return Fail("fetch", absl::FailedPreconditionError("no lease: " + fetched->reason()));
  }
  const pacer::Lease& lease = fetched->lease();
  const uint64_t n = lease.end() - lease.begin();
  c.EnqueueProgress(lease, n / 2);
  c.EnqueueCompletion(lease);
  if (absl::Status s = c.Flush(20'000); !s.ok()) return Fail("flush", s);
  auto after = c.sharding().Fetch("consumer");
  if (!after.ok()) return Fail("fetch after completion", after.status());
  if (after->outcome() != pacer::FetchShardResponse::END_OF_DATA) {
    return Fail("fetch after completion", absl::InternalError("dataset not finished"));
  }
  // The C API refuses a call with nowhere to put the client, with a code and a message.
  pacer_error err{};
  if (pacer_client_connect(nullptr, nullptr, &err) != PACER_INVALID_ARGUMENT) {
    return Fail("c api", absl::InternalError("a NULL out-pointer was not refused"));
  }
  c.Close();
  std::printf("consumer ok: leased %llu records, dataset finished\n",
              static_cast<unsigned long long>(n));
  return 0;
}
