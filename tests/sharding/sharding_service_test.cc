// Service-level tests over real gRPC on loopback (port 0) with a real RocksDB journal, on a
// simulated clock: zombies, authentication, bad input, recovery, corruption, group commit.
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <future>
#include <thread>

#include "common/status.h"
#include "tests/testing/pacerd_harness.h"
#include "worker_sdk/sharding_client.h"

namespace pacer {
namespace {

using testing::TempDir;

class ShardingServiceTest : public ::testing::Test {
 protected:
  // Starts pacerd in the harness (again, on the same data dir and port: a restart).
  void StartPacerd() {
    h_.Restart();
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
  }
  static testing::HarnessOptions Options() {
    testing::HarnessOptions o;
    o.start = false;
    o.adjust = [](PacerdOptions& p) {
      p.sharding.lease_timeout_ms = 1000;
      p.sharding.worker_timeout_ms = 60'000;
      p.sharding.snapshot_every = 25;
    };
    return o;
  }
  std::unique_ptr<ShardingClient> Connect(const std::string& worker, std::string token = "") {
    ShardingClientOptions o;
    o.address = pacerd_->address();
    o.token = token.empty() ? pacerd_->job_token() : token;
    o.worker_id = worker;
    o.retry_budget_ms = 5000;
    auto c = ShardingClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  static DatasetSpec Spec(uint64_t n, uint64_t shard) {
    DatasetSpec s;
    s.set_name("train");
    s.set_num_records(n);
    s.set_shard_size(shard);
    s.set_num_epochs(1);
    return s;
  }
  // Leases expired so far, from pacerd's counter. The harness's Advance() runs production's
  // housekeeping step, which expires overdue leases; the test calls ExpireOverdue() once more
  // (nothing left to expire, or at most the one) and checks the total.
  double LeasesExpired() {
    const std::string text = pacerd_->metrics()->RenderText();
    const std::string name = "\npacer_sharding_leases_expired_total ";
    const auto pos = text.find(name);
    return pos == std::string::npos ? 0 : std::stod(text.substr(pos + name.size()));
  }
  void ExpireOverdueLeases() {
    EXPECT_LE(pacerd_->sharding()->ExpireOverdue(), 1);
    EXPECT_EQ(LeasesExpired(), 1);
  }
  uint64_t JournalSeq(ShardingClient& c) {
    auto l = c.ListDatasets();
    EXPECT_TRUE(l.ok());
    return l.ok() ? l->journal_seq() : 0;
  }

  testing::PacerdHarness h_{Options()};
  Pacerd* pacerd_ = nullptr;
};

TEST_F(ShardingServiceTest, ZombieWorkerReportsAreRejectedAndNothingCountsTwice) {
  StartPacerd();
  auto a = Connect("a");
  ASSERT_TRUE(a->RegisterDataset(Spec(100, 10)).ok());
  auto fa = a->Fetch("train");
  ASSERT_TRUE(fa.ok());
  const Lease la = fa->lease();
  ASSERT_EQ(la.begin(), 0u);
  ASSERT_TRUE(a->ReportProgress(la, 4).ok());

  // `a` is cut off: its lease runs out and the suffix goes to `b`.
  h_.Advance(1500);
  auto b = Connect("b");
  ExpireOverdueLeases();
  auto fb = b->Fetch("train");
  ASSERT_TRUE(fb.ok());
  EXPECT_EQ(fb->lease().begin(), 4u);
  EXPECT_EQ(fb->lease().end(), 10u);
  EXPECT_GT(fb->lease().fencing_token(), la.fencing_token());

  // The zombie keeps reporting: refused, nothing changes.
  const uint64_t seq = JournalSeq(*b);
  auto r = a->ReportProgress(la, 8);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(a->Complete(la).code(), absl::StatusCode::kFailedPrecondition);
  Lease forged = la;
  forged.set_lease_id(fb->lease().lease_id());  // b's lease with a's token: fenced too
  EXPECT_EQ(a->ReportProgress(forged, 2).status().code(), absl::StatusCode::kFailedPrecondition);
  // A retry of what was counted before the cut is answered truthfully (idempotent).
  auto again = a->ReportProgress(la, 4);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 4u);
  EXPECT_EQ(JournalSeq(*b), seq);

