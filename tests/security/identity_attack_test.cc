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
#include "proto/pacer/controller.grpc.pb.h"
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
  RegisterWorkerResponse mine;
  {
    RegisterWorkerRequest own;
    own.set_worker_id("w9");
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
    join.set_incarnation(mine.incarnation());  // its own registration's, as the SDK sends
    join.set_rank(-1);
    join.set_world_size(1);
    RendezvousJoinResponse resp;
    EXPECT_EQ(rendezvous_->Join(Ctx(mallory_).get(), join, &resp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    join.set_worker_id("w0");
    join.set_incarnation(victim.incarnation());
    EXPECT_EQ(rendezvous_->Join(Ctx(mallory_).get(), join, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    join.set_world_size(2);
    join.set_rank(0);
    join.set_incarnation(victim.incarnation());
    ASSERT_TRUE(rendezvous_->Join(Ctx(chief_).get(), join, &resp).ok());
    EXPECT_EQ(resp.world_size(), 2u);
    generation = resp.generation();
    join.set_worker_id("w9");
    join.set_incarnation(mine.incarnation());
    join.set_rank(-1);
    join.set_world_size(1);
    EXPECT_EQ(rendezvous_->Join(Ctx(mallory_).get(), join, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
    RegisterWorkerRequest w1;
    w1.set_worker_id("w1");
    RegisterWorkerResponse w1_registered;
    ASSERT_TRUE(sharding_->RegisterWorker(Ctx(honest_).get(), w1, &w1_registered).ok());
    join.set_worker_id("w1");
    join.set_incarnation(w1_registered.incarnation());
    join.set_world_size(2);
    grpc::Status joined = rendezvous_->Join(Ctx(honest_).get(), join, &resp);
    ASSERT_TRUE(joined.ok()) << joined.error_message();
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

// A credential vouches for every id in a request, not only the first.
// pacerd in process on a simulated clock: the test runs production's housekeeping step (the one
// that declares a worker its agent gave up on lost) as time passes, so "the victim keeps its
// lease 3 s later" is decided by the same code as in production, without waiting.
class VouchedIdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    sharding_ = ShardingService::NewStub(h_.channel());
    monitor_ = Monitor::NewStub(h_.channel());
    agents_ = AgentService::NewStub(h_.channel());
    contention_ = ContentionSwitch::NewStub(h_.channel());
    rendezvous_ = Rendezvous::NewStub(h_.channel());
  }
  std::string Mint(CredentialKind kind, const std::string& id) {
    return MintCredential(h_.job_token(), kind, id).value();
  }
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx.get(), token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }
  // A worker registered with the sharding service and the monitor under its own credential.
  testing::ScriptedWorker& Worker(const std::string& id, const std::string& node) {
    workers_.push_back(std::make_unique<testing::ScriptedWorker>(
        h_, testing::ScriptedWorker::Options{.id = id, .node = node}));
    EXPECT_TRUE(workers_.back()->Connect().ok()) << id;
    return *workers_.back();
  }
  void RegisterDataset() {
    DatasetSpec spec;
    spec.set_name("train");
    spec.set_num_records(kRecords);
    spec.set_shard_size(100);
    spec.set_num_epochs(1);
    RegisterDatasetRequest req;
    *req.mutable_spec() = spec;
    RegisterDatasetResponse resp;
    ASSERT_TRUE(sharding_->RegisterDataset(Ctx(h_.job_token()).get(), req, &resp).ok());
  }
  Lease LeaseOne(testing::ScriptedWorker& w) {
    auto r = w.sharding().Fetch("train");
    EXPECT_TRUE(r.ok() && r->outcome() == FetchShardResponse::LEASED);
    return r.ok() ? r->lease() : Lease();
  }
  uint64_t ActiveLeases() {
    ListDatasetsRequest req;
    req.set_name("train");
    ListDatasetsResponse resp;
    EXPECT_TRUE(sharding_->ListDatasets(Ctx(h_.job_token()).get(), req, &resp).ok());
    return resp.datasets_size() == 1 ? resp.datasets(0).active_leases() : 0;
  }
  static AgentHeartbeat Beat(const std::string& node, const std::string& agent_id, uint64_t incarnation,
                             const std::vector<std::pair<std::string, WorkerProcessState>>& workers) {
    AgentHeartbeat hb;
    hb.set_job("job");
    hb.set_node(node);
    hb.set_agent_id(agent_id);
    hb.set_incarnation(incarnation);
    for (const auto& [id, state] : workers) {
      WorkerProcess* w = hb.add_workers();
      w->set_worker_id(id);
      w->set_pid(state == WORKER_STATE_RUNNING ? 4000 + static_cast<int>(hb.workers_size()) : 0);
      w->set_state(state);
    }
    return hb;
  }
  grpc::Status Join(const std::string& token, const std::string& worker, uint64_t incarnation,
                    int rank, RendezvousJoinResponse* resp) {
    RendezvousJoinRequest req;
    req.set_worker_id(worker);
    req.set_incarnation(incarnation);
    req.set_rank(rank);
    req.set_world_size(3);
    return rendezvous_->Join(Ctx(token).get(), req, resp);
  }

  testing::PacerdHarness h_;
  std::unique_ptr<ShardingService::Stub> sharding_;
  std::unique_ptr<Monitor::Stub> monitor_;
  std::unique_ptr<AgentService::Stub> agents_;
  std::unique_ptr<ContentionSwitch::Stub> contention_;
  std::unique_ptr<Rendezvous::Stub> rendezvous_;
  std::vector<std::unique_ptr<testing::ScriptedWorker>> workers_;
};

// Agent n1 heartbeats as agent n0 (agent_id "n0", the highest incarnation) and lists
// n0's workers, the victim FAILED. Before, only `node` was checked against the credential: the
// heartbeat was accepted, the real n0 was refused from then on as "a zombie agent", an admin's
// SetContention(w0) went to the attacker, and the victim was declared lost, its lease ended.
TEST_F(VouchedIdTest, AnAgentCannotSpeakAsAnotherAgent) {
  RegisterDataset();
  testing::ScriptedWorker& victim = Worker("w5", "n0");
  Worker("w0", "n0");
  const Lease lease = LeaseOne(victim);
  const std::string n0 = Mint(CredentialKind::kAgent, "n0"), n1 = Mint(CredentialKind::kAgent, "n1");
  const AgentHeartbeat honest = Beat("n0", "n0", 100, {{"w0", WORKER_STATE_RUNNING}, {"w5", WORKER_STATE_RUNNING}});
  AgentHeartbeatReply reply;
  ASSERT_TRUE(agents_->Heartbeat(Ctx(n0).get(), honest, &reply).ok());

  grpc::Status s = agents_->Heartbeat(
      Ctx(n1).get(),
      Beat("n1", "n0", std::numeric_limits<uint64_t>::max(), {{"w5", WORKER_STATE_FAILED}, {"w0", WORKER_STATE_RUNNING}}),
      &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("the agent credential of node 'n1' cannot act as agent 'n0'"),
            std::string::npos) << s.error_message();

  // The real n0 is still served, and an admin's contention command for w0 goes to it.
  ContentionRequest creq;
  creq.set_worker_id("w0");
  creq.set_factor(2);
  ContentionReply crep;
  ASSERT_TRUE(contention_->SetContention(Ctx(h_.admin_token()).get(), creq, &crep).ok());
  EXPECT_EQ(crep.node(), "n0");
  s = agents_->Heartbeat(Ctx(n0).get(), honest, &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  bool delivered = false;
  for (const AgentCommand& c : reply.commands()) delivered = delivered || c.command_id() == crep.command_id();
  EXPECT_TRUE(delivered) << reply.ShortDebugString();

  // Three seconds pass, the victim silent, its agent heartbeating: the victim keeps its lease.
  for (int t = 1; t <= 30; ++t) {
    h_.Advance(100);
    if (t % 10 == 0) {
      EXPECT_TRUE(agents_->Heartbeat(Ctx(n0).get(), honest, &reply).ok());
    }
  }
  EXPECT_EQ(ActiveLeases(), 1u);
  EXPECT_TRUE(victim.sharding().Complete(lease).ok()) << "the victim's lease was ended";
}

// Agent n1 lists as FAILED a worker registered on node n0 that no agent supervises.
// Before, the heartbeat was accepted and the worker declared lost 2.5 s later.
TEST_F(VouchedIdTest, AnAgentCannotReportOnAWorkerOfAnotherNode) {
  RegisterDataset();
  testing::ScriptedWorker& victim = Worker("w5", "n0");
  Worker("w6", "n1");
  const Lease lease = LeaseOne(victim);
  const std::string n1 = Mint(CredentialKind::kAgent, "n1");
  const AgentHeartbeat attack = Beat("n1", "n1", 1, {{"w5", WORKER_STATE_FAILED}, {"w6", WORKER_STATE_RUNNING}});
  AgentHeartbeatReply reply;
  grpc::Status s = agents_->Heartbeat(Ctx(n1).get(), attack, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("'w5'"), std::string::npos) << s.error_message();
  for (int t = 1; t <= 30; ++t) {
    h_.Advance(100);
    if (t % 10 == 0) (void)agents_->Heartbeat(Ctx(n1).get(), attack, &reply);
  }
  EXPECT_EQ(ActiveLeases(), 1u);
  EXPECT_TRUE(victim.sharding().Complete(lease).ok()) << "the victim's lease was ended";
  EXPECT_FALSE(h_->agents()->Worker("w5").ok()) << "an agent is recorded as supervising the victim";

  // Its own worker, registered on its node, it reports on. A worker not registered yet (its
  // process has not reached pacerd) is left out of the listing until it registers here, so no
  // agent can claim a worker id before the worker's own agent does.
  s = agents_->Heartbeat(Ctx(n1).get(),
                         Beat("n1", "n1", 1, {{"w6", WORKER_STATE_RUNNING}, {"w7", WORKER_STATE_RUNNING}}), &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(h_->agents()->Worker("w6").ok());
  EXPECT_FALSE(h_->agents()->Worker("w7").ok());
  Worker("w7", "n1");
  ASSERT_TRUE(agents_->Heartbeat(Ctx(n1).get(),
                                 Beat("n1", "n1", 1, {{"w6", WORKER_STATE_RUNNING}, {"w7", WORKER_STATE_RUNNING}}),
                                 &reply).ok());
  EXPECT_TRUE(h_->agents()->Worker("w7").ok());
}

// A worker registers on the node its agent runs on: while a live agent lists it, its credential
// cannot put it (in the sharding service's and the monitor's view) on another node — UNAVAILABLE,
// which the SDK retries — and once that agent leaves (a migration's last heartbeat) it can. A
// worker no agent lists names any node (the monitor holds one node row of its at most: quota_test).
TEST_F(VouchedIdTest, AWorkerRegistersOnItsAgentsNode) {
  testing::ScriptedWorker& w1 = Worker("w1", "n0");
  const std::string n0 = Mint(CredentialKind::kAgent, "n0");
  AgentHeartbeat beat = Beat("n0", "n0", 1, {{"w1", WORKER_STATE_RUNNING}});
  AgentHeartbeatReply reply;
  ASSERT_TRUE(agents_->Heartbeat(Ctx(n0).get(), beat, &reply).ok());
  ASSERT_TRUE(h_->agents()->Worker("w1").ok());
  auto registered_node = [&] {
    ListWorkersResponse workers;
    EXPECT_TRUE(monitor_->ListWorkers(Ctx(w1.credential()).get(), ListWorkersRequest(), &workers).ok());
    std::string monitor_node;
    for (const WorkerStatus& w : workers.workers()) {
      if (w.id() == "w1") monitor_node = w.node();
    }
    return h_->sharding()->Registration("w1")->node + "/" + monitor_node;
  };
  RegisterWorkerRequest reg;
  reg.set_worker_id("w1");
  reg.set_node("n5");
  RegisterWorkerResponse rresp;
  grpc::Status s = sharding_->RegisterWorker(Ctx(w1.credential()).get(), reg, &rresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("on node 'n5': its agent runs on node 'n0'"), std::string::npos)
      << s.error_message();
  MonitorRegisterRequest mreg;
  mreg.set_worker_id("w1");
  mreg.set_node("n5");
  MonitorRegisterResponse mresp;
  s = monitor_->RegisterWorker(Ctx(w1.credential()).get(), mreg, &mresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(registered_node(), "n0/n0");

  beat.set_leaving(true);
  ASSERT_TRUE(agents_->Heartbeat(Ctx(n0).get(), beat, &reply).ok());
  s = sharding_->RegisterWorker(Ctx(w1.credential()).get(), reg, &rresp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = monitor_->RegisterWorker(Ctx(w1.credential()).get(), mreg, &mresp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(registered_node(), "n5/n5");

  Worker("w2", "anywhere");  // registers (sharding and monitor) on a node no agent runs
}

// Rendezvous: a Join was checked neither against the credential's rank nor against
// the worker's incarnation. A worker credential `w<N>` takes rank N (pacer-agent names each
// worker w<RANK>), so w2 cannot squat on w1's rank; and a Join carries the incarnation of the
// worker's sharding registration, so a worker cannot regroup everyone by joining again under
// made-up incarnations (a real restart, a new registration, still regroups once).
TEST_F(VouchedIdTest, ARendezvousJoinTakesTheCredentialsRankAndIncarnation) {
  testing::ScriptedWorker& w0 = Worker("w0", "n0");
  testing::ScriptedWorker& w1 = Worker("w1", "n0");
  testing::ScriptedWorker& w2 = Worker("w2", "n0");
  const std::string chief = Mint(CredentialKind::kChief, "w0");
  RendezvousJoinResponse j;
  ASSERT_TRUE(Join(chief, "w0", w0.sharding().incarnation(), -1, &j).ok());
  EXPECT_EQ(j.rank(), 0);
  grpc::Status s = Join(w2.credential(), "w2", w2.sharding().incarnation(), 1, &j);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("'w2'"), std::string::npos) << s.error_message();
  s = Join(w1.credential(), "w1", w1.sharding().incarnation(), -1, &j);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(j.rank(), 1) << "w1's rank was taken";
  s = Join(w2.credential(), "w2", w2.sharding().incarnation(), -1, &j);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(j.rank(), 2);
  const uint64_t generation = h_->rendezvous()->stats().generation;

  for (uint64_t fake = 1; fake <= 5; ++fake) {
    const uint64_t incarnation = w2.sharding().incarnation() + fake * 1000;
    s = Join(w2.credential(), "w2", incarnation, -1, &j);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_EQ(s.error_message().find(std::to_string(incarnation)), std::string::npos) << s.error_message();
    EXPECT_EQ(s.error_message().find(std::to_string(w2.sharding().incarnation())), std::string::npos)
        << s.error_message();
  }
  EXPECT_EQ(h_->rendezvous()->stats().generation, generation) << "made-up incarnations regrouped everyone";

  ASSERT_TRUE(w1.sharding().Reregister().ok());
  s = Join(w1.credential(), "w1", w1.sharding().incarnation(), -1, &j);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(j.rank(), 1);
  EXPECT_EQ(j.generation(), generation + 1);
}

// Steps: a step number of 2^63 was accepted (and read as a negative step where the
// controller keeps steps as int64). Implausible step numbers are refused whole, naming the limit.
TEST_F(VouchedIdTest, ImplausibleStepNumbersAreRefused) {
  testing::ScriptedWorker& w1 = Worker("w1", "n0");
  for (uint64_t step : {uint64_t{1} << 63, std::numeric_limits<uint64_t>::max(), uint64_t{1} << 41}) {
    ReportStepsRequest req;
    StepReport* r = req.add_steps();
    r->set_worker_id("w1");
    r->set_step(step);
    r->set_local_batch(32);
    r->set_samples(32);
    r->set_compute_s(0.1);
    r->set_wall_s(0.1);
    ReportStepsResponse resp;
    grpc::Status s = monitor_->ReportSteps(Ctx(w1.credential()).get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << step << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("step"), std::string::npos) << s.error_message();

    HeartbeatRequest hb;
    hb.set_worker_id("w1");
    hb.set_incarnation(w1.sharding().incarnation());
    hb.set_step(step);
    HeartbeatResponse hresp;
    s = sharding_->Heartbeat(Ctx(w1.credential()).get(), hb, &hresp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << step << ": " << s.error_message();
  }
  ListWorkersResponse workers;
  ASSERT_TRUE(monitor_->ListWorkers(Ctx(w1.credential()).get(), ListWorkersRequest(), &workers).ok());
  for (const WorkerStatus& w : workers.workers()) EXPECT_EQ(w.reports(), 0u) << w.id();
  // A plausible step still counts.
  ASSERT_TRUE(w1.Step(0.1, 0.1).ok());
  ASSERT_TRUE(w1.Heartbeat().ok());
}

// ServerLatency's `reporter` was never checked (an empty one was accepted too), and a
// server's latency was the median of every sample in the window, so one worker's flood decided
// it. Forged samples made the controller restart a healthy ps2. Now a sample's reporter is the
// calling worker, and each reporter has one vote per server and window.
class ForgedLatencyTest : public ::testing::Test {
 protected:
  static testing::HarnessOptions Options() {
    testing::HarnessOptions o;
    o.policy = "hot-server-restart-1s";
    o.adjust = [](PacerdOptions& p) { p.reconciler.mode = JobMode::kAsync; };
    return o;
  }
  void SetUp() override { ASSERT_TRUE(h_.ok()); }
  static ServerLatency Sample(const std::string& server, const std::string& reporter, double ms) {
    ServerLatency l;
    l.set_server_id(server);
    l.set_reporter(reporter);
    l.set_requests(20);
    l.set_mean_latency_ms(ms);
    l.set_p99_latency_ms(ms * 2);
    return l;
  }
  // The parameter servers run under an agent (pacer-agent --worker-id-prefix ps), so a
  // RESTART_SERVER would be carried out.
  void ServersAgentBeats() {
    AgentHeartbeat hb;
    hb.set_node("node-ps");
    hb.set_agent_id("agent-ps");
    hb.set_incarnation(1);
    for (const char* s : {"ps0", "ps1", "ps2"}) {
      WorkerProcess* w = hb.add_workers();
      w->set_worker_id(s);
      w->set_pid(100);
      w->set_state(WORKER_STATE_RUNNING);
    }
    AgentHeartbeatReply reply;
    ASSERT_TRUE(h_->agents()->Heartbeat(hb, &reply).ok());
  }

  testing::PacerdHarness h_{Options()};
};

TEST_F(ForgedLatencyTest, AWorkerCannotMakeAHealthyServerLookHot) {
  auto monitor = Monitor::NewStub(h_.channel());
  std::vector<std::unique_ptr<testing::ScriptedWorker>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<testing::ScriptedWorker>(
        h_, testing::ScriptedWorker::Options{.id = "w" + std::to_string(i), .node = "n" + std::to_string(i)}));
    ASSERT_TRUE(workers.back()->Connect().ok());
  }
  const std::string& attacker = workers[1]->credential();
  int forged_accepted = 0;
  for (int tick = 1; tick <= 80; ++tick) {
    if (tick % 10 == 1) ServersAgentBeats();
    h_.Advance(100);
    for (auto& w : workers) {
      ASSERT_TRUE(w->Step(0.06, 0.09, 0.03).ok());
      ReportStepsRequest req;
      for (const char* s : {"ps0", "ps1", "ps2"}) *req.add_server_latency() = Sample(s, w->id(), 5.0);
      if (w->id() == "w1") {  // its own view of ps2, two hundred times
        for (int k = 0; k < 200; ++k) *req.add_server_latency() = Sample("ps2", "w1", 400.0);
      }
      grpc::ClientContext ctx;
      AttachToken(&ctx, w->credential());
      ReportStepsResponse resp;
      ASSERT_TRUE(monitor->ReportSteps(&ctx, req, &resp).ok());
    }
    // ... and as the other workers and as nobody.
    ReportStepsRequest forged;
    for (const char* reporter : {"w0", "w2", ""}) {
      for (int k = 0; k < 50; ++k) *forged.add_server_latency() = Sample("ps2", reporter, 400.0);
    }
    grpc::ClientContext ctx;
    AttachToken(&ctx, attacker);
    ReportStepsResponse resp;
    grpc::Status s = monitor->ReportSteps(&ctx, forged, &resp);
    if (s.ok() && resp.accepted() > 0) ++forged_accepted;
    if (s.ok()) continue;
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  EXPECT_EQ(forged_accepted, 0);
  const ListActionsResponse actions = h_.Actions();
  for (const ActionRecord& a : actions.actions()) {
    EXPECT_FALSE(a.kind() == "RESTART_SERVER" || a.kind() == "RELIEVE_SERVER")
        << a.kind() << " " << a.target() << " " << a.outcome() << ": " << a.reason();
  }
  grpc::ClientContext ctx;
  AttachToken(&ctx, h_.admin_token());
  ListWorkersResponse status;
  ASSERT_TRUE(monitor->ListWorkers(&ctx, ListWorkersRequest(), &status).ok());
  ASSERT_EQ(status.servers_size(), 3);
  for (const WorkerStatus& s : status.servers()) {
    EXPECT_NE(s.classification().worker_class(), WORKER_CLASS_STRAGGLER) << s.ShortDebugString();
    EXPECT_LT(s.latency_ms(), 10.0) << s.id();
  }
}

}  // namespace
}  // namespace pacer
