// A consumer's ledger across restarts, end to end: a real pacerd (gRPC on loopback, RocksDB
// journal) and consumers that keep ledgers the way pacer-consume does (ledger.h: I before a
// report, A after the acknowledgement). A consumer killed after its report was committed but
// before it wrote the acknowledgement resolves that intent when it starts again, from the
// registration's previous_leases. Restarts are not always clean: a registration can commit
// without its process ever using it (the reply was lost when pacerd was killed and the call was
// retried, or the new process was killed before it resolved anything). The intent must still
// be resolved by the next process, or the ledger misses records the service counted.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/auth.h"
#include "examples/consumer/ledger.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

constexpr uint64_t kRecords = 100;

class RestartLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(h_.ok()); }

  std::unique_ptr<ShardingClient> Connect(const std::string& id) {
    ShardingClientOptions co;
    co.address = h_.address();
    co.token = h_.job_token();
    co.worker_id = id;
    auto client = ShardingClient::Connect(co);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  void RegisterDataset(ShardingClient& c) {
    DatasetSpec spec;
    spec.set_name("d");
    spec.set_num_records(kRecords);
    spec.set_shard_size(kRecords);
    spec.set_batch_size(10);
    spec.set_num_epochs(1);
    spec.set_shuffle(SHUFFLE_SHARDS);
    spec.set_seed(17);
    ASSERT_TRUE(c.RegisterDataset(spec).ok());
  }

  // Records of the lease the ledger counts done.
  uint64_t LedgerCounted(const std::string& path) {
    auto l = ReadLedger(path);
    EXPECT_TRUE(l.ok()) << l.status();
    uint64_t n = 0;
    if (l.ok()) ForEachCountedRange(*l, [&](uint32_t, uint64_t b, uint64_t e) { n += e - b; });
    return n;
  }

  // The first process: leases the shard, reports 10 records (acknowledged), then reports 20
  // and is "killed" after the service counted them but before it wrote the A line.
  void FirstProcessDiesAfterCommit(const std::string& ledger_path) {
    auto c = Connect("w");
    ASSERT_NE(c, nullptr);
    ASSERT_NO_FATAL_FAILURE(RegisterDataset(*c));
    auto ledger = LedgerWriter::Open(ledger_path);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    auto r = c->Fetch("d");
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outcome(), FetchShardResponse::LEASED);
    lease_ = r->lease();
    first_incarnation_ = c->incarnation();
    ledger->Leased(lease_);
    ledger->Intent(lease_.lease_id(), 10);
    ASSERT_TRUE(c->ReportProgress(lease_, 10).ok());
    ledger->Ack(lease_.lease_id(), 10);
    ledger->Intent(lease_.lease_id(), 20);
    auto done = c->ReportProgress(lease_, 20);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(*done, 20u);
    ASSERT_EQ(LedgerCounted(ledger_path), 10u);  // the A line for 20 was never written
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true}};
  const testing::TempDir& dir_ = h_.dir();
  Lease lease_;
  uint64_t first_incarnation_ = 0;
};

// The plain restart: the next registration lists the lease with its final prefix.
TEST_F(RestartLedgerTest, CleanRestartResolvesTheIntent) {
  const std::string path = dir_.Sub("ledger");
  ASSERT_NO_FATAL_FAILURE(FirstProcessDiesAfterCommit(path));
  auto c = Connect("w");
  ASSERT_NE(c, nullptr);
  auto w = LedgerWriter::Open(path);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(ResolvePendingIntents(path, c->registration(), *w), 1);
  EXPECT_EQ(LedgerCounted(path), 20u);
}

// A registration nobody resolved from sits between the process that left the intent and the
// one that resolves it: the intent is still resolved, to what the service counted.
TEST_F(RestartLedgerTest, IntentSurvivesARegistrationThatWasNeverUsed) {
  const std::string path = dir_.Sub("ledger");
  ASSERT_NO_FATAL_FAILURE(FirstProcessDiesAfterCommit(path));
  // Registered, then gone before resolving (killed, or its reply lost and the call retried).
  ASSERT_NE(Connect("w"), nullptr);
  auto c = Connect("w");
  ASSERT_NE(c, nullptr);
  bool listed = false;
  for (const auto& e : c->registration().previous_leases()) {
    if (e.lease_id() != lease_.lease_id()) continue;
    listed = true;
    EXPECT_EQ(e.records_done(), 20u);
    EXPECT_EQ(e.reason(), LEASE_WORKER_LOST);
  }
  EXPECT_TRUE(listed) << c->registration().DebugString();
  auto w = LedgerWriter::Open(path);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(ResolvePendingIntents(path, c->registration(), *w), 1);
  EXPECT_EQ(LedgerCounted(path), 20u);

  // And a report retried by the first incarnation is still answered truthfully: counted.
  ProgressRequest req;
  req.set_worker_id("w");
  req.set_incarnation(first_incarnation_);
  req.set_lease_id(lease_.lease_id());
  req.set_fencing_token(lease_.fencing_token());
  req.set_records_done(20);
  ProgressResponse resp;
  grpc::ClientContext ctx;
  AttachToken(&ctx, h_.job_token());
  const grpc::Status s = c->stub()->ReportProgress(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace pacer
