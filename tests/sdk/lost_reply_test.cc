// Lost replies against a real in-process pacerd (gRPC on loopback, port from the OS, RocksDB
// journal with fsync), over the public contract as the SDK speaks it (docs/design.md §2: "a lost
// reply costs nothing"):
//   - a retried FetchShard (same request id) gets the same lease; a fetch given up is released
//     by pacerd at the next heartbeat, which lists the leases the worker holds;
//   - three SDK trainers whose leasing replies are lost to 10 µs deadlines and dropped replies
//     (some calls given up altogether) finish two epochs, every record counted once, no stall;
//   - retries of CompleteShard / ReportProgress / ReleaseShard on leases that ended 1, 8 and
//     1 000 leases earlier are answered truthfully;
//   - the ShardReader leases with its completions: one durable call per shard in steady state,
//     and a trainer reading ahead without MarkConsumed still gets data — and is told kWait,
//     never left waiting on itself, when everything the service could give is in its hands.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <set>
#include <thread>

#include "tests/sdk/ledger_consumer.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

using testing::TempDir;
using testing::WaitFor;

class LostReplyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
  }
  ShardingClientOptions Direct(const std::string& worker) {
    ShardingClientOptions o;
    o.address = pacerd_->address();
    o.token = pacerd_->job_token();
    o.worker_id = worker;
    o.retry_budget_ms = 20'000;
    return o;
  }
  ClientOptions Sdk(const std::string& worker) {
    ClientOptions o;
    o.address = pacerd_->address();
    o.token = pacerd_->job_token();
    o.worker_id = worker;
    o.connect_budget_ms = 20'000;
    o.report_steps = false;
    return o;
  }
  static DatasetSpec Spec(uint64_t n, uint64_t shard, uint32_t epochs) {
    DatasetSpec s;
    s.set_name("train");
    s.set_num_records(n);
    s.set_shard_size(shard);
    s.set_num_epochs(epochs);
    s.set_shuffle(SHUFFLE_SHARDS);
    s.set_seed(5);
    return s;
  }
  DatasetInfo Dataset() {
    auto c = ShardingClient::Connect(Direct("observer"));
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return DatasetInfo();
    auto l = (*c)->ListDatasets();
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() && l->datasets_size() ? l->datasets(0) : DatasetInfo();
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true, .adjust = [](PacerdOptions& p) {
    p.sharding.heartbeat_interval_ms = 50;
  }}};
  const testing::TempDir& dir_ = h_.dir();
  Pacerd* pacerd_ = nullptr;

  // Client "w0" and a ShardReader prefetching one lease, on a newly registered `spec`.
  void StartReader(const DatasetSpec& spec) {
    auto c = Client::Connect(Sdk("w0"));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    ASSERT_TRUE(client_->sharding().RegisterDataset(spec).ok());
    ShardReaderOptions ro;
    ro.prefetch_leases = 1;
    auto r = ShardReader::Create(client_.get(), ro);
    ASSERT_TRUE(r.ok()) << r.status();
    reader_ = std::move(*r);
  }
  std::unique_ptr<Client> client_;        // after h_: gone before pacerd stops
  std::unique_ptr<ShardReader> reader_;   // after client_: gone before it
};

