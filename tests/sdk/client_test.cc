// Client and ShardReader against a real in-process pacerd (gRPC on loopback, port from the OS,
// real RocksDB journal): every record read exactly once, batch-plan commands, progress that
// survives a pacerd restart, and bad input (wrong token, unreachable pacerd, missing id).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>
#include <set>

#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/step_timer.h"

namespace pacer {
namespace {

using testing::TempDir;
using testing::WaitFor;

class SdkClientTest : public ::testing::Test {
 protected:
  void StartPacerd(int port = 0) {
    h_.Restart();  // the same data dir and port on a restart
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
  }
  ClientOptions Options(const std::string& worker) {
    ClientOptions o;
    o.address = pacerd_->address();
    o.token = pacerd_->job_token();
    o.worker_id = worker;
    o.connect_budget_ms = 20'000;
    return o;
  }
  std::unique_ptr<Client> Connect(const std::string& worker) {
    auto c = Client::Connect(Options(worker));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  static DatasetSpec Spec(uint64_t n, uint64_t shard, uint32_t epochs = 1) {
    DatasetSpec s;
    s.set_name("train");
    s.set_num_records(n);
    s.set_shard_size(shard);
    s.set_num_epochs(epochs);
    s.set_shuffle(SHUFFLE_RECORDS);
    s.set_seed(3);
    return s;
  }
  DatasetInfo Dataset(Client& c) {
    auto l = c.sharding().ListDatasets();
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() && l->datasets_size() ? l->datasets(0) : DatasetInfo();
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true, .start = false, .adjust = [](PacerdOptions& p) {
    p.sharding.heartbeat_interval_ms = 50;
  }}};
  const testing::TempDir& dir_ = h_.dir();
  Pacerd* pacerd_ = nullptr;
};

TEST_F(SdkClientTest, ReaderDeliversEveryRecordOnceAndTheDatasetFinishes) {
  StartPacerd();
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->sharding().RegisterDataset(Spec(1000, 64, 2)).ok());
  ShardReaderOptions ro;
  ro.prefetch_leases = 2;
  auto reader = ShardReader::Create(client.get(), ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint64_t> ids;
  std::vector<uint32_t> epochs;  // the epoch of each id
  std::vector<std::vector<int>> seen(2, std::vector<int>(1000, 0));
  StepTimer timer(client.get());
  for (uint64_t step = 0;; ++step) {
    timer.BeginStep(step);
    ids.clear();
    epochs.clear();
    absl::StatusOr<ShardReader::Outcome> got;
    {
      auto wait = timer.Time(StepTimer::Phase::kDataWait);
      // Batches cross lease boundaries (64 per shard), and epochs.
      got = (*reader)->Next(50, &ids, ShardReader::Blocking::kUntilData, &epochs);
    }
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(epochs.size(), ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      ASSERT_LT(ids[k], 1000u);
      ASSERT_LT(epochs[k], 2u);
      seen[epochs[k]][ids[k]]++;
    }
    (*reader)->MarkConsumed();
    if (!ids.empty()) timer.EndStep(50, ids.size());
    if (*got == ShardReader::Outcome::kEndOfData) break;
  }
  for (uint32_t e = 0; e < 2; ++e) {
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(seen[e][i], 1) << "record " << i << " of epoch " << e;
  }
  ASSERT_TRUE(client->Flush(20'000).ok());
  const DatasetInfo info = Dataset(*client);
  EXPECT_TRUE(info.finished());
  EXPECT_EQ(info.records_done_total(), 2000u);
  EXPECT_GT(client->stats().steps_sent, 0u);
  EXPECT_EQ(client->stats().steps_rejected, 0u);
}

// Regression: a batch larger than what is left at the end of the data used to wait forever in
// kUntilData (the dataset ends only once the records in hand are consumed and reported).
TEST_F(SdkClientTest, UntilDataReturnsAShortBatchAtTheEndInsteadOfWaiting) {
  StartPacerd();
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->sharding().RegisterDataset(Spec(100, 30, 1)).ok());
  auto reader = ShardReader::Create(client.get(), ShardReaderOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint64_t> ids;
  uint64_t total = 0;
  for (int calls = 0; calls < 1000; ++calls) {
    ids.clear();
    auto got = (*reader)->Next(64, &ids, ShardReader::Blocking::kUntilData);
    ASSERT_TRUE(got.ok()) << got.status();
    total += ids.size();
    (*reader)->MarkConsumed();
    if (*got == ShardReader::Outcome::kEndOfData) break;
  }
  EXPECT_EQ(total, 100u);
  EXPECT_EQ((*reader)->records_read(), 100u);
}

// Regression (the demo's mitigated run hung): a local batch larger than a shard — what a batch
// plan gives a fast worker — spans several leases. The reader counted the leases it had read to
// their end (not yet consumed: MarkConsumed comes after the batch) against its lease budget, so a
// half-filled batch waited for a prefetch that never started. Each Next must return.
TEST_F(SdkClientTest, ABatchLargerThanAShardIsFilledAcrossLeasesInLockstep) {
  StartPacerd();
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->sharding().RegisterDataset(Spec(1'000, 30, 1)).ok());
  auto reader = ShardReader::Create(client.get(), ShardReaderOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::set<uint64_t> seen;
  uint64_t total = 0;
  int empty = 0;  // calls that returned nothing before the end of the data
  for (int calls = 0; calls < 1000; ++calls) {
    std::vector<uint64_t> ids;
    auto next = std::async(std::launch::async, [&] {
      return (*reader)->Next(100, &ids, ShardReader::Blocking::kUntilPrefetched);
    });
    if (next.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      // The reader has no way to interrupt a blocked Next: fail now rather than hang in the
      // future's destructor until ctest's timeout.
      std::fprintf(stderr, "FAILED: Next(100) with 30-record shards hung after %llu records\n",
                   static_cast<unsigned long long>(total));
      std::_Exit(1);
    }
    auto got = next.get();
    ASSERT_TRUE(got.ok()) << got.status();
    for (uint64_t id : ids) EXPECT_TRUE(seen.insert(id).second) << "record " << id << " twice";
    total += ids.size();
    (*reader)->MarkConsumed();
    if (*got == ShardReader::Outcome::kEndOfData) break;
    if (ids.empty()) ++empty;
  }
  EXPECT_EQ(total, 1'000u);
  EXPECT_EQ(seen.size(), 1'000u);
  // A step is never handed out empty while the reader's own completions lease the next shard
  // (it was 7-17 of ~12 steps when a WAIT answered before them cut every later call short).
  EXPECT_LE(empty, 1) << "calls that returned nothing before the end of the data";
}

// With on_poison: continue the data ends with a hole, and the reader says so at its end.
TEST_F(SdkClientTest, TheReaderReportsAPoisonHoleAtTheEndOfData) {
  StartPacerd();
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  DatasetSpec spec = Spec(200, 20, 1);
  spec.set_max_attempts(1);  // the first failure quarantines (one batch: batch_size 1)
  ASSERT_TRUE(client->sharding().RegisterDataset(spec).ok());
  auto first = client->sharding().Fetch("train");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(client->sharding().Release(first->lease(), 5, /*failed=*/true, "decode error").ok());
  auto reader = ShardReader::Create(client.get(), ShardReaderOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status();
  uint64_t total = 5;  // the failed lease's done prefix
  for (int calls = 0; calls < 1000; ++calls) {
    std::vector<uint64_t> ids;
    auto got = (*reader)->Next(64, &ids, ShardReader::Blocking::kUntilData);
    ASSERT_TRUE(got.ok()) << got.status();
    total += ids.size();
    (*reader)->MarkConsumed();
    if (*got == ShardReader::Outcome::kEndOfData) break;
  }
  EXPECT_EQ(total, 199u);
  EXPECT_EQ((*reader)->records_quarantined(), 1u);
}

TEST_F(SdkClientTest, BatchPlanCommandsArriveOnHeartbeatsAndSwitchAtTheEffectiveStep) {
  StartPacerd();
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  // The controller's path to the workers (controller/worker_sessions.h), as an ADJUST_BS takes.
  BatchPlan plan;
  plan.version = 7;
  plan.effective_step = 1000;
  plan.global_batch = 36;
  plan.workers.push_back(WorkerBatch{"w0", 36, 12, 3, 0});
  // After the worker registered: its registration began the run, which withdraws older plans.
  pacerd_->sessions()->SetPlan(plan, "test plan");
  ASSERT_TRUE(WaitFor([&] { return client->batch_plan().newest_version() == 7; },
                      std::chrono::seconds(20)));
  EXPECT_EQ(client->batch_plan().ForStep(999).micro_batch, 32u);  // the initial plan
  const LocalBatch& b = client->batch_plan().ForStep(1000);
  EXPECT_EQ(b.micro_batch, 12u);
  EXPECT_EQ(b.accumulation_steps, 3u);
  EXPECT_EQ(client->stats().plans_received, 1u);
}

TEST_F(SdkClientTest, ProgressQueuedWhilePacerdIsDownIsCountedAfterItRestarts) {
  StartPacerd();
  const int port = pacerd_->port();
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->sharding().RegisterDataset(Spec(100, 100)).ok());
  auto reader = ShardReader::Create(client.get(), ShardReaderOptions{});
  ASSERT_TRUE(reader.ok());
  std::vector<uint64_t> ids;
  ASSERT_TRUE((*reader)->Next(30, &ids).ok());
  (*reader)->MarkConsumed();
  ASSERT_TRUE(client->Flush(20'000).ok());
  EXPECT_EQ(Dataset(*client).records_done_current_epoch(), 30u);

  h_.Stop();  // pacerd goes away; the training thread keeps going
  pacerd_ = nullptr;
  ASSERT_TRUE((*reader)->Next(40, &ids).ok());
  const auto t0 = std::chrono::steady_clock::now();
  (*reader)->MarkConsumed();  // never blocks on the network
  // Only queues in memory. A wait on pacerd would be an RPC attempt bounded by rpc_timeout_ms
  // (10 s); the bound leaves room for the loaded CI machine descheduling this thread (a 50 ms
  // bound was within reach of that).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(client->Flush(300).code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(WaitFor([&] { return client->stats().heartbeat_failures > 0 ||
                                   client->stats().heartbeats_ok > 0; },
                      std::chrono::seconds(20)));

  StartPacerd(port);  // same data dir, same port: recovered from the journal
  ASSERT_TRUE(client->Flush(60'000).ok());
  EXPECT_TRUE(client->health().ok()) << client->health();
  EXPECT_EQ(Dataset(*client).records_done_current_epoch(), 70u);
}

TEST_F(SdkClientTest, AWrongTokenFailsAtOnceWithAClearError) {
  StartPacerd();
  ClientOptions o = Options("w0");
  o.token = "not-the-token";
  const auto t0 = std::chrono::steady_clock::now();
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated) << c.status();
  EXPECT_NE(c.status().message().find("w0"), std::string::npos) << c.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));  // no retry loop
}

TEST_F(SdkClientTest, AnUnreachablePacerdIsRetriedWithBackoffThenReported) {
  // A port that was just free: nothing listens there.
  StartPacerd();
  const std::string address = pacerd_->address();
  h_.Stop();
  pacerd_ = nullptr;
  ClientOptions o;
  o.address = address;
  o.token = "t";
  o.worker_id = "w0";
  o.connect_budget_ms = 1'500;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = Client::Connect(o);
  const auto spent = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find(address), std::string::npos) << c.status();
  EXPECT_GE(spent, std::chrono::milliseconds(1'400));  // it did retry for the budget
  EXPECT_LT(spent, std::chrono::seconds(30));          // and did not hang
}

TEST_F(SdkClientTest, MissingSettingsAreNamed) {
  ClientOptions o;
  o.token = "t";
  ::unsetenv("PACER_WORKER_ID");
  auto c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("PACER_WORKER_ID"), std::string::npos) << c.status();
  ClientOptions e;
  ::setenv("PACER_WORKER_ID", "from-env", 1);
  ::unsetenv("PACER_TOKEN");
  e.token_file = "/nonexistent/job.token";
  auto c2 = Client::Connect(e);
  ::unsetenv("PACER_WORKER_ID");
  EXPECT_EQ(c2.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c2.status().message().find("/nonexistent/job.token"), std::string::npos) << c2.status();
}

TEST_F(SdkClientTest, AReaderOfAnUnknownDatasetReportsNotFound) {
  StartPacerd();
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  ShardReaderOptions ro;
  ro.dataset = "nope";
  auto reader = ShardReader::Create(client.get(), ro);
  ASSERT_TRUE(reader.ok());
  std::vector<uint64_t> ids;
  auto got = (*reader)->Next(10, &ids);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
}

// Sets (or, for nullptr, unsets) environment variables for one test and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<std::string, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      if (v) {
        ::setenv(k.c_str(), v, 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// torchrun's environment: without PACER_WORKER_ID the id is "w<RANK>", the job and
// run id come from TORCHELASTIC_RUN_ID; PACER_* and explicit fields win.
TEST(ClientOptionsTest, IdentityComesFromTorchrunsEnvironmentWhenPacerVariablesAreAbsent) {
  ScopedEnv env({{"PACER_WORKER_ID", nullptr}, {"PACER_JOB", nullptr}, {"PACER_RUN_ID", nullptr},
                 {"PACER_ADDR", nullptr}, {"PACER_TOKEN", "t"}, {"RANK", "3"}, {"LOCAL_RANK", "1"},
                 {"GROUP_RANK", "1"}, {"TORCHELASTIC_RUN_ID", "run-42"}});
  ClientOptions o;
  ASSERT_TRUE(o.Resolve().ok());
  EXPECT_EQ(o.worker_id, "w3");
  EXPECT_EQ(o.job, "run-42");
  EXPECT_EQ(o.run_id, "run-42");
  EXPECT_EQ(o.address, "127.0.0.1:7070");
  {
    ScopedEnv pacer({{"PACER_WORKER_ID", "trainer-a"}, {"PACER_JOB", "j"}, {"PACER_RUN_ID", "r7"}});
    ClientOptions p;
    ASSERT_TRUE(p.Resolve().ok());
    EXPECT_EQ(p.worker_id, "trainer-a");
    EXPECT_EQ(p.job, "j");
    EXPECT_EQ(p.run_id, "r7");
    ClientOptions explicit_id;
    explicit_id.worker_id = "flag-id";
    ASSERT_TRUE(explicit_id.Resolve().ok());
    EXPECT_EQ(explicit_id.worker_id, "flag-id");
  }
  {
    ScopedEnv leading_zero({{"RANK", "007"}, {"TORCHELASTIC_RUN_ID", "none"}});
    ClientOptions z;
    ASSERT_TRUE(z.Resolve().ok());
    EXPECT_EQ(z.worker_id, "w7");
    EXPECT_EQ(z.run_id, "");  // torchrun's default "none" names no run
    EXPECT_EQ(z.job, "");
  }
  for (const char* bad : {"-1", "abc", "1.5", "99999999999"}) {
    ScopedEnv b({{"RANK", bad}});
    ClientOptions x;
    absl::Status s = x.Resolve();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("RANK='" + std::string(bad) + "'"), std::string::npos) << s;
    EXPECT_NE(s.message().find("PACER_WORKER_ID"), std::string::npos) << s;
  }
}

TEST(ClientOptionsTest, MissingIdentityNamesTheVariablesOfEverySdkLanguage) {
  ScopedEnv env({{"PACER_WORKER_ID", nullptr}, {"RANK", nullptr}, {"PACER_TOKEN", "t"}});
  ClientOptions o;
  absl::Status s = o.Resolve();
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const std::string m(s.message());
  // The variables first (what a Python or C user sets), the C++ flag only as an aside.
  EXPECT_EQ(m.rfind("worker id missing: set PACER_WORKER_ID", 0), 0u) << m;
  EXPECT_NE(m.find("torchrun"), std::string::npos) << m;
  EXPECT_NE(m.find("RANK"), std::string::npos) << m;
  ScopedEnv no_token({{"RANK", "0"}, {"PACER_TOKEN", nullptr}});
  ClientOptions t;
  s = t.Resolve();  // torchrun gives no token, and none is invented (loopback or not)
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()).rfind("job token missing: set PACER_TOKEN", 0), 0u) << s;
}

// End to end: a worker started the torchrun way registers with pacerd as w<RANK>.
TEST_F(SdkClientTest, AWorkerUnderTorchrunRegistersAsWRank) {
  StartPacerd();
  ScopedEnv env({{"PACER_WORKER_ID", nullptr}, {"RANK", "2"}, {"TORCHELASTIC_RUN_ID", "run-e2e"}});
  ClientOptions o;
  o.address = pacerd_->address();
  o.token = pacerd_->job_token();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->worker_id(), "w2");
  EXPECT_EQ((*c)->options().run_id, "run-e2e");
}

// ShardReader::ReleaseAll: an excluded worker hands back its current lease (part read) and its
// prefetched one; the other worker reads the rest of the epoch. Every record is delivered to
// exactly one of them and counted once; the released worker leases nothing until Resume().
// Two workers that honour exclusion ("a" and "b", 50 ms heartbeats) on a pacerd of the test
// on the real clock, and a dataset of kRecords records in shards of 100 (one epoch).
class ShardReaderReleaseTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRecords = 1000;
  void SetUp() override {
    ASSERT_TRUE(d_.ok());
    a = Connect("a");
    b = Connect("b");
    ASSERT_TRUE(a && b);
    DatasetSpec spec;
    spec.set_name("train");
    spec.set_num_records(kRecords);
    spec.set_shard_size(100);
    spec.set_num_epochs(1);
    ASSERT_TRUE(a->sharding().RegisterDataset(spec).ok());
  }
  std::unique_ptr<Client> Connect(const std::string& id) {
    ClientOptions co;
    co.address = d_.address();
    co.token = d_.job_token();
    co.worker_id = id;
    co.heartbeat_interval_ms = 50;
    co.honors_exclusion = true;
    auto c = Client::Connect(co);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  testing::PacerdHarness d_{{.real_clock = true, .adjust = [](PacerdOptions& o) {
                               o.sharding.heartbeat_interval_ms = 50;
                             }}};
  std::unique_ptr<Client> a, b;
};

TEST_F(ShardReaderReleaseTest, ReleasedLeasesGoToTheOtherWorkerAndEveryRecordCountsOnce) {
  using namespace std::chrono_literals;
  ShardReaderOptions ro;
  ro.prefetch_leases = 2;
  auto ra = ShardReader::Create(a.get(), ro);
  ASSERT_TRUE(ra.ok()) << ra.status();

  std::multiset<uint64_t> seen;
  std::vector<uint64_t> ids;
  auto out = (*ra)->Next(130, &ids);  // one lease and 30 of the next
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(WaitFor([&] {
    std::vector<uint64_t> more;
    auto r = (*ra)->Next(5, &more);
    ids.insert(ids.end(), more.begin(), more.end());
    return r.ok() && ids.size() >= 135;
  }, 10s));
  seen.insert(ids.begin(), ids.end());
  // Let the prefetcher fill up so there is a prefetched lease to hand back too.
  ASSERT_TRUE(WaitFor([&] { return (*ra)->leases_read() >= 2; }, 10s));
  auto released = (*ra)->ReleaseAll(10'000);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_GE(*released, 1) << "the part-read lease goes back";
  EXPECT_TRUE((*ra)->holding_off());
  std::vector<uint64_t> none;
  auto held_off = (*ra)->Next(10, &none, ShardReader::Blocking::kUntilData);
  ASSERT_TRUE(held_off.ok());
  EXPECT_EQ(*held_off, ShardReader::Outcome::kWait) << "no lease while held off";
  EXPECT_TRUE(none.empty());

  auto rb = ShardReader::Create(b.get(), ShardReaderOptions());
  ASSERT_TRUE(rb.ok());
  for (;;) {
    std::vector<uint64_t> got;
    auto r = (*rb)->Next(64, &got, ShardReader::Blocking::kUntilData);
    ASSERT_TRUE(r.ok()) << r.status();
    seen.insert(got.begin(), got.end());
    (*rb)->MarkConsumed();
    if (*r == ShardReader::Outcome::kEndOfData) break;
  }
  ASSERT_TRUE(b->Flush(10'000).ok());
  EXPECT_EQ(seen.size(), kRecords) << "every record delivered once (none twice)";
  EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), kRecords);
  auto ds = a->sharding().ListDatasets();
  ASSERT_TRUE(ds.ok());
  ASSERT_EQ(ds->datasets_size(), 1);
  EXPECT_TRUE(ds->datasets(0).finished());
  EXPECT_EQ(ds->datasets(0).records_done_total(), kRecords) << "each record counted once";
  (*ra)->Resume();
  EXPECT_FALSE((*ra)->holding_off());
  a->Close();
  b->Close();
}

// ShardReader::ReleaseAll(timeout, trained_through): a worker excluded in the middle of a step
// abandons it (the step line, Client::ReportStepPastLine) -- the step's records were handed out
// but not trained. They go back uncounted, across a lease boundary, and the other worker trains
// them: every record trained exactly once, the service's count agreeing.
TEST_F(ShardReaderReleaseTest, AnAbandonedStepsRecordsGoBackUncountedAndTheOtherWorkerTrainsThem) {
  using namespace std::chrono_literals;
  auto ra = ShardReader::Create(a.get(), ShardReaderOptions());
  ASSERT_TRUE(ra.ok()) << ra.status();
  auto read = [&](size_t n, std::vector<uint64_t>* ids) {
    ASSERT_TRUE(WaitFor([&] {
      std::vector<uint64_t> more;
      auto r = (*ra)->Next(n - ids->size(), &more);
      ids->insert(ids->end(), more.begin(), more.end());
      return r.ok() && ids->size() >= n;
    }, 10s));
  };
  std::vector<uint64_t> trained, abandoned;
  read(60, &trained);  // a step trained
  (*ra)->MarkConsumed();
  const uint64_t step_from = (*ra)->records_read();
  ASSERT_EQ(step_from, 60u);
  read(60, &abandoned);  // the next step's records: the rest of the first lease and 20 of the next
  auto released = (*ra)->ReleaseAll(10'000, step_from);
  ASSERT_TRUE(released.ok()) << released.status();
  auto counted = [&] {
    auto ds = a->sharding().ListDatasets();
    return ds.ok() && ds->datasets_size() == 1 ? ds->datasets(0).records_done_total() : ~uint64_t{0};
  };
  EXPECT_EQ(counted(), 60u) << "only the trained step is counted";

  auto rb = ShardReader::Create(b.get(), ShardReaderOptions());
  ASSERT_TRUE(rb.ok());
  std::multiset<uint64_t> by_b;
  for (;;) {
    std::vector<uint64_t> got;
    auto r = (*rb)->Next(64, &got, ShardReader::Blocking::kUntilData);
    ASSERT_TRUE(r.ok()) << r.status();
    by_b.insert(got.begin(), got.end());
    (*rb)->MarkConsumed();
    if (*r == ShardReader::Outcome::kEndOfData) break;
  }
  ASSERT_TRUE(b->Flush(10'000).ok());
  for (uint64_t id : abandoned) EXPECT_EQ(by_b.count(id), 1u) << "abandoned record " << id << " trained by b once";
  for (uint64_t id : trained) EXPECT_EQ(by_b.count(id), 0u) << "record " << id << " trained twice";
  std::set<uint64_t> all(by_b.begin(), by_b.end());
  all.insert(trained.begin(), trained.end());
  EXPECT_EQ(all.size(), kRecords) << "every record trained";
  EXPECT_EQ(by_b.size() + trained.size(), kRecords) << "none twice";
  EXPECT_EQ(counted(), kRecords) << "each record counted once";
  a->Close();
  b->Close();
}

}  // namespace
}  // namespace pacer
