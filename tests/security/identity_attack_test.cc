// Attacks by a worker that holds its own credential (not the job token: pacer-agent hands each
// worker only its own, common/auth.h), against a real pacerd on loopback (RocksDB journal, gRPC):
// every attack from the security review is refused with the right code, pacerd's state is what
// it was, no error message hands out an incarnation or a fencing token, and the honest workers'
// job still finishes with every record counted exactly once.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <grpcpp/generic/generic_stub.h>

#include "common/auth.h"
#include "proto/pacer/agent.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/rendezvous.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "tests/sdk/ledger_consumer.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

constexpr uint64_t kRecords = 2000;

class IdentityAttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
    auto channel = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
    sharding_ = ShardingService::NewStub(channel);
    monitor_ = Monitor::NewStub(channel);
    rendezvous_ = Rendezvous::NewStub(channel);
    agents_ = AgentService::NewStub(channel);
    chief_ = Mint(CredentialKind::kChief, "w0");
    honest_ = Mint(CredentialKind::kWorker, "w1");
    mallory_ = Mint(CredentialKind::kWorker, "w9");
  }

  std::string Mint(CredentialKind kind, const std::string& id) {
    auto c = MintCredential(pacerd_->job_token(), kind, id);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.value_or("");
  }
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx.get(), token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }
  DatasetInfo Dataset() {
    ListDatasetsRequest req;
    req.set_name("train");
    ListDatasetsResponse resp;
    EXPECT_TRUE(sharding_->ListDatasets(Ctx(honest_).get(), req, &resp).ok());
    return resp.datasets_size() == 1 ? resp.datasets(0) : DatasetInfo();
  }
  ClientOptions WorkerOptions(const std::string& id, const std::string& credential) {
    ClientOptions o;
    o.address = pacerd_->address();
    o.worker_id = id;
    o.token = credential;
    o.report_steps = false;
    return o;
  }
  // No error message may carry the current incarnation or fencing token (they are secrets of
  // the worker that holds them).
  static void ExpectNoSecret(const grpc::Status& s, uint64_t incarnation, uint64_t fencing) {
    const std::string& m = s.error_message();
    EXPECT_EQ(m.find("current " + std::to_string(incarnation)), std::string::npos) << m;
    EXPECT_EQ(m.find(std::to_string(fencing) + ")"), std::string::npos) << m;
    EXPECT_EQ(m.find("current"), std::string::npos) << m;
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true, .adjust = [](PacerdOptions& p) {
    p.rendezvous.max_bytes = 1 << 20;  // small, so that the flood below reaches it quickly
  }}};
  const testing::TempDir& dir_ = h_.dir();
  Pacerd* pacerd_ = nullptr;
  std::unique_ptr<ShardingService::Stub> sharding_;
  std::unique_ptr<Monitor::Stub> monitor_;
  std::unique_ptr<Rendezvous::Stub> rendezvous_;
  std::unique_ptr<AgentService::Stub> agents_;
  std::string chief_, honest_, mallory_;
};