TEST_F(LostReplyTest, ARetriedFetchGetsTheSameLeaseAndAGivenUpOneIsReleasedAtTheNextHeartbeat) {
  ShardingClientOptions o = Direct("w0");
  // Request 1: the first reply is lost after pacerd committed the lease. Request 2: every
  // reply is lost until the client gives up.
  o.test_lose_lease_reply = [](uint64_t request_id, int attempt) {
    if (request_id == 1 && attempt == 1) return LoseReply::kDropReply;
    if (request_id == 2) return LoseReply::kDropReply;
    return LoseReply::kNone;
  };
  o.retry_budget_ms = 300;
  o.backoff_initial_ms = 5;
  auto w = ShardingClient::Connect(o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->RegisterDataset(Spec(100, 10, 1)).ok());

  auto first = (*w)->Fetch("train");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->outcome(), FetchShardResponse::LEASED);
  EXPECT_EQ(first->lease().request_id(), 1u);
  EXPECT_EQ(Dataset().active_leases(), 1u) << "the retry leased a second shard";
  EXPECT_EQ((*w)->HeldLeases(), std::vector<uint64_t>{first->lease().lease_id()});

  auto lost = (*w)->Fetch("train");
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable) << lost.status();
  EXPECT_EQ(Dataset().active_leases(), 2u) << "the lost reply's lease was committed";
  EXPECT_EQ((*w)->last_ended_request_id(), 2u);

  auto hb = (*w)->Heartbeat(HeartbeatRequest());
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_EQ(hb->released_unknown_leases_size(), 1);
  EXPECT_NE(hb->released_unknown_leases(0), first->lease().lease_id());
  EXPECT_EQ(Dataset().active_leases(), 1u);

  // The released shard goes back to the front of the queue: the next fetch gets its records.
  auto again = (*w)->Fetch("train");
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->outcome(), FetchShardResponse::LEASED);
  EXPECT_EQ(again->lease().records_done(), 0u);
  EXPECT_TRUE((*w)->Complete(first->lease()).ok());
  EXPECT_TRUE((*w)->Complete(again->lease()).ok());
  // Still held leases are never released: a heartbeat now releases nothing.
  auto next = (*w)->Fetch("train");
  ASSERT_TRUE(next.ok());
  hb = (*w)->Heartbeat(HeartbeatRequest());
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->released_unknown_leases_size(), 0);
  EXPECT_EQ((*w)->HeldLeases(), std::vector<uint64_t>{next->lease().lease_id()});
}

TEST_F(LostReplyTest, ACombinedCompletionRetriedGetsTheSameNextLease) {
  ShardingClientOptions o = Direct("w0");
  o.test_lose_lease_reply = [](uint64_t request_id, int attempt) {
    return request_id == 2 && attempt <= 2 ? LoseReply::kDropReply : LoseReply::kNone;
  };
  o.backoff_initial_ms = 5;
  auto w = ShardingClient::Connect(o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->RegisterDataset(Spec(100, 10, 1)).ok());
  auto a = (*w)->Fetch("train");
  ASSERT_TRUE(a.ok() && a->outcome() == FetchShardResponse::LEASED);
  auto r = (*w)->CompleteAndFetch(a->lease(), "train");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_next());
  ASSERT_EQ(r->next().outcome(), FetchShardResponse::LEASED);
  EXPECT_EQ(r->next().lease().request_id(), 2u);
  const DatasetInfo ds = Dataset();
  EXPECT_EQ(ds.active_leases(), 1u) << "each retry leased another shard";
  EXPECT_EQ(ds.records_done_current_epoch(), 10u);
  EXPECT_EQ((*w)->HeldLeases(), std::vector<uint64_t>{r->next().lease().lease_id()});
  EXPECT_GE((*w)->leasing_stats().retried_attempts, 2u);
  // Near the end of a lease, a progress report leases the next shard in the same call.
  const Lease b = r->next().lease();
  auto p = (*w)->ReportProgressAndFetch(b, 8, "train");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->records_done(), 8u);
  ASSERT_TRUE(p->has_next());
  ASSERT_EQ(p->next().outcome(), FetchShardResponse::LEASED);
  const std::vector<uint64_t> held{b.lease_id(), p->next().lease().lease_id()};
  EXPECT_EQ((*w)->HeldLeases(), held);
  EXPECT_EQ(Dataset().active_leases(), 2u);
}