  ASSERT_TRUE(b->Complete(fb->lease()).ok());
  for (;;) {
    auto f = b->Fetch("train");
    ASSERT_TRUE(f.ok());
    if (f->outcome() == FetchShardResponse::END_OF_DATA) break;
    ASSERT_EQ(f->outcome(), FetchShardResponse::LEASED);
    ASSERT_TRUE(b->Complete(f->lease()).ok());
  }
  auto list = b->ListDatasets();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->datasets(0).finished());
  EXPECT_EQ(list->datasets(0).records_done_total(), 100u);
}

TEST_F(ShardingServiceTest, EveryCallIsAuthenticatedAndRolesAreEnforced) {
  StartPacerd();
  auto channel = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
  auto stub = ShardingService::NewStub(channel);
  ListDatasetsResponse resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->ListDatasets(&ctx, ListDatasetsRequest(), &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "not-the-token");
    EXPECT_EQ(stub->ListDatasets(&ctx, ListDatasetsRequest(), &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  auto w = Connect("w0");
  SetAllocationRequest req;
  req.mutable_allocation()->set_worker_id("w0");
  req.mutable_allocation()->set_weight(0.5);
  SetAllocationResponse out;
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->job_token());
    EXPECT_EQ(stub->SetAllocation(&ctx, req, &out).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, pacerd_->admin_token());
    EXPECT_TRUE(stub->SetAllocation(&ctx, req, &out).ok());
  }
}

TEST_F(ShardingServiceTest, BadInputGetsAClearErrorAndChangesNothing) {
  StartPacerd();
  auto w = Connect("w0");
  ASSERT_TRUE(w->RegisterDataset(Spec(100, 10)).ok());
  auto f = w->Fetch("train");
  ASSERT_TRUE(f.ok());
  const uint64_t seq = JournalSeq(*w);

  auto unknown = w->Fetch("nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("nope"), std::string::npos);
  DatasetSpec bad = Spec(0, 10);
  auto r = w->RegisterDataset(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("num_records"), std::string::npos) << r.status();
  EXPECT_EQ(w->RegisterDataset(Spec(101, 10)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w->ReportProgress(f->lease(), 11).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Release(f->lease(), 99, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->RestoreCheckpoint("never-saved").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(w->SaveCheckpoint("bad tag!").code(), absl::StatusCode::kInvalidArgument);
  DatasetSpec huge = Spec(10, 10);
  huge.set_name("big");
  for (int i = 0; i < 200'000; ++i) {
    auto* file = huge.mutable_files()->add_files();
    file->set_path(std::string(400, 'x'));
    file->set_num_records(1);
  }
  EXPECT_FALSE(w->RegisterDataset(huge).ok());  // over the 64 MiB message limit
  // A fetch by an unregistered worker through the raw stub.
  grpc::ClientContext ctx;
  AttachToken(&ctx, pacerd_->job_token());
  FetchShardRequest req;
  req.set_worker_id("ghost");
  req.set_dataset("train");
  FetchShardResponse resp;
  EXPECT_EQ(w->stub()->FetchShard(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(JournalSeq(*w), seq);  // nothing was journaled
}

TEST_F(ShardingServiceTest, RestartRecoversTheSameStateFromSnapshotAndJournal) {
  StartPacerd();
  {
    auto w = Connect("w0");
    ASSERT_TRUE(w->RegisterDataset(Spec(1000, 7)).ok());
    for (int i = 0; i < 40; ++i) {  // > snapshot_every updates
      auto f = w->Fetch("train");
      ASSERT_TRUE(f.ok());
      ASSERT_TRUE(w->ReportProgress(f->lease(), 3).ok());
      if (i % 3) {
        ASSERT_TRUE(w->Complete(f->lease()).ok());
      } else {
        ASSERT_TRUE(w->Release(f->lease(), 3, false).ok());
      }
    }
    ASSERT_TRUE(w->SaveCheckpoint("ck").ok());
  }
  const ShardingSnapshot before = pacerd_->sharding()->SnapshotForTest();
  EXPECT_GE(pacerd_->sharding()->stats().journal.snapshots, 1u);
  StartPacerd();
  const ShardingSnapshot after = pacerd_->sharding()->SnapshotForTest();
  EXPECT_EQ(before.SerializeAsString(), after.SerializeAsString());
  EXPECT_LT(pacerd_->sharding()->stats().recovered_updates, 40u);  // only the tail was replayed
}

TEST_F(ShardingServiceTest, PrometheusMetricsCountWhatHappened) {
  StartPacerd();
  auto w = Connect("w0");
  ASSERT_TRUE(w->RegisterDataset(Spec(100, 10)).ok());
  auto f = w->Fetch("train");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(w->ReportProgress(f->lease(), 4).ok());
  h_.Advance(1500);  // w0 goes silent: its lease expires and the suffix is requeued
  ExpireOverdueLeases();
  const std::string text = pacerd_->metrics()->RenderText();
  auto value = [&](const std::string& name) -> double {
    auto pos = text.find("\n" + name + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(text.substr(pos + name.size() + 2));
  };
  EXPECT_EQ(value("pacer_sharding_leases_granted_total{dataset=\"train\"}"), 1);
  EXPECT_EQ(value("pacer_sharding_leases_expired_total"), 1);
  EXPECT_EQ(value("pacer_sharding_requeues_total{dataset=\"train\"}"), 1);
  EXPECT_EQ(value("pacer_sharding_records_done_total{dataset=\"train\"}"), 4);
  EXPECT_EQ(value("pacer_sharding_leases_active{dataset=\"train\"}"), 0);
  EXPECT_EQ(value("pacer_sharding_oldest_lease_age_seconds{dataset=\"train\"}"), 0);
  EXPECT_EQ(value("pacer_sharding_workers{state=\"silent\"}"), 1);  // w0, silent for 1.5 s
  EXPECT_GE(value("pacer_journal_fsync_seconds_count{journal=\"sharding\"}"), 3);  // one per write batch
  EXPECT_GE(value("pacer_journal_fsyncs_total{journal=\"sharding\"}"), 3);
  EXPECT_GT(value("pacer_journal_bytes_total{journal=\"sharding\"}"), 0);
  EXPECT_GE(value("pacer_sharding_recovery_seconds"), 0);
}

TEST(JournalTest, CorruptOrMissingEntriesAreDataLossNotACrash) {
  TempDir dir;
  const std::string path = dir.Sub("journal");
  auto noop_snapshot = [](const ShardingSnapshot&) { return absl::OkStatus(); };
  auto noop_update = [](const Update&) { return absl::OkStatus(); };
  {
    auto j = ShardingJournal::Open({path, true}, noop_snapshot, noop_update);
    ASSERT_TRUE(j.ok()) << j.status();
    for (uint64_t seq = 1; seq <= 5; ++seq) {
      Update u;
      u.set_seq(seq);
      u.mutable_worker_lost()->set_worker_id("w");
      (*j)->Append(u);
      ASSERT_TRUE((*j)->Flush().ok());  // one record per update: keys j1..j5
    }
  }
  auto key = [](uint64_t seq) {
    std::string k(9, '\0');
    k[0] = 'j';
    for (int i = 0; i < 8; ++i) k[1 + i] = static_cast<char>((seq >> (56 - 8 * i)) & 0xff);
    return k;
  };
  auto poke = [&](const std::function<void(rocksdb::DB*)>& fn) {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path, &db).ok());
    fn(db);
    delete db;
  };
  int replayed = 0;
  auto count = [&](const Update&) {
    ++replayed;
    return absl::OkStatus();
  };
  {
    auto j = ShardingJournal::Open({path, true}, noop_snapshot, count);
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(replayed, 5);
  }
  poke([&](rocksdb::DB* db) { db->Put(rocksdb::WriteOptions(), key(3), "\xff\xff garbage"); });
  auto corrupt = ShardingJournal::Open({path, true}, noop_snapshot, noop_update);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(corrupt.status().message().find("update 3"), std::string::npos) << corrupt.status();
  poke([&](rocksdb::DB* db) { db->Delete(rocksdb::WriteOptions(), key(3)); });
  auto gap = ShardingJournal::Open({path, true}, noop_snapshot, noop_update);
  ASSERT_FALSE(gap.ok());
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(gap.status().message().find("gap"), std::string::npos) << gap.status();
}

TEST(GroupCommitTest, ConcurrentUpdatesShareFsyncs) {
  TempDir dir;
  ShardingServiceOptions o;
  o.data_dir = dir.Sub("journal");
  SimulatedClock clock;
  auto svc = ShardingServiceImpl::Open(o, &clock, nullptr);
  ASSERT_TRUE(svc.ok()) << svc.status();
  auto call = [&](auto method, const auto& req, auto* resp) {
    std::promise<absl::Status> p;
    ((**svc).*method)(req, resp, [&](absl::Status s) { p.set_value(s); });
    return p.get_future().get();
  };
  RegisterDatasetRequest rd;
  *rd.mutable_spec() = DatasetSpec();
  rd.mutable_spec()->set_name("train");
  rd.mutable_spec()->set_num_records(1'000'000);
  rd.mutable_spec()->set_shard_size(1);
  RegisterDatasetResponse rdr;
  ASSERT_TRUE(call(&ShardingServiceImpl::RegisterDataset, rd, &rdr).ok());
  constexpr int kThreads = 32, kPairs = 30;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      RegisterWorkerRequest rw;
      rw.set_worker_id("w" + std::to_string(t));
      RegisterWorkerResponse rwr;
      if (!call(&ShardingServiceImpl::RegisterWorker, rw, &rwr).ok()) failures++;
      for (int i = 0; i < kPairs; ++i) {
        FetchShardRequest f;
        f.set_worker_id(rw.worker_id());
        f.set_incarnation(rwr.incarnation());
        f.set_dataset("train");
        FetchShardResponse fr;
        if (!call(&ShardingServiceImpl::FetchShard, f, &fr).ok()) failures++;
        CompleteShardRequest c;
        c.set_worker_id(rw.worker_id());
        c.set_incarnation(rwr.incarnation());
        c.set_lease_id(fr.lease().lease_id());
        c.set_fencing_token(fr.lease().fencing_token());
        CompleteShardResponse cr;
        if (!call(&ShardingServiceImpl::CompleteShard, c, &cr).ok()) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const auto stats = (*svc)->stats();
  const uint64_t updates = stats.journal.appends;
  EXPECT_EQ(updates, 1u + kThreads + 2u * kThreads * kPairs);
  // Every update was fsync'd before its reply, and concurrent ones shared an fsync.
  EXPECT_LT(stats.journal.batches, updates);
  std::cout << updates << " updates in " << stats.journal.batches << " fsyncs" << std::endl;
}

}  // namespace
}  // namespace pacer
