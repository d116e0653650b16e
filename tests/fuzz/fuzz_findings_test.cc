// What pacer_rpc_fuzz found (docs/security.md, "Fuzzing"), each as a small deterministic test
// against a real pacerd on loopback (the fuzzer's own corpus replays the inputs too).
#include <gtest/gtest.h>

#include <string>

#include "common/auth.h"
#include "common/grpc_errors.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AttachToken(ctx.get(), token);
  ctx->set_deadline(std::chrono::system_clock::now() + 30s);
  return ctx;
}

// A request with a 60 000-byte worker id got a PERMISSION_DENIED quoting it whole; gRPC sends the
// message as a header, the client refused a header that large (RESOURCE_EXHAUSTED "received
// initial metadata size exceeds limit", not the code pacerd chose), and after a few such replies
// an honest call on the same connection failed the same way. The message is cut now.
TEST(FuzzFindingsTest, AnErrorQuotingAHugeIdStaysReadableAndTheConnectionServes) {
  testing::PacerdHarness h;
  ASSERT_TRUE(h.ok());
  auto stub = ShardingService::NewStub(h.channel());
  const std::string w0 = MintCredential(h.job_token(), CredentialKind::kWorker, "w0").value();
  FetchShardRequest req;
  req.set_worker_id(std::string(60'000, 'v'));
  req.set_dataset("d");
  for (int i = 0; i < 6; ++i) {
    FetchShardResponse resp;
    const grpc::Status s = stub->FetchShard(Ctx(w0).get(), req, &resp);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message().substr(0, 200);
    EXPECT_LE(s.error_message().size(), kMaxStatusMessageBytes);
    EXPECT_EQ(s.error_message().rfind("fetch shard: the worker credential of 'w0' cannot act as worker 'vvv", 0), 0u)
        << s.error_message().substr(0, 200);
    EXPECT_NE(s.error_message().find("bytes cut"), std::string::npos);
  }
  ListDatasetsRequest list;
  ListDatasetsResponse listed;
  const grpc::Status s = stub->ListDatasets(Ctx(h.admin_token()).get(), list, &listed);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// sharding_state_fuzz: a stream partition starting at 2^64 - 2 leases [2^64 - 2, 2^64 - 1) (the
// end saturates); released, the range is requeued, and the next fetch planned its end as
// begin + shard_size, which wrapped to 3: the lease did not apply ("empty range") and every
// fetch of the dataset got INTERNAL from then on. The requeue path saturates too now.
TEST(FuzzFindingsTest, ARequeuedStreamRangeAtTheTopOfTheOffsetsIsLeasedAgain) {
  testing::PacerdHarness h;
  ASSERT_TRUE(h.ok());
  auto stub = ShardingService::NewStub(h.channel());
  const std::string w0 = MintCredential(h.job_token(), CredentialKind::kWorker, "w0").value();
  RegisterDatasetRequest ds;
  ds.mutable_spec()->set_name("s0");
  auto* p = ds.mutable_spec()->mutable_stream()->add_partitions();
  p->set_id(15);
  p->set_start_offset(~uint64_t{0} - 1);
  ds.mutable_spec()->set_shard_size(5);
  RegisterDatasetResponse ds_resp;
  ASSERT_TRUE(stub->RegisterDataset(Ctx(h.job_token()).get(), ds, &ds_resp).ok());
  RegisterWorkerRequest reg;
  reg.set_worker_id("w0");
  reg.set_node("n0");
  RegisterWorkerResponse reg_resp;
  ASSERT_TRUE(stub->RegisterWorker(Ctx(w0).get(), reg, &reg_resp).ok());
  FetchShardRequest fetch;
  fetch.set_worker_id("w0");
  fetch.set_incarnation(reg_resp.incarnation());
  fetch.set_dataset("s0");
  fetch.set_request_id(1);
  FetchShardResponse first;
  grpc::Status s = stub->FetchShard(Ctx(w0).get(), fetch, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(first.has_lease());
  EXPECT_EQ(first.lease().begin(), ~uint64_t{0} - 1);
  ReleaseShardRequest release;
  release.set_worker_id("w0");
  release.set_incarnation(reg_resp.incarnation());
  release.set_lease_id(first.lease().lease_id());
  release.set_fencing_token(first.lease().fencing_token());
  ReleaseShardResponse released;
  s = stub->ReleaseShard(Ctx(w0).get(), release, &released);
  ASSERT_TRUE(s.ok()) << s.error_message();
  fetch.set_request_id(2);
  FetchShardResponse again;
  s = stub->FetchShard(Ctx(w0).get(), fetch, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();  // INTERNAL 'empty range' before
  ASSERT_TRUE(again.has_lease());
  EXPECT_EQ(again.lease().begin(), ~uint64_t{0} - 1);
  EXPECT_EQ(again.lease().end(), ~uint64_t{0});
}

TEST(FuzzFindingsTest, BoundStatusMessageKeepsHeadAndTailOnCharacterBoundaries) {
  EXPECT_EQ(BoundStatusMessage("short"), "short");
  const std::string exact(kMaxStatusMessageBytes, 'a');
  EXPECT_EQ(BoundStatusMessage(exact), exact);
  // Two-byte characters everywhere: no cut may split one.
  std::string wide;
  while (wide.size() < 10'000) wide += "\xc3\xa9";
  const std::string flagged = "head " + wide + " over the limit (--max-thing)";
  const std::string cut = BoundStatusMessage(flagged);
  EXPECT_LE(cut.size(), kMaxStatusMessageBytes);
  EXPECT_EQ(cut.rfind("head ", 0), 0u);
  EXPECT_NE(cut.find("(--max-thing)"), std::string::npos);
  const size_t marker = cut.find(" [... ");
  ASSERT_NE(marker, std::string::npos);
  EXPECT_EQ((marker - 5) % 2, 0u);  // whole characters before the marker
  const size_t after = cut.find(" ...] ") + 6;
  EXPECT_EQ(static_cast<unsigned char>(cut[after]) & 0xC0, 0xC0);  // starts on a lead byte
}

}  // namespace
}  // namespace pacer