// Replies lost to a client deadline.
TEST_F(LostReplyTest, TrainersWhoseLeasingRepliesAreLostFinishTheEpochsEveryRecordOnce) {
  constexpr uint64_t kRecords = 1'200;
  constexpr uint32_t kEpochs = 2;
  constexpr int kWorkers = 3;
  {
    auto setup = ShardingClient::Connect(Direct("setup"));
    ASSERT_TRUE(setup.ok()) << setup.status();
    ASSERT_TRUE((*setup)->RegisterDataset(Spec(kRecords, 20, kEpochs)).ok());
  }
  std::vector<std::unique_ptr<testing::LedgerConsumer>> consumers;
  std::vector<std::string> ledgers;
  for (int i = 0; i < kWorkers; ++i) {
    ClientOptions o = Sdk("w" + std::to_string(i));
    o.connect_budget_ms = 600;  // a call whose replies are all lost is given up soon
    o.test_lose_lease_reply = [](uint64_t request_id, int attempt) {
      switch (request_id % 7) {
        case 3:  // every reply lost: the call is given up, pacerd must release the lease
          return LoseReply::kDropReply;
        case 1:
        case 5:  // committed, reply lost, retried with the same id
          return attempt == 1 ? LoseReply::kDropReply : LoseReply::kNone;
        case 2:
        case 6:  // a 10 µs deadline: committed or not, the retry must not lease twice
          return attempt == 1 ? LoseReply::kTinyDeadline : LoseReply::kNone;
        default:
          return LoseReply::kNone;
      }
    };
    ledgers.push_back(dir_.Sub("ledger-" + std::to_string(i)));
    consumers.push_back(std::make_unique<testing::LedgerConsumer>(o, ledgers.back()));
  }
  std::vector<absl::Status> results(kWorkers);
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      results[i] = consumers[i]->Run();
      ++finished;
    });
  }
  const bool done = WaitFor([&] { return finished.load() == kWorkers; }, std::chrono::seconds(60),
                            std::chrono::milliseconds(20));
  if (!done) {
    const DatasetInfo ds = Dataset();
    ADD_FAILURE() << "the job stalled: " << ds.records_done_current_epoch() << " of " << kRecords
                  << " done in epoch " << ds.current_epoch() << ", " << ds.active_leases()
                  << " leases active";
    for (auto& c : consumers) c->Stop();
  }
  for (auto& t : threads) t.join();
  if (!done) return;
  uint64_t released = 0, retried = 0, given_up = 0, combined = 0;
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_TRUE(results[i].ok()) << "w" << i << ": " << results[i];
    released += consumers[i]->stats().leases_released_unknown;
    retried += consumers[i]->leasing().retried_attempts;
    given_up += consumers[i]->leasing().given_up;
    combined += consumers[i]->leasing().leased_by_combined;
  }
  std::cout << "lost-reply retries " << retried << ", calls given up " << given_up
            << ", leases released by pacerd as never received " << released
            << ", leased by completions " << combined << std::endl;
  EXPECT_GT(retried, 0u);
  EXPECT_GT(given_up, 0u);
  EXPECT_GT(released, 0u) << "no lost lease was released: the test did not test it";
  testing::ExpectEachRecordCountedOnce(ledgers, kEpochs, kRecords);
  const DatasetInfo ds = Dataset();
  EXPECT_TRUE(ds.finished());
  EXPECT_EQ(ds.records_done_total(), kRecords * kEpochs);
  EXPECT_EQ(ds.active_leases(), 0u);
}

