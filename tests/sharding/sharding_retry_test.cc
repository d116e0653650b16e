// The service's answers to retries, lost replies and bad input, in process (ShardingServiceImpl
// with a real RocksDB journal, a simulated clock), each the property a client relies on, not
// merely that a call returned.
#include <gtest/gtest.h>

#include <future>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "sharding_service/sharding_service.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::TempDir;

class ShardingRetryTest : public ::testing::Test {
 protected:
  void Open() {
    ShardingServiceOptions o;
    o.data_dir = dir_.Sub("journal");
    o.lease_timeout_ms = 30'000;
    o.snapshot_every = 40;  // snapshots happen inside every test: replay must agree with them
    o.sync = false;         // semantics, not durability (the journal tests cover fsync)
    auto s = ShardingServiceImpl::Open(o, &clock_, nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    svc_ = std::move(*s);
  }
  void Reopen() {
    const ShardingSnapshot before = svc_->SnapshotForTest();
    svc_.reset();
    Open();
    const ShardingSnapshot after = svc_->SnapshotForTest();
    ASSERT_EQ(before.SerializeAsString(), after.SerializeAsString())
        << "replay differs from the live state";
  }
  // Calls one service method synchronously.
  template <typename Method, typename Req, typename Resp>
  absl::Status Call(Method method, const Req& req, Resp* resp) {
    return CallAndWait(*svc_, method, req, resp);
  }
  uint64_t Register(const std::string& worker) {
    RegisterWorkerRequest req;
    req.set_worker_id(worker);
    RegisterWorkerResponse resp;
    EXPECT_TRUE(Call(&ShardingServiceImpl::RegisterWorker, req, &resp).ok());
    last_registration_ = resp;
    return resp.incarnation();
  }
  void Dataset(uint64_t records, uint64_t shard, uint32_t epochs = 1, uint32_t max_attempts = 0) {
    RegisterDatasetRequest req;
    req.mutable_spec()->set_name("train");
    req.mutable_spec()->set_num_records(records);
    req.mutable_spec()->set_shard_size(shard);
    req.mutable_spec()->set_num_epochs(epochs);
    req.mutable_spec()->set_max_attempts(max_attempts);
    RegisterDatasetResponse resp;
    ASSERT_TRUE(Call(&ShardingServiceImpl::RegisterDataset, req, &resp).ok());
  }
  FetchShardResponse Fetch(const std::string& worker, uint64_t inc, uint64_t request_id = 0) {
    FetchShardRequest req;
    req.set_worker_id(worker);
    req.set_incarnation(inc);
    req.set_dataset("train");
    req.set_request_id(request_id);
    FetchShardResponse resp;
    EXPECT_TRUE(Call(&ShardingServiceImpl::FetchShard, req, &resp).ok());
    return resp;
  }
  absl::Status Complete(const std::string& worker, uint64_t inc, const Lease& l,
                        CompleteShardResponse* resp = nullptr, uint64_t next_request = 0) {
    CompleteShardRequest req;
    req.set_worker_id(worker);
    req.set_incarnation(inc);
    req.set_lease_id(l.lease_id());
    req.set_fencing_token(l.fencing_token());
    if (next_request != 0) {
      req.set_next_dataset("train");
      req.set_next_request_id(next_request);
    }
    CompleteShardResponse ignored;
    return Call(&ShardingServiceImpl::CompleteShard, req, resp ? resp : &ignored);
  }
  absl::Status Progress(const std::string& worker, uint64_t inc, const Lease& l, uint64_t done) {
    ProgressRequest req;
    req.set_worker_id(worker);
    req.set_incarnation(inc);
    req.set_lease_id(l.lease_id());
    req.set_fencing_token(l.fencing_token());
    req.set_records_done(done);
    ProgressResponse resp;
    return Call(&ShardingServiceImpl::ReportProgress, req, &resp);
  }
  absl::Status Release(const std::string& worker, uint64_t inc, const Lease& l, uint64_t done) {
    ReleaseShardRequest req;
    req.set_worker_id(worker);
    req.set_incarnation(inc);
    req.set_lease_id(l.lease_id());
    req.set_fencing_token(l.fencing_token());
    req.set_records_done(done);
    ReleaseShardResponse resp;
    return Call(&ShardingServiceImpl::ReleaseShard, req, &resp);
  }
  DatasetInfo Info() {
    ListDatasetsRequest req;
    ListDatasetsResponse resp;
    EXPECT_TRUE(Call(&ShardingServiceImpl::ListDatasets, req, &resp).ok());
    EXPECT_EQ(resp.datasets_size(), 1);
    return resp.datasets_size() ? resp.datasets(0) : DatasetInfo();
  }

  TempDir dir_;
  SimulatedClock clock_;
  std::unique_ptr<ShardingServiceImpl> svc_;
  RegisterWorkerResponse last_registration_;
};

// A fetch whose reply was lost is retried with the same request id and gets the same
// lease; a lease whose reply never arrived (the worker gave up) is released by the next
// heartbeat, so the epoch finishes instead of waiting for ever.
TEST_F(ShardingRetryTest, LostFetchReplyNeitherLeaksALeaseNorStallsTheEpoch) {
  Open();
  Dataset(100, 10);
  const uint64_t inc = Register("w");
  const FetchShardResponse first = Fetch("w", inc, /*request_id=*/1);
  ASSERT_EQ(first.outcome(), FetchShardResponse::LEASED);
  const FetchShardResponse retry = Fetch("w", inc, 1);
  ASSERT_EQ(retry.outcome(), FetchShardResponse::LEASED);
  EXPECT_EQ(retry.lease().lease_id(), first.lease().lease_id()) << "a retry leased a second shard";
  EXPECT_EQ(Info().active_leases(), 1u);
  // The retry survives a restart (the request id is journaled with the lease).
  Reopen();
  EXPECT_EQ(Fetch("w", inc, 1).lease().lease_id(), first.lease().lease_id());

  // Request 1's reply is "lost": the worker never learns of that lease and consumes the rest.
  uint64_t request = 1;
  std::set<uint64_t> seen;
  for (;;) {
    const FetchShardResponse r = Fetch("w", inc, ++request);
    if (r.outcome() != FetchShardResponse::LEASED) {
      ASSERT_EQ(r.outcome(), FetchShardResponse::WAIT) << "the hidden lease still holds 10 records";
      break;
    }
    ASSERT_TRUE(Complete("w", inc, r.lease()).ok());
    seen.insert(r.lease().lease_id());
  }
  EXPECT_EQ(Info().records_done_current_epoch(), 90u);
  // Its heartbeat lists what it holds (nothing) and the calls that ended: the lost lease goes.
  HeartbeatRequest hb;
  hb.set_worker_id("w");
  hb.set_incarnation(inc);
  hb.set_reports_held_leases(true);
  hb.set_last_fetch_request_id(request);
  HeartbeatResponse hr;
  ASSERT_TRUE(Call(&ShardingServiceImpl::Heartbeat, hb, &hr).ok());
  ASSERT_EQ(hr.released_unknown_leases_size(), 1);
  EXPECT_EQ(hr.released_unknown_leases(0), first.lease().lease_id());
  const FetchShardResponse again = Fetch("w", inc, ++request);
  ASSERT_EQ(again.outcome(), FetchShardResponse::LEASED);
  EXPECT_EQ(again.lease().begin(), first.lease().begin());
  ASSERT_TRUE(Complete("w", inc, again.lease()).ok());
  EXPECT_EQ(Fetch("w", inc, ++request).outcome(), FetchShardResponse::END_OF_DATA);
  EXPECT_EQ(Info().records_done_total(), 100u);
  Reopen();
}

// A heartbeat never releases a lease whose fetch is still in flight (its request id is above
// last_fetch_request_id), nor one the worker lists, nor one without a request id.
TEST_F(ShardingRetryTest, HeldLeaseReportSparesLeasesInFlightAndListed) {
  Open();
  Dataset(100, 10);
  const uint64_t inc = Register("w");
  const Lease listed = Fetch("w", inc, 1).lease();
  const Lease in_flight = Fetch("w", inc, 2).lease();
  const Lease legacy = Fetch("w", inc, 0).lease();
  HeartbeatRequest hb;
  hb.set_worker_id("w");
  hb.set_incarnation(inc);
  hb.set_reports_held_leases(true);
  hb.add_held_leases(listed.lease_id());
  hb.set_last_fetch_request_id(1);
  HeartbeatResponse hr;
  ASSERT_TRUE(Call(&ShardingServiceImpl::Heartbeat, hb, &hr).ok());
  EXPECT_EQ(hr.released_unknown_leases_size(), 0);
  EXPECT_EQ(Info().active_leases(), 3u);
  (void)in_flight;
  (void)legacy;
}

// Retries of leases that ended 1, 8 and 1 000 leases earlier are answered
// truthfully — OK when the records were counted, FAILED_PRECONDITION when they were not.
TEST_F(ShardingRetryTest, LateRetriesAreAnsweredTruthfully) {
  Open();
  Dataset(20'000, 10);
  const uint64_t inc = Register("w");
  std::vector<Lease> completed, released;
  for (int i = 0; i < 1'010; ++i) {
    const Lease l = Fetch("w", inc).lease();
    if (i % 2 == 0) {
      ASSERT_TRUE(Complete("w", inc, l).ok());
      completed.push_back(l);
    } else {
      ASSERT_TRUE(Progress("w", inc, l, 4).ok());
      ASSERT_TRUE(Release("w", inc, l, 4).ok());  // 4 of 10 counted; the rest goes back
      released.push_back(l);
    }
  }
  Reopen();  // what is remembered is durable state, not a cache
  for (size_t back : {size_t{1}, size_t{8}, size_t{500}}) {  // 500 pairs = 1 000 leases
    SCOPED_TRACE(back);
    const Lease& c = completed[completed.size() - back];
    EXPECT_TRUE(Complete("w", inc, c).ok());
    const absl::Status again = Progress("w", inc, c, c.end() - c.begin());
    EXPECT_TRUE(again.ok()) << again;
    const Lease& r = released[released.size() - back];
    EXPECT_TRUE(Progress("w", inc, r, 4).ok()) << "4 records were counted";
    EXPECT_TRUE(Release("w", inc, r, 4).ok());
    const absl::Status more = Progress("w", inc, r, 5);
    EXPECT_EQ(more.code(), absl::StatusCode::kFailedPrecondition) << more;
    EXPECT_NE(more.message().find(absl::StrCat("4 of its ", r.end() - r.begin(), " records done")),
              std::string::npos)
        << more;
    EXPECT_EQ(Complete("w", inc, r).code(), absl::StatusCode::kFailedPrecondition);
  }
  // A lease id never granted is not answered as counted.
  Lease bogus;
  bogus.set_lease_id(99'999'999);
  EXPECT_EQ(Complete("w", inc, bogus).code(), absl::StatusCode::kFailedPrecondition);
}

// What a worker's retries are answered from is bounded: at most kMaxEndedPerWorker ended leases
// per worker even within one huge epoch; a forgotten one is answered "unknown", never OK.
TEST_F(ShardingRetryTest, RememberedLeasesAreBoundedAndForgottenOnesAreNotAnsweredOk) {
  Open();
  Dataset(1'000'000, 10);
  const uint64_t inc = Register("w");
  std::vector<Lease> leases;
  for (size_t i = 0; i < kMaxEndedPerWorker + 100; ++i) {
    leases.push_back(Fetch("w", inc).lease());
    ASSERT_TRUE(Complete("w", inc, leases.back()).ok());
  }
  const auto snap = svc_->SnapshotForTest();
  ASSERT_EQ(snap.workers_size(), 1);
  EXPECT_EQ(snap.workers(0).recent_ended_size(), static_cast<int>(kMaxEndedPerWorker));
  const absl::Status oldest = Complete("w", inc, leases.front());
  EXPECT_EQ(oldest.code(), absl::StatusCode::kFailedPrecondition) << oldest;
  EXPECT_NE(oldest.message().find("outcome is unknown"), std::string::npos) << oldest;
  EXPECT_TRUE(Complete("w", inc, leases[leases.size() - kMaxEndedPerWorker]).ok());
  Reopen();
}

// A restarted worker learns the final prefix of every remembered lease of its earlier
// incarnations, not only the last 8.
TEST_F(ShardingRetryTest, ReRegistrationListsEveryRememberedLeaseOfEarlierIncarnations) {
  Open();
  Dataset(10'000, 10);
  const uint64_t inc = Register("w");
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(Complete("w", inc, Fetch("w", inc).lease()).ok());
  const Lease held = Fetch("w", inc).lease();
  ASSERT_TRUE(Progress("w", inc, held, 3).ok());
  const uint64_t inc2 = Register("w");
  EXPECT_EQ(last_registration_.previous_incarnation(), inc);
  ASSERT_EQ(last_registration_.previous_leases_size(), 51);
  const EndedLease& last = last_registration_.previous_leases(50);
  EXPECT_EQ(last.lease_id(), held.lease_id());
  EXPECT_EQ(last.records_done(), 3u);
  EXPECT_EQ(last.reason(), LEASE_WORKER_LOST);
  // The next restart lists the second incarnation's lease and still the first one's: a process
  // may have registered and died before it resolved what its predecessor left open.
  const Lease second = Fetch("w", inc2).lease();
  ASSERT_TRUE(Complete("w", inc2, second).ok());
  Register("w");
  ASSERT_EQ(last_registration_.previous_leases_size(), 52);
  EXPECT_EQ(last_registration_.previous_leases(50).lease_id(), held.lease_id());
  EXPECT_EQ(last_registration_.previous_leases(50).incarnation(), inc);
  EXPECT_EQ(last_registration_.previous_leases(50).records_done(), 3u);
  EXPECT_EQ(last_registration_.previous_leases(51).lease_id(), second.lease_id());
  EXPECT_EQ(last_registration_.previous_leases(51).incarnation(), inc2);
  EXPECT_EQ(last_registration_.previous_leases(51).reason(), LEASE_COMPLETED);
  Reopen();
}

// Acceptance 7's server half: CompleteShard with next_dataset completes and leases the next
// shard in one durable call, and a retry of that call gets the same next lease.
TEST_F(ShardingRetryTest, CompleteAndFetchNextIsOneIdempotentCall) {
  Open();
  Dataset(100, 10);
  const uint64_t inc = Register("w");
  Lease l = Fetch("w", inc, 1).lease();
  uint64_t request = 1;
  std::set<uint64_t> begins{l.begin()};
  const uint64_t batches_before = svc_->stats().journal.batches;
  uint64_t calls = 0;
  for (;;) {
    CompleteShardResponse resp;
    ASSERT_TRUE(Complete("w", inc, l, &resp, ++request).ok());
    ++calls;
    // The completion and the next lease went to the journal as one group (one fsync).
    EXPECT_EQ(svc_->stats().journal.batches - batches_before, calls);
    CompleteShardResponse retried;
    ASSERT_TRUE(Complete("w", inc, l, &retried, request).ok());
    EXPECT_EQ(retried.next().lease().lease_id(), resp.next().lease().lease_id());
    if (resp.next().outcome() != FetchShardResponse::LEASED) {
      EXPECT_EQ(resp.next().outcome(), FetchShardResponse::END_OF_DATA);
      break;
    }
    l = resp.next().lease();
    EXPECT_TRUE(begins.insert(l.begin()).second);
  }
  EXPECT_EQ(begins.size(), 10u);
  EXPECT_EQ(Info().records_done_total(), 100u);
  Reopen();
}

// An invalid worker id is INVALID_ARGUMENT, not INTERNAL.
TEST_F(ShardingRetryTest, InvalidWorkerIdsAreInvalidArgument) {
  Open();
  for (const std::string& id : {std::string(), std::string(300, 'a'), std::string("bad id"),
                                std::string(16 << 20, 'x')}) {
    RegisterWorkerRequest req;
    req.set_worker_id(id);
    RegisterWorkerResponse resp;
    const absl::Status s = Call(&ShardingServiceImpl::RegisterWorker, req, &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_LT(s.message().size(), 200u) << "the error quotes the request";
  }
  EXPECT_EQ(svc_->SnapshotForTest().workers_size(), 0);
}

// RestoreCheckpoint rolls records_done_total back with the position.
TEST_F(ShardingRetryTest, RestoreRollsBackRecordsDone) {
  Open();
  Dataset(1'000, 100);
  const uint64_t inc = Register("w");
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Complete("w", inc, Fetch("w", inc).lease()).ok());
  CheckpointRequest cp;
  cp.set_tag("step-200");
  CheckpointResponse cr;
  ASSERT_TRUE(Call(&ShardingServiceImpl::SaveCheckpoint, cp, &cr).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Complete("w", inc, Fetch("w", inc).lease()).ok());
  EXPECT_EQ(Info().records_done_total(), 700u);
  ASSERT_TRUE(Call(&ShardingServiceImpl::RestoreCheckpoint, cp, &cr).ok());
  EXPECT_EQ(Info().records_done_total(), 200u);
  for (;;) {
    const FetchShardResponse r = Fetch("w", inc);
    if (r.outcome() != FetchShardResponse::LEASED) break;
    ASSERT_TRUE(Complete("w", inc, r.lease()).ok());
  }
  EXPECT_EQ(Info().records_done_total(), 1'000u) << "an epoch of 1 000 records";
  Reopen();
}

// With on_poison=continue a dataset that quarantined records ends with the hole
// visible in ListDatasets and in the END_OF_DATA reply.
TEST_F(ShardingRetryTest, PoisonHoleIsVisibleAtTheEndOfData) {
  Open();
  Dataset(100, 10, 1, /*max_attempts=*/1);
  const uint64_t inc = Register("w");
  bool failed_once = false;
  FetchShardResponse r;
  for (;;) {
    r = Fetch("w", inc);
    if (r.outcome() != FetchShardResponse::LEASED) break;
    if (!failed_once) {
      ReleaseShardRequest req;
      req.set_worker_id("w");
      req.set_incarnation(inc);
      req.set_lease_id(r.lease().lease_id());
      req.set_fencing_token(r.lease().fencing_token());
      req.set_records_done(3);
      req.set_failed(true);
      ReleaseShardResponse resp;
      ASSERT_TRUE(Call(&ShardingServiceImpl::ReleaseShard, req, &resp).ok());
      failed_once = true;
      continue;
    }
    ASSERT_TRUE(Complete("w", inc, r.lease()).ok());
  }
  ASSERT_EQ(r.outcome(), FetchShardResponse::END_OF_DATA);
  EXPECT_EQ(r.records_quarantined(), 1u) << "batch_size 1: one record quarantined";
  EXPECT_NE(r.reason().find("quarantined"), std::string::npos);
  const DatasetInfo info = Info();
  EXPECT_TRUE(info.finished());
  EXPECT_EQ(info.records_quarantined(), 1u);
  EXPECT_EQ(info.records_done_total(), 99u);
}

// ListDatasets leaves file lists out unless asked, so 2 M files stay below gRPC's limit.
TEST_F(ShardingRetryTest, ListingLeavesFileListsOutUnlessAsked) {
  Open();
  RegisterDatasetRequest req;
  req.mutable_spec()->set_name("files");
  for (int i = 0; i < 1'000; ++i) {
    auto* f = req.mutable_spec()->mutable_files()->add_files();
    f->set_path("/data/part-" + std::to_string(i));
    f->set_num_records(10);
  }
  RegisterDatasetResponse rr;
  ASSERT_TRUE(Call(&ShardingServiceImpl::RegisterDataset, req, &rr).ok());
  ListDatasetsRequest lr;
  ListDatasetsResponse resp;
  ASSERT_TRUE(Call(&ShardingServiceImpl::ListDatasets, lr, &resp).ok());
  ASSERT_EQ(resp.datasets_size(), 1);
  EXPECT_EQ(resp.datasets(0).spec().files().files_size(), 0);
  EXPECT_EQ(resp.datasets(0).num_files(), 1'000u);
  lr.set_include_files(true);
  resp.Clear();
  ASSERT_TRUE(Call(&ShardingServiceImpl::ListDatasets, lr, &resp).ok());
  EXPECT_EQ(resp.datasets(0).spec().files().files_size(), 1'000);
}

// Quotas: the datasets a job may register are bounded.
TEST_F(ShardingRetryTest, DatasetQuotaIsResourceExhausted) {
  Open();
  absl::Status last;
  for (size_t i = 0; i <= kMaxDatasets; ++i) {
    RegisterDatasetRequest req;
    req.mutable_spec()->set_name("d" + std::to_string(i));
    req.mutable_spec()->set_num_records(10);
    RegisterDatasetResponse resp;
    last = Call(&ShardingServiceImpl::RegisterDataset, req, &resp);
    if (i < kMaxDatasets) ASSERT_TRUE(last.ok()) << i << ": " << last;
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
  EXPECT_EQ(svc_->SnapshotForTest().datasets_size(), static_cast<int>(kMaxDatasets));
}

}  // namespace
}  // namespace pacer
