// pacerctl datasets delete|reset over gRPC on loopback against a real pacerd (RocksDB journal):
// admin only, NOT_FOUND with the name, the holder of a lease told (cancelled in its heartbeat,
// NOT_FOUND on its next fetch of a deleted dataset), audited in ListActions, the spec-mismatch
// error naming the fields, and the state after a restart the same as before it. pacerd runs in
// the in-process harness (tests/testing/pacerd_harness.h) on its simulated clock.
#include <gtest/gtest.h>

#include "common/auth.h"
#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

class DatasetAdminTest : public ::testing::Test {
 protected:
  // Starts pacerd (again, on the same data dir: a restart).
  void Start() {
    h_.Restart();
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
    channel_ = h_.channel();
    stub_ = ShardingService::NewStub(channel_);
  }
  std::unique_ptr<grpc::ClientContext> Ctx(bool admin) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx.get(), admin ? pacerd_->admin_token() : pacerd_->job_token());
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }
  static DatasetSpec Spec(uint64_t n, uint64_t shard) {
    DatasetSpec s;
    s.set_name("train");
    s.set_num_records(n);
    s.set_shard_size(shard);
    return s;
  }

  testing::PacerdHarness h_{{.start = false}};
  Pacerd* pacerd_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ShardingService::Stub> stub_;
};