// A late retry is answered truthfully however many leases ended since.
TEST_F(LostReplyTest, RetriesOnLeasesThatEnded1And8And1000LeasesEarlierAreAnsweredTruthfully) {
  auto w = ShardingClient::Connect(Direct("w0"));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->RegisterDataset(Spec(20'000, 10, 1)).ok());  // 2 000 shards in one epoch
  auto fetch = [&]() -> Lease {
    auto f = (*w)->Fetch("train");
    EXPECT_TRUE(f.ok() && f->outcome() == FetchShardResponse::LEASED) << f.status();
    return f.ok() ? f->lease() : Lease();
  };
  // A: completed (all 10 counted). B: released after 4 of 10 (those 4 counted, 6 not).
  const Lease a = fetch();
  ASSERT_TRUE((*w)->ReportProgress(a, 5).ok());
  ASSERT_TRUE((*w)->Complete(a).ok());
  const Lease b = fetch();
  ASSERT_TRUE((*w)->ReportProgress(b, 4).ok());
  ASSERT_TRUE((*w)->Release(b, 4, /*failed=*/false).ok());

  auto check = [&](int ended_since) {
    SCOPED_TRACE("leases ended since: " + std::to_string(ended_since));
    using absl::StatusCode;
    // A: every report within what was counted succeeds, and says so.
    EXPECT_TRUE((*w)->Complete(a).ok());
    auto p = (*w)->ReportProgress(a, 10);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, 10u);
    p = (*w)->ReportProgress(a, 3);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, 10u);
    EXPECT_TRUE((*w)->Release(a, 10, false).ok());
    // B: what was counted succeeds; anything past it was not counted and is refused.
    EXPECT_EQ((*w)->Complete(b).code(), StatusCode::kFailedPrecondition);
    p = (*w)->ReportProgress(b, 4);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, 4u);
    EXPECT_EQ((*w)->ReportProgress(b, 5).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE((*w)->Release(b, 4, false).ok());
    EXPECT_EQ((*w)->Release(b, 7, false).code(), StatusCode::kFailedPrecondition);
  };
  // 1 000 more leases ended (one durable call each), checking after 1, 8 and 1 000.
  Lease cur = fetch();  // B's undone suffix, back at the front of the queue
  EXPECT_EQ(cur.begin(), b.begin() + 4);
  uint64_t completed = 0;
  for (int ended = 1; ended <= 1'000; ++ended) {
    completed += cur.end() - cur.begin();
    auto r = (*w)->CompleteAndFetch(cur, "train");
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_next() && r->next().outcome() == FetchShardResponse::LEASED);
    cur = r->next().lease();
    if (ended == 1 || ended == 8 || ended == 1'000) check(ended);
    if (HasFatalFailure()) return;
  }
  // Nothing above changed what was counted: A's 10, B's 4, the 1 000 completed.
  EXPECT_EQ(Dataset().records_done_current_epoch(), 10u + 4u + completed);
}

