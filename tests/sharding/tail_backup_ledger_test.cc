// Exactly-once accounting of tail backups, end to end: a real pacerd (gRPC on loopback, RocksDB
// journal) with tail backups on, two consumers that keep ledgers the way pacer-consume does
// (ledger.h), and a backup pair both of whose members report overlapping progress. The sharding
// service counts each record of the pair once; the ledgers, read together, must say the same:
// every record of the epoch counted exactly once (ForEachCountedRange and pacer-ledger-check).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "examples/consumer/ledger.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

constexpr uint64_t kRecords = 1000;

// One consumer: a client and its ledger, reporting like pacer-consume (I before, A after).
struct Consumer {
  std::unique_ptr<ShardingClient> client;
  std::optional<LedgerWriter> ledger;
  Lease lease;

  void Fetch(const std::string& dataset) {
    auto r = client->Fetch(dataset);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outcome(), FetchShardResponse::LEASED) << r->reason();
    lease = r->lease();
    ledger->Leased(lease);
  }
  // Reports `prefix` records of the lease done; the status of the report.
  absl::Status Report(uint64_t prefix) {
    ledger->Intent(lease.lease_id(), prefix);
    absl::Status s = prefix == lease.end() - lease.begin()
                         ? client->Complete(lease)
                         : client->ReportProgress(lease, prefix).status();
    if (s.ok()) ledger->Ack(lease.lease_id(), prefix);
    return s;
  }
};

class TailBackupLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
  }

  Consumer Connect(const std::string& id, const std::string& ledger) {
    Consumer c;
    ShardingClientOptions co;
    co.address = pacerd_->address();
    co.token = pacerd_->job_token();
    co.worker_id = id;
    co.node = "n-" + id;
    auto client = ShardingClient::Connect(co);
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) c.client = std::move(*client);
    auto w = LedgerWriter::Open(ledger);
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) c.ledger.emplace(std::move(*w));
    return c;
  }

  // One shard of kRecords records, tail backups on from the start.
  void Register(Consumer& c, const std::string& name, ShuffleMode shuffle) {
    DatasetSpec spec;
    spec.set_name(name);
    spec.set_num_records(kRecords);
    spec.set_shard_size(kRecords);
    spec.set_batch_size(100);
    spec.set_num_epochs(1);
    spec.set_shuffle(shuffle);
    spec.set_seed(17);
    spec.set_tail_backup(true);
    ASSERT_TRUE(c.client->RegisterDataset(spec).ok());
  }

  // How often each record of the epoch was counted, by the ledgers read together.
  std::vector<int> Counts(const std::vector<std::string>& ledgers) {
    std::vector<int> count(kRecords, 0);
    auto all = ReadLedgers(ledgers);
    EXPECT_TRUE(all.ok()) << all.status();
    if (!all.ok()) return count;
    ForEachCountedRange(*all, [&](uint32_t epoch, uint64_t b, uint64_t e) {
      EXPECT_EQ(epoch, 0u);
      for (uint64_t r = b; r < e; ++r) {
        ASSERT_LT(r, kRecords);
        count[r]++;
      }
    });
    return count;
  }

  void ExpectExactlyOnce(const std::vector<std::string>& ledgers) {
    const std::vector<int> count = Counts(ledgers);
    int missing = 0, twice = 0;
    for (int c : count) {
      missing += c == 0;
      twice += c > 1;
    }
    EXPECT_EQ(missing, 0);
    EXPECT_EQ(twice, 0);
    // The checker the demo and the crash tests use says the same.
    std::string cmd = testing::BinaryPath("pacer-ledger-check") + " --records " +
                      std::to_string(kRecords) + " --epochs 1";
    for (const auto& l : ledgers) cmd += " " + l;
    cmd += " > " + dir_.Sub("check.out") + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }

  void ExpectServiceCountedAll(Consumer& c, const std::string& name) {
    auto ds = c.client->ListDatasets();
    ASSERT_TRUE(ds.ok()) << ds.status();
    bool found = false;
    for (const auto& d : ds->datasets()) {
      if (d.spec().name() != name) continue;
      found = true;
      EXPECT_TRUE(d.finished());
      EXPECT_EQ(d.records_done_total(), kRecords);  // each record once, pair included
    }
    EXPECT_TRUE(found);
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true}};
  const testing::TempDir& dir_ = h_.dir();
  Pacerd* pacerd_ = nullptr;
};