TEST_F(IdentityAttackTest, CredentialsAreBoundToTheirIdAndForgeriesAreUnauthenticated) {
  // A credential for another job's token, a mangled MAC, a swapped id: UNAUTHENTICATED.
  auto other = MintCredential("another-job-token", CredentialKind::kWorker, "w9");
  ASSERT_TRUE(other.ok());
  std::string swapped = mallory_;
  swapped.replace(swapped.find(":w9:"), 4, ":w0:");
  std::string mangled = mallory_;
  mangled.back() = mangled.back() == '0' ? '1' : '0';
  for (const std::string& bad : {*other, swapped, mangled, std::string("pacer-cred-v1:worker:w0"),
                                 std::string("pacer-cred-v1:boss:w0:") + std::string(64, 'a')}) {
    RegisterWorkerRequest req;
    req.set_worker_id("w0");
    RegisterWorkerResponse resp;
    grpc::Status s = sharding_->RegisterWorker(Ctx(bad).get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << bad << ": " << s.error_message();
  }
  // Minting needs the job token itself.
  EXPECT_FALSE(MintCredential(mallory_, CredentialKind::kWorker, "w0").ok());
  EXPECT_FALSE(MintCredential(pacerd_->job_token(), CredentialKind::kWorker, "").ok());
}

TEST_F(IdentityAttackTest, AWorkerCannotActAsAnotherAndTheHonestJobFinishesExactlyOnce) {
  RegisterDatasetRequest reg;
  reg.mutable_spec()->set_name("train");
  reg.mutable_spec()->set_num_records(kRecords);
  reg.mutable_spec()->set_shard_size(100);
  reg.mutable_spec()->set_num_epochs(1);
  RegisterDatasetResponse reg_resp;
  ASSERT_TRUE(sharding_->RegisterDataset(Ctx(chief_).get(), reg, &reg_resp).ok());

  // The victim w0 registers and leases a shard.
  RegisterWorkerRequest victim_reg;
  victim_reg.set_worker_id("w0");
  RegisterWorkerResponse victim;
  ASSERT_TRUE(sharding_->RegisterWorker(Ctx(chief_).get(), victim_reg, &victim).ok());
  FetchShardRequest fetch;
  fetch.set_worker_id("w0");
  fetch.set_incarnation(victim.incarnation());
  fetch.set_dataset("train");
  fetch.set_request_id(1);
  FetchShardResponse leased;
  ASSERT_TRUE(sharding_->FetchShard(Ctx(chief_).get(), fetch, &leased).ok());
  ASSERT_EQ(leased.outcome(), FetchShardResponse::LEASED);
  const uint64_t lease_id = leased.lease().lease_id();
  const uint64_t fencing = leased.lease().fencing_token();

  // 1. Register as the victim (which would bump its incarnation and end its leases).
  {
    RegisterWorkerResponse resp;
    grpc::Status s = sharding_->RegisterWorker(Ctx(mallory_).get(), victim_reg, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("cannot act as worker 'w0'"), std::string::npos);
  }
  // 2. Complete, report progress on, release the victim's lease under its id: refused.
  {
    CompleteShardRequest c;
    c.set_worker_id("w0");
    c.set_incarnation(victim.incarnation());
    c.set_lease_id(lease_id);
    c.set_fencing_token(fencing);
    CompleteShardResponse resp;
    EXPECT_EQ(sharding_->CompleteShard(Ctx(mallory_).get(), c, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    ProgressRequest p;
    p.set_worker_id("w0");
    p.set_incarnation(victim.incarnation());
    p.set_lease_id(lease_id);
    p.set_fencing_token(fencing);
    ProgressResponse presp;
    EXPECT_EQ(sharding_->ReportProgress(Ctx(mallory_).get(), p, &presp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    ReleaseShardRequest r;
    r.set_worker_id("w0");
    r.set_incarnation(victim.incarnation());
    r.set_lease_id(lease_id);
    r.set_fencing_token(fencing);
    ReleaseShardResponse rresp;
    EXPECT_EQ(sharding_->ReleaseShard(Ctx(mallory_).get(), r, &rresp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    HeartbeatRequest hb;
    hb.set_worker_id("w0");
    hb.set_incarnation(victim.incarnation());
    HeartbeatResponse hresp;
    EXPECT_EQ(sharding_->Heartbeat(Ctx(mallory_).get(), hb, &hresp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // 3. As itself, with the victim's lease and guessed secrets: refused by the sharding core,
  //    and the message gives nothing away.
  {
    RegisterWorkerRequest own;
    own.set_worker_id("w9");
    RegisterWorkerResponse mine;
    ASSERT_TRUE(sharding_->RegisterWorker(Ctx(mallory_).get(), own, &mine).ok());
    CompleteShardRequest c;
    c.set_worker_id("w9");
    c.set_incarnation(mine.incarnation());
    c.set_lease_id(lease_id);
    c.set_fencing_token(0);
    CompleteShardResponse resp;
    grpc::Status s = sharding_->CompleteShard(Ctx(mallory_).get(), c, &resp);
    EXPECT_FALSE(s.ok());
    ExpectNoSecret(s, victim.incarnation(), fencing);
    c.set_incarnation(999999);
    s = sharding_->CompleteShard(Ctx(mallory_).get(), c, &resp);
    EXPECT_FALSE(s.ok());
    ExpectNoSecret(s, mine.incarnation(), fencing);
  }
  EXPECT_EQ(Dataset().records_done_total(), 0u) << "an attack completed records";
  EXPECT_EQ(Dataset().active_leases(), 1u);

  // 4. Slow step reports under the victim's id (to make it a straggler): the whole report refused.
  {
    ReportStepsRequest req;
    for (uint64_t i = 1; i <= 20; ++i) {
      StepReport* st = req.add_steps();
      st->set_worker_id("w0");
      st->set_step(i);
      st->set_local_batch(32);
      st->set_samples(32);
      st->set_compute_s(5.0);
      st->set_wall_s(5.0);
    }
    ReportStepsResponse resp;
    grpc::Status s = monitor_->ReportSteps(Ctx(mallory_).get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    MonitorRegisterRequest mreg;
    mreg.set_worker_id("w0");
    MonitorRegisterResponse mresp;
    EXPECT_EQ(monitor_->RegisterWorker(Ctx(mallory_).get(), mreg, &mresp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    ListWorkersResponse workers;
    ASSERT_TRUE(monitor_->ListWorkers(Ctx(honest_).get(), ListWorkersRequest(), &workers).ok());
    for (const WorkerStatus& w : workers.workers()) {
      EXPECT_EQ(w.reports(), 0u) << "worker " << w.id() << " has reports from the attacker";
    }
  }
  // 5. Speak as an agent: a worker credential cannot heartbeat as any node, and an agent
  //    credential only for its own node.
  {
    AgentHeartbeat hb;
    hb.set_job("job");
    hb.set_node("n0");
    hb.set_agent_id("n0");
    hb.set_incarnation(1);
    WorkerProcess* w = hb.add_workers();
    w->set_worker_id("w0");
    w->set_pid(1);
    w->set_state(WORKER_STATE_RUNNING);
    AgentHeartbeatReply reply;
    EXPECT_EQ(agents_->Heartbeat(Ctx(mallory_).get(), hb, &reply).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(agents_->Heartbeat(Ctx(Mint(CredentialKind::kAgent, "n1")).get(), hb, &reply).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_TRUE(pacerd_->agents()->Agents().empty());
    ReportNodeRequest node;
    node.mutable_metrics()->set_node("n0");
    ReportNodeResponse nresp;
    EXPECT_EQ(monitor_->ReportNode(Ctx(mallory_).get(), node, &nresp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    // The node's own agent credential is accepted.
    hb.set_node("n1");
    hb.set_agent_id("n1");
    hb.clear_workers();
    EXPECT_TRUE(agents_->Heartbeat(Ctx(Mint(CredentialKind::kAgent, "n1")).get(), hb, &reply).ok());
  }
  // 6. Checkpoints: only the chief (or the job / admin token) saves or restores. 70 saves by a
  //    worker do not evict the chief's checkpoint.
  {
    CheckpointRequest ck;
    ck.set_tag("chief-1");
    CheckpointResponse resp;
    ASSERT_TRUE(sharding_->SaveCheckpoint(Ctx(chief_).get(), ck, &resp).ok());
    for (int i = 0; i < 70; ++i) {
      ck.set_tag("junk-" + std::to_string(i));
      grpc::Status s = sharding_->SaveCheckpoint(Ctx(mallory_).get(), ck, &resp);
      ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    }
    ck.set_tag("chief-1");
    EXPECT_EQ(sharding_->RestoreCheckpoint(Ctx(mallory_).get(), ck, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(sharding_->RestoreCheckpoint(Ctx(honest_).get(), ck, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // 7. Rendezvous: a worker's Join cannot open the group (fix the world size); the chief's does.
  uint64_t generation = 0;
  {
    RendezvousJoinRequest join;
    join.set_worker_id("w9");
    join.set_rank(-1);
    join.set_world_size(1);
    RendezvousJoinResponse resp;
    EXPECT_EQ(rendezvous_->Join(Ctx(mallory_).get(), join, &resp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    join.set_worker_id("w0");
    EXPECT_EQ(rendezvous_->Join(Ctx(mallory_).get(), join, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    join.set_world_size(2);
    join.set_rank(0);
    join.set_incarnation(victim.incarnation());
    ASSERT_TRUE(rendezvous_->Join(Ctx(chief_).get(), join, &resp).ok());
    EXPECT_EQ(resp.world_size(), 2u);
    generation = resp.generation();
    join.set_worker_id("w9");
    join.set_rank(-1);
    join.set_world_size(1);
    EXPECT_EQ(rendezvous_->Join(Ctx(mallory_).get(), join, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
    join.set_worker_id("w1");
    join.set_world_size(2);
    ASSERT_TRUE(rendezvous_->Join(Ctx(honest_).get(), join, &resp).ok());
    EXPECT_EQ(resp.rank(), 1);
    // Reform: not as another worker, not as a non-member; the generation stays.
    RendezvousReformRequest reform;
    reform.set_worker_id("w0");
    reform.set_generation(generation);
    RendezvousReformResponse rresp;
    EXPECT_EQ(rendezvous_->Reform(Ctx(mallory_).get(), reform, &rresp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    // As itself, not a member: told the current generation, nothing moves.
    reform.set_worker_id("w9");
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(rendezvous_->Reform(Ctx(mallory_).get(), reform, &rresp).ok());
      EXPECT_EQ(rresp.generation(), generation);
    }
    EXPECT_EQ(pacerd_->rendezvous()->stats().generation, generation);
  }
  // 8. The store's limits hold for Add as for Set: an oversized key, a flood past the byte cap,
  //    a counter overflow.
  {
    RendezvousAddRequest add;
    add.set_generation(generation);
    add.set_key(std::string(8 << 20, 'k'));
    add.set_delta(1);
    RendezvousAddResponse resp;
    EXPECT_EQ(rendezvous_->Add(Ctx(mallory_).get(), add, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
    grpc::Status last;
    int added = 0;
    for (; added < 1000 && last.ok(); ++added) {  // 1 MiB cap / 4 KiB keys: ~256 fit
      add.set_key(std::to_string(added) + std::string(4000, 'k'));
      last = rendezvous_->Add(Ctx(mallory_).get(), add, &resp);
    }
    EXPECT_EQ(last.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << last.error_message();
    EXPECT_LT(added, 300);
    add.set_key("c");
    add.set_delta(std::numeric_limits<int64_t>::max());
    grpc::Status first = rendezvous_->Add(Ctx(honest_).get(), add, &resp);
    add.set_delta(1);
    grpc::Status overflow = rendezvous_->Add(Ctx(honest_).get(), add, &resp);
    if (first.ok()) {
      EXPECT_EQ(overflow.error_code(), grpc::StatusCode::OUT_OF_RANGE) << overflow.error_message();
    }
  }

  // The victim hands its untouched lease back (its own credential may), and the honest workers,
  // each with its own credential, finish the job: every record exactly once.
  {
    ReleaseShardRequest r;
    r.set_worker_id("w0");
    r.set_incarnation(victim.incarnation());
    r.set_lease_id(lease_id);
    r.set_fencing_token(fencing);
    ReleaseShardResponse rresp;
    grpc::Status s = sharding_->ReleaseShard(Ctx(chief_).get(), r, &rresp);
    ASSERT_TRUE(s.ok()) << s.error_message() << " (the attacks must have left the lease alone)";
  }
  std::vector<std::string> ledgers = {dir_.Sub("ledger-w0"), dir_.Sub("ledger-w1")};
  testing::LedgerConsumer c0(WorkerOptions("w0", chief_), ledgers[0]);
  testing::LedgerConsumer c1(WorkerOptions("w1", honest_), ledgers[1]);
  absl::Status s0, s1;
  std::thread t0([&] { s0 = c0.Run(); });
  std::thread t1([&] { s1 = c1.Run(); });
  t0.join();
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  testing::ExpectEachRecordCountedOnce(ledgers, 1, kRecords);
  EXPECT_EQ(Dataset().records_done_total(), kRecords);
}

// A body that is not the method's message gets a status that says so (not an empty message),
// and changes nothing.
TEST_F(IdentityAttackTest, AGarbageRequestBodyGetsAClearError) {
  auto channel = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  const std::string garbage = "\xff\xff\xff\xff\x0f garbage, not a protobuf";
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1);
  for (const char* method : {"/pacer.ShardingService/RegisterWorker", "/pacer.Rendezvous/Join",
                             "/pacer.AgentService/Heartbeat"}) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, mallory_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      std::lock_guard<std::mutex> l(mu);
      status = s;
      done = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(30), [&] { return done; }));
    std::cout << method << ": " << status.error_code() << " '" << status.error_message() << "'" << std::endl;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(status.error_message().find(std::string(method) + ": the request body is not a valid"),
              std::string::npos) << status.error_message();
  }
  EXPECT_TRUE(pacerd_->agents()->Agents().empty());
}

}  // namespace
}  // namespace pacer