TEST_F(LostReplyTest, TheReaderLeasesWithItsCompletionsOneDurableCallPerShard) {
  constexpr uint64_t kRecords = 3'000;  // 100 shards
  auto client = Client::Connect(Sdk("w0"));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->sharding().RegisterDataset(Spec(kRecords, 30, 1)).ok());
  ShardReaderOptions ro;
  ro.prefetch_leases = 1;
  auto reader = ShardReader::Create(client->get(), ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int> seen(kRecords, 0);
  std::vector<uint64_t> ids;
  for (;;) {
    ids.clear();
    auto out = (*reader)->Next(10, &ids);
    ASSERT_TRUE(out.ok()) << out.status();
    if (*out == ShardReader::Outcome::kEndOfData) break;
    for (uint64_t id : ids) ++seen[id];
    (*reader)->MarkConsumed();
  }
  for (uint64_t r = 0; r < kRecords; ++r) ASSERT_EQ(seen[r], 1) << "record " << r;
  ASSERT_TRUE((*client)->Flush(10'000).ok());
  const LeasingStats s = (*client)->sharding().leasing_stats();
  std::cout << "leased by FetchShard " << s.leased_by_fetch << ", by CompleteShard "
            << s.leased_by_combined << " (" << s.fetch_calls << " fetches, " << s.combined_calls
            << " combined calls)" << std::endl;
  EXPECT_EQ(s.leased_by_fetch + s.leased_by_combined, 100u);
  // The first two leases are fetched (nothing to complete yet); a lease is fetched alone again
  // only when the trainer outran the completion that would have leased it.
  EXPECT_GE(s.leased_by_combined, 80u);
  EXPECT_TRUE(Dataset().finished());
}

TEST_F(LostReplyTest, ATrainerReadingAheadWithoutMarkConsumedStillGetsData) {
  constexpr uint64_t kRecords = 600;
  auto client = Client::Connect(Sdk("w0"));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->sharding().RegisterDataset(Spec(kRecords, 20, 1)).ok());
  ShardReaderOptions ro;
  ro.prefetch_leases = 1;
  auto reader = ShardReader::Create(client->get(), ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int> seen(kRecords, 0);
  std::vector<uint64_t> ids;
  bool end = false;
  while (!end) {
    // Read four leases' worth (batches of 15 straddle leases) before marking anything
    // consumed: the leases read to their end cannot lease the next shard until then.
    for (int i = 0; i < 6 && !end; ++i) {
      ids.clear();
      auto out = (*reader)->Next(15, &ids, ShardReader::Blocking::kUntilData);
      ASSERT_TRUE(out.ok()) << out.status();
      end = *out == ShardReader::Outcome::kEndOfData;
      for (uint64_t id : ids) ++seen[id];
    }
    (*reader)->MarkConsumed();
  }
  for (uint64_t r = 0; r < kRecords; ++r) ASSERT_EQ(seen[r], 1) << "record " << r;
  ASSERT_TRUE((*client)->Flush(10'000).ok());
  EXPECT_TRUE(Dataset().finished());
}


// Next(kUntilData) on a reader whose handed-out records are all unconsumed, bounded by a
// deadline: a call that would wait on the reader itself fails the test instead of hanging it.
absl::StatusOr<ShardReader::Outcome> NextWithin(std::unique_ptr<ShardReader>& reader, size_t n,
                                                std::vector<uint64_t>* ids) {
  auto call = std::async(std::launch::async, [&] {
    return reader->Next(n, ids, ShardReader::Blocking::kUntilData);
  });
  if (call.wait_for(std::chrono::seconds(30)) == std::future_status::ready) return call.get();
  ADD_FAILURE() << "Next(" << n << ", kUntilData) still waiting after 30 s";
  reader.reset();  // stopping: the blocked call returns CANCELLED
  return call.get();
}

TEST_F(LostReplyTest, AReaderHoldingTheRestOfTheDataUnconsumedIsToldWaitNotLeftWaiting) {
  // Two leases hold all 40 records; both are read to their end and none is consumed. The
  // service can end the data only once they complete, which needs a MarkConsumed.
  StartReader(Spec(40, 20, 1));
  if (HasFatalFailure()) return;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 2; ++i) {
    auto out = NextWithin(reader_, 20, &ids);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(*out, ShardReader::Outcome::kRecords);
  }
  ASSERT_EQ(ids.size(), 40u);
  auto held = NextWithin(reader_, 15, &ids);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, ShardReader::Outcome::kWait);
  EXPECT_EQ(ids.size(), 40u);
  reader_->MarkConsumed();
  auto end = NextWithin(reader_, 15, &ids);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(*end, ShardReader::Outcome::kEndOfData);
  std::set<uint64_t> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), 40u);
  ASSERT_TRUE(client_->Flush(10'000).ok());
  EXPECT_TRUE(Dataset().finished());
}

TEST_F(LostReplyTest, AReaderFillingItsLeaseQuotaUnconsumedIsToldWaitNotLeftWaiting) {
  // kDefaultMaxLeasesPerWorker (4) leases read to their end, none consumed: the service answers
  // WAIT (quota) until they complete, though most of the data is still to be leased.
  StartReader(Spec(200, 10, 1));
  if (HasFatalFailure()) return;
  std::vector<uint64_t> ids;
  while (ids.size() < 4 * 10) {
    auto out = NextWithin(reader_, 10, &ids);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(*out, ShardReader::Outcome::kRecords) << "after " << ids.size() << " records";
  }
  auto quota = NextWithin(reader_, 10, &ids);
  ASSERT_TRUE(quota.ok()) << quota.status();
  EXPECT_EQ(*quota, ShardReader::Outcome::kWait);
  EXPECT_EQ(ids.size(), 40u);
  // Consumed, they complete and lease the next shards: the rest of the data, each record once.
  for (;;) {
    reader_->MarkConsumed();
    auto out = NextWithin(reader_, 10, &ids);
    ASSERT_TRUE(out.ok()) << out.status();
    if (*out == ShardReader::Outcome::kEndOfData) break;
  }
  std::set<uint64_t> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), 200u);
  EXPECT_EQ(ids.size(), 200u);
}

}  // namespace
}  // namespace pacer