TEST_F(DatasetAdminTest, DeleteAndResetOverGrpcAreAdminOnlyAuditedAndSurviveARestart) {
  ASSERT_NO_FATAL_FAILURE(Start());
  RegisterDatasetRequest reg;
  *reg.mutable_spec() = Spec(200000, 640);
  RegisterDatasetResponse reg_resp;
  ASSERT_TRUE(stub_->RegisterDataset(Ctx(false).get(), reg, &reg_resp).ok());
  RegisterWorkerRequest wreq;
  wreq.set_worker_id("w0");
  RegisterWorkerResponse wresp;
  ASSERT_TRUE(stub_->RegisterWorker(Ctx(false).get(), wreq, &wresp).ok());
  FetchShardRequest fetch;
  fetch.set_worker_id("w0");
  fetch.set_incarnation(wresp.incarnation());
  fetch.set_dataset("train");
  fetch.set_request_id(1);
  FetchShardResponse leased;
  ASSERT_TRUE(stub_->FetchShard(Ctx(false).get(), fetch, &leased).ok());
  ASSERT_EQ(leased.outcome(), FetchShardResponse::LEASED);

  // The same name with another spec: refused, naming the fields and the way out.
  *reg.mutable_spec() = Spec(400000, 1280);
  grpc::Status s = stub_->RegisterDataset(Ctx(false).get(), reg, &reg_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(s.error_message().find("num_records 200000 (registered) vs 400000 (requested)"),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("pacerctl datasets delete train"), std::string::npos);

  // Admin only; an unknown name is NOT_FOUND with the name.
  DeleteDatasetRequest del;
  del.set_dataset("train");
  DeleteDatasetResponse del_resp;
  EXPECT_EQ(stub_->DeleteDataset(Ctx(false).get(), del, &del_resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ResetDatasetRequest reset;
  reset.set_dataset("nope");
  ResetDatasetResponse reset_resp;
  s = stub_->ResetDataset(Ctx(true).get(), reset, &reset_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("'nope'"), std::string::npos) << s.error_message();

  ASSERT_TRUE(stub_->DeleteDataset(Ctx(true).get(), del, &del_resp).ok());
  EXPECT_EQ(del_resp.leases_ended(), 1u);
  // The holder learns it: the lease is cancelled in its heartbeat, a fetch is NOT_FOUND.
  HeartbeatRequest hb;
  hb.set_worker_id("w0");
  hb.set_incarnation(wresp.incarnation());
  HeartbeatResponse hb_resp;
  ASSERT_TRUE(stub_->Heartbeat(Ctx(false).get(), hb, &hb_resp).ok());
  ASSERT_EQ(hb_resp.cancelled_leases_size(), 1);
  EXPECT_EQ(hb_resp.cancelled_leases(0), leased.lease().lease_id());
  fetch.set_request_id(2);
  FetchShardResponse gone;
  s = stub_->FetchShard(Ctx(false).get(), fetch, &gone);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("train"), std::string::npos) << s.error_message();

  // Registered again with the new spec, some progress, then reset.
  ASSERT_TRUE(stub_->RegisterDataset(Ctx(false).get(), reg, &reg_resp).ok());
  EXPECT_TRUE(reg_resp.created());
  fetch.set_request_id(3);
  ASSERT_TRUE(stub_->FetchShard(Ctx(false).get(), fetch, &leased).ok());
  CompleteShardRequest done;
  done.set_worker_id("w0");
  done.set_incarnation(wresp.incarnation());
  done.set_lease_id(leased.lease().lease_id());
  done.set_fencing_token(leased.lease().fencing_token());
  CompleteShardResponse done_resp;
  ASSERT_TRUE(stub_->CompleteShard(Ctx(false).get(), done, &done_resp).ok());
  reset.set_dataset("train");
  ASSERT_TRUE(stub_->ResetDataset(Ctx(true).get(), reset, &reset_resp).ok());
  EXPECT_EQ(reset_resp.records_done_dropped(), 1280u);
  fetch.set_request_id(4);
  ASSERT_TRUE(stub_->FetchShard(Ctx(false).get(), fetch, &leased).ok());
  EXPECT_EQ(leased.lease().begin(), 0u) << "epoch 0 again, from its first position";

  // Audited (pacerctl actions).
  auto ctl = ControllerService::NewStub(channel_);
  ListActionsResponse actions;
  ASSERT_TRUE(ctl->ListActions(Ctx(false).get(), ListActionsRequest(), &actions).ok());
  bool deleted = false, was_reset = false;
  for (const auto& a : actions.actions()) {
    deleted = deleted || a.reason().find("dataset 'train' deleted") != std::string::npos;
    was_reset = was_reset || a.reason().find("dataset 'train' reset") != std::string::npos;
    if (a.reason().find("dataset 'train'") != std::string::npos) EXPECT_EQ(a.policy(), "operator");
  }
  EXPECT_TRUE(deleted && was_reset);

  // A restart replays the journal (delete, re-registration, reset) to the same state.
  const std::string before = pacerd_->sharding()->SnapshotForTest().SerializeAsString();
  ASSERT_NO_FATAL_FAILURE(Start());
  EXPECT_EQ(pacerd_->sharding()->SnapshotForTest().SerializeAsString(), before);
  ListDatasetsResponse list;
  ASSERT_TRUE(stub_->ListDatasets(Ctx(false).get(), ListDatasetsRequest(), &list).ok());
  ASSERT_EQ(list.datasets_size(), 1);
  EXPECT_EQ(list.datasets(0).spec().num_records(), 400000u);
  EXPECT_EQ(list.datasets(0).spec().shard_size(), 1280u);
}

// The delete forces a snapshot, so a spec re-registered under the name is pinned anew: with a
// snapshot every 3 updates, the one at update 3 pins the old spec; without the forced one at
// the delete (4), the next (6, after the re-registration at 5) would find the key on disk and
// keep the old spec, and a restart would come back with it.
TEST_F(DatasetAdminTest, AReRegisteredSpecSurvivesSnapshotsAndARestart) {
  h_.mutable_options().sharding.snapshot_every = 3;
  for (int round = 0; round < 2; ++round) {
    ASSERT_NO_FATAL_FAILURE(Start());
    if (round == 0) {
      RegisterDatasetRequest reg;
      RegisterDatasetResponse resp;
      *reg.mutable_spec() = Spec(100, 10);
      ASSERT_TRUE(stub_->RegisterDataset(Ctx(false).get(), reg, &resp).ok());  // 1
      for (const char* id : {"w0", "w1"}) {  // 2, 3: a snapshot pinning spec/train (100)
        RegisterWorkerRequest w;
        w.set_worker_id(id);
        RegisterWorkerResponse wr;
        ASSERT_TRUE(stub_->RegisterWorker(Ctx(false).get(), w, &wr).ok());
      }
      DeleteDatasetRequest del;
      del.set_dataset("train");
      DeleteDatasetResponse del_resp;
      ASSERT_TRUE(stub_->DeleteDataset(Ctx(true).get(), del, &del_resp).ok());
      *reg.mutable_spec() = Spec(300, 30);
      ASSERT_TRUE(stub_->RegisterDataset(Ctx(false).get(), reg, &resp).ok());
      for (const char* id : {"w2", "w3"}) {  // 6, 7: snapshots again
        RegisterWorkerRequest w;
        w.set_worker_id(id);
        RegisterWorkerResponse wr;
        ASSERT_TRUE(stub_->RegisterWorker(Ctx(false).get(), w, &wr).ok());
      }
    }
    ListDatasetsResponse list;
    ASSERT_TRUE(stub_->ListDatasets(Ctx(false).get(), ListDatasetsRequest(), &list).ok());
    ASSERT_EQ(list.datasets_size(), 1);
    EXPECT_EQ(list.datasets(0).spec().num_records(), 300u) << "round " << round;
    h_.Stop();
  }
}

}  // namespace
}  // namespace pacer