// The backup completes first: the primary, which went on past the backup's start, is fenced.
TEST_F(TailBackupLedgerTest, BackupCompletesFirstAndThePairCountsOnce) {
  for (ShuffleMode shuffle : {SHUFFLE_NONE, SHUFFLE_RECORDS}) {
    SCOPED_TRACE(ShuffleMode_Name(shuffle));
    const std::string name = "d-" + ShuffleMode_Name(shuffle);
    const std::string la = dir_.Sub(name + ".a"), lb = dir_.Sub(name + ".b");
    Consumer a = Connect("a-" + name, la);
    ASSERT_NO_FATAL_FAILURE(Register(a, name, shuffle));

    // a is the only worker yet: its lease is the whole epoch (near an epoch's end a lease is
    // the fetcher's share of what is left, so b joins after).
    ASSERT_NO_FATAL_FAILURE(a.Fetch(name));
    ASSERT_FALSE(a.lease.backup());
    Consumer b = Connect("b-" + name, lb);
    ASSERT_TRUE(a.Report(300).ok());
    ASSERT_NO_FATAL_FAILURE(b.Fetch(name));  // nothing else left: the suffix of a's lease
    ASSERT_TRUE(b.lease.backup());
    ASSERT_EQ(b.lease.begin(), a.lease.begin() + 300);
    ASSERT_EQ(b.lease.end(), a.lease.end());
    ASSERT_TRUE(a.Report(600).ok());  // positions [300, 600): counted by a, first
    ASSERT_TRUE(b.Report(100).ok());  // behind a: nothing new counted
    ASSERT_TRUE(b.Report(700).ok());  // completes: [600, 1000) counted, a fenced
    EXPECT_EQ(a.Report(700).code(), absl::StatusCode::kFailedPrecondition);

    ExpectServiceCountedAll(a, name);
    ExpectExactlyOnce({la, lb});
  }
}

// The primary gives up (released) after counting past the backup's start; the backup survives,
// skips what the primary counted and completes.
TEST_F(TailBackupLedgerTest, SurvivingBackupCountsOnlyWhatItsPartnerDidNot) {
  const std::string name = "d-survivor";
  const std::string la = dir_.Sub("s.a"), lb = dir_.Sub("s.b");
  Consumer a = Connect("a", la);
  ASSERT_NO_FATAL_FAILURE(Register(a, name, SHUFFLE_RECORDS));
  ASSERT_NO_FATAL_FAILURE(a.Fetch(name));  // the whole epoch: a is the only worker yet
  Consumer b = Connect("b", lb);
  ASSERT_TRUE(a.Report(200).ok());
  ASSERT_NO_FATAL_FAILURE(b.Fetch(name));
  ASSERT_TRUE(b.lease.backup());
  ASSERT_TRUE(b.Report(100).ok());  // positions [200, 300), counted by b first
  ASSERT_TRUE(a.Report(500).ok());  // [300, 500) by a
  ASSERT_TRUE(a.client->Release(a.lease, 500, /*failed=*/false).ok());
  ASSERT_TRUE(b.Report(800).ok());  // completes [500, 1000)

  ExpectServiceCountedAll(b, name);
  ExpectExactlyOnce({la, lb});
}

// Ledgers written before the L line carried positions still read, as before.
TEST(LedgerFormatTest, OldLinesStillRead) {
  testing::TempDir dir;
  const std::string path = dir.Sub("old");
  {
    auto w = LedgerWriter::Open(path);
    ASSERT_TRUE(w.ok());
  }
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("L 7 0 10-20,40-50\nI 7 15\nA 7 15\n", f);
  std::fclose(f);
  auto l = ReadLedger(path);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->count(7), 1u);
  EXPECT_FALSE(l->at(7).has_position);
  std::vector<std::pair<uint64_t, uint64_t>> got;
  ForEachCountedRange(*l, [&](uint32_t, uint64_t b, uint64_t e) { got.emplace_back(b, e); });
  EXPECT_EQ(got, (std::vector<std::pair<uint64_t, uint64_t>>{{10, 20}, {40, 45}}));
}

}  // namespace
}  // namespace pacer
