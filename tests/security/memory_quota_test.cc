// pacerd's memory with every quota a client can reach filled, against the real pacerd binary at
// its default quotas (docs/security.md, "Memory at the default quotas"). Each quota is filled by
// one credential — a worker's where a worker can reach it, the chief's, an agent's, the job
// token's — one after the other, in one pacerd. After each the test prints pacerd's RSS and
// checks that pacerd is alive, under 1 GiB, and still serves an honest worker and agent.
//
// The attacks that once took pacerd down are among the steps: a rendezvous Get that names a 1 MiB key
// 4 096 times (a 4 GiB reply: pacerd aborted), parked Gets holding their keys, stream datasets of
// 65 536 partitions, file lists of 4 096-byte paths.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "proto/pacer/agent.grpc.pb.h"
#include "proto/pacer/rendezvous.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "tests/testing/pacerd_process.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using namespace std::chrono_literals;
using testing::PacerdProcess;

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kLimitKb = 1024 * 1024;  // 1 GiB

using testing::RssKb;

class MemoryQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pacerd_.Start();
    ASSERT_TRUE(pacerd_.running());
    job_ = testing::ReadFileOrEmpty(dir_.Sub("data/job.token"));
    while (!job_.empty() && (job_.back() == '\n' || job_.back() == ' ')) job_.pop_back();
    ASSERT_FALSE(job_.empty());
    channel_ = grpc::CreateChannel(pacerd_.address(), grpc::InsecureChannelCredentials());
    sharding_ = ShardingService::NewStub(channel_);
    rendezvous_ = Rendezvous::NewStub(channel_);
    agents_ = AgentService::NewStub(channel_);
  }
  void TearDown() override { pacerd_.Kill9(); }

  std::string Cred(CredentialKind kind, const std::string& id) {
    return MintCredential(job_, kind, id).value();
  }
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token,
                                                  std::chrono::seconds timeout = 60s) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx.get(), token);
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    return ctx;
  }

  // Prints pacerd's RSS after `step` and checks the properties every step must keep.
  void Checkpoint(const std::string& step) {
    ASSERT_TRUE(pacerd_.running()) << "pacerd died during: " << step << "\n"
                                   << testing::ReadFileOrEmpty(dir_.Sub("pacerd.log"));
    const int64_t kb = RssKb(pacerd_.pid());
    std::printf("pacerd RSS after %-58s %7.1f MiB\n", (step + ":").c_str(), kb / 1024.0);
    std::fflush(stdout);
    peak_kb_ = std::max(peak_kb_, kb);
    EXPECT_LT(kb, kLimitKb) << step;
    HonestCallsAreServed(step);
  }

  // An honest worker fetches a shard of the job's dataset and an honest agent heartbeats.
  void HonestCallsAreServed(const std::string& step) {
    const std::string w0 = Cred(CredentialKind::kChief, "w0");
    FetchShardRequest f;
    f.set_worker_id("w0");
    f.set_incarnation(w0_incarnation_);
    f.set_dataset("honest");
    f.set_request_id(++request_id_);
    FetchShardResponse fr;
    grpc::Status s = sharding_->FetchShard(Ctx(w0).get(), f, &fr);
    EXPECT_TRUE(s.ok()) << step << ": " << s.error_message();
    if (s.ok() && fr.outcome() == FetchShardResponse::LEASED) {
      CompleteShardRequest c;
      c.set_worker_id("w0");
      c.set_incarnation(w0_incarnation_);
      c.set_lease_id(fr.lease().lease_id());
      c.set_fencing_token(fr.lease().fencing_token());
      CompleteShardResponse cr;
      s = sharding_->CompleteShard(Ctx(w0).get(), c, &cr);
      EXPECT_TRUE(s.ok()) << step << ": " << s.error_message();
    }
    AgentHeartbeat hb;
    hb.set_job("job");
    hb.set_node("n0");
    hb.set_agent_id("n0");
    hb.set_incarnation(1);
    WorkerProcess* w = hb.add_workers();
    w->set_worker_id("w0");
    w->set_pid(4242);
    w->set_state(WORKER_STATE_RUNNING);
    AgentHeartbeatReply reply;
    s = agents_->Heartbeat(Ctx(Cred(CredentialKind::kAgent, "n0")).get(), hb, &reply);
    EXPECT_TRUE(s.ok()) << step << ": " << s.error_message();
  }

  uint64_t RegisterWorker(const std::string& token, const std::string& id, const std::string& node) {
    RegisterWorkerRequest r;
    r.set_worker_id(id);
    r.set_node(node);
    RegisterWorkerResponse resp;
    grpc::Status s = sharding_->RegisterWorker(Ctx(token).get(), r, &resp);
    EXPECT_TRUE(s.ok()) << id << ": " << s.error_message();
    return resp.incarnation();
  }

  testing::TempDir dir_;
  // Every quota at its default. The timeouts are long because the honest worker checks in only
  // between the steps, and a flood takes a minute on a loaded 2-core machine.
  PacerdProcess pacerd_{dir_, {"--lease-timeout-ms", "600000", "--worker-timeout-ms", "1200000"}};
  std::string job_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ShardingService::Stub> sharding_;
  std::unique_ptr<Rendezvous::Stub> rendezvous_;
  std::unique_ptr<AgentService::Stub> agents_;
  uint64_t w0_incarnation_ = 0;
  uint64_t request_id_ = 0;
  int64_t peak_kb_ = 0;
};

TEST_F(MemoryQuotaTest, EveryQuotaFilledByOneCredentialKeepsPacerdUnderOneGiB) {
  const std::string chief = Cred(CredentialKind::kChief, "w0");
  const std::string worker = Cred(CredentialKind::kWorker, "w1");  // the attacker

  // The honest job: a dataset, the chief w0 on node n0 (its agent heartbeats), the group open.
  {
    RegisterDatasetRequest r;
    r.mutable_spec()->set_name("honest");
    r.mutable_spec()->set_num_records(1'000'000);
    r.mutable_spec()->set_shard_size(10);
    RegisterDatasetResponse resp;
    ASSERT_TRUE(sharding_->RegisterDataset(Ctx(chief).get(), r, &resp).ok());
  }
  w0_incarnation_ = RegisterWorker(chief, "w0", "n0");
  const uint64_t w1_incarnation = RegisterWorker(worker, "w1", "n0");
  uint64_t generation = 0;
  {
    RendezvousJoinRequest j;
    j.set_worker_id("w0");
    j.set_incarnation(w0_incarnation_);
    j.set_rank(0);
    j.set_world_size(2);
    RendezvousJoinResponse jr;
    grpc::Status s = rendezvous_->Join(Ctx(chief).get(), j, &jr);
    ASSERT_TRUE(s.ok()) << s.error_message();
    j.set_worker_id("w1");
    j.set_incarnation(w1_incarnation);
    j.set_rank(1);
    s = rendezvous_->Join(Ctx(worker).get(), j, &jr);
    ASSERT_TRUE(s.ok()) << s.error_message();
    generation = jr.generation();
  }
  Checkpoint("start");

  // 1. The rendezvous store, filled by the worker with 1 MiB values (its share: 16 MiB).
  const std::string mib(kMiB - 256, 'v');
  int stored = 0;
  for (;; ++stored) {
    RendezvousSetRequest r;
    r.set_generation(generation);
    r.set_key("big-" + std::to_string(stored));
    r.set_value(mib);
    RendezvousSetResponse resp;
    grpc::Status s = rendezvous_->Set(Ctx(worker).get(), r, &resp);
    if (!s.ok()) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      EXPECT_NE(s.error_message().find("max_bytes_per_caller"), std::string::npos) << s.error_message();
      break;
    }
    ASSERT_LT(stored, 100) << "the store took more than 100 MiB";
  }
  EXPECT_GE(stored, 12);
  Checkpoint("rendezvous store full (" + std::to_string(stored) + " x 1 MiB)");

  // 2. A Get naming a 1 MiB key 4 096 times would be a 4 GiB reply.
  {
    RendezvousGetRequest r;
    r.set_generation(generation);
    for (int i = 0; i < 4096; ++i) r.add_keys("big-0");
    RendezvousGetResponse resp;
    grpc::Status s = rendezvous_->Get(Ctx(worker).get(), r, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("reply limit"), std::string::npos) << s.error_message();
  }
  Checkpoint("a Get of one 1 MiB key x 4096");

  // 3. Parked Gets. A 48 MiB key is refused; then the worker parks Gets of 512 keys of
  // 1 KiB each until its waiting budget refuses one. Every parked Get stays parked until the
  // test ends (their deadline), so what they hold is held when RSS is read.
  {
    RendezvousGetRequest r;
    r.set_generation(generation);
    r.add_keys(std::string(48 * kMiB, 'k'));
    r.set_wait(true);
    RendezvousGetResponse resp;
    grpc::Status s = rendezvous_->Get(Ctx(worker).get(), r, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  struct Parked {
    std::unique_ptr<grpc::ClientContext> ctx;
    RendezvousGetRequest req;
    RendezvousGetResponse resp;
  };
  std::vector<std::unique_ptr<Parked>> parked;
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  grpc::Status refused;
  // Every parked call is cancelled and has finished before the locals its callback uses go
  // away, also when an assertion ends the test early.
  struct CancelAll {
    std::vector<std::unique_ptr<Parked>>& parked;
    std::mutex& mu;
    std::condition_variable& cv;
    int& finished;
    ~CancelAll() {
      for (auto& p : parked) p->ctx->TryCancel();
      std::unique_lock<std::mutex> l(mu);
      cv.wait_for(l, std::chrono::seconds(60), [&] { return finished == static_cast<int>(parked.size()); });
    }
  } cancel_all{parked, mu, cv, finished};
  auto park = [&](int i) {
    auto p = std::make_unique<Parked>();
    p->ctx = Ctx(worker, 120s);
    p->req.set_generation(generation);
    p->req.set_wait(true);
    for (int k = 0; k < 512; ++k) {
      p->req.add_keys(std::string(1000, 'a' + k % 26) + std::to_string(i) + "-" + std::to_string(k));
    }
    Parked* raw = p.get();
    parked.push_back(std::move(p));
    rendezvous_->async()->Get(raw->ctx.get(), &raw->req, &raw->resp, [&](grpc::Status s) {
      std::lock_guard<std::mutex> l(mu);
      ++finished;
      if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) refused = s;
      cv.notify_all();
    });
  };
  for (int i = 0; i < 64; ++i) {
    park(i);
    std::unique_lock<std::mutex> l(mu);
    // A parked Get does not finish; the one the budget refuses does, at once.
    if (cv.wait_for(l, 200ms, [&] { return finished > 0; })) break;
  }
  {
    std::unique_lock<std::mutex> l(mu);
    EXPECT_TRUE(cv.wait_for(l, 5s, [&] { return finished > 0; }))
        << "64 Gets of 512 KiB of keys parked: no waiting budget";
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
    EXPECT_NE(refused.error_message().find("max_waiting_bytes_per_caller"), std::string::npos)
        << refused.error_message();
  }
  // Another credential still parks (and is woken): the chief waits for a key the worker sets
  // once it has made room in the full store.
  {
    std::thread setter([&] {
      RendezvousSetRequest r;
      r.set_generation(generation);
      r.set_key("big-1");
      r.set_value("x");
      RendezvousSetResponse resp;
      EXPECT_TRUE(rendezvous_->Set(Ctx(worker).get(), r, &resp).ok());
      r.set_key("honest-key");
      // Not synchronisation: whether the chief's Get parks first or not, it gets the value.
      EXPECT_TRUE(rendezvous_->Set(Ctx(worker).get(), r, &resp).ok());
    });
    RendezvousGetRequest r;
    r.set_generation(generation);
    r.add_keys("honest-key");
    r.set_wait(true);
    RendezvousGetResponse resp;
    grpc::Status s = rendezvous_->Get(Ctx(chief).get(), r, &resp);
    setter.join();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  Checkpoint("the worker's waiting budget full (" + std::to_string(parked.size() - 1) + " Gets)");

  // 4. Stream datasets of 65 536 partitions (156 of them took pacerd to 8.1 GB), then
  // 5. file lists of 4 096-byte paths (the file count quota alone would take 2 M
  // such files, 8 GiB), registered by the worker until the dataset bytes quota refuses one.
  int streams = 0;
  for (; streams < 4; ++streams) {
    RegisterDatasetRequest r;
    r.mutable_spec()->set_name("stream-" + std::to_string(streams));
    for (uint32_t p = 0; p < 65536; ++p) r.mutable_spec()->mutable_stream()->add_partitions()->set_id(p);
    RegisterDatasetResponse resp;
    grpc::Status s = sharding_->RegisterDataset(Ctx(worker).get(), r, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();  // 4 x ~35 MiB of the 256
  }
  Checkpoint("datasets: " + std::to_string(streams) + " streams of 65536 partitions");
  int lists = 0;
  for (;; ++lists) {
    RegisterDatasetRequest r;
    r.mutable_spec()->set_name("files-" + std::to_string(lists));
    for (int f = 0; f < 2000; ++f) {
      FileSpec* fs = r.mutable_spec()->mutable_files()->add_files();
      fs->set_path(std::string(4090, 'p') + std::to_string(f));
      fs->set_num_records(10);
    }
    RegisterDatasetResponse resp;
    grpc::Status s = sharding_->RegisterDataset(Ctx(worker).get(), r, &resp);
    if (!s.ok()) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      EXPECT_NE(s.error_message().find("--max-dataset-bytes"), std::string::npos) << s.error_message();
      break;
    }
    ASSERT_LT(lists, 64) << "64 lists of 2 000 files of 4 KiB paths (500 MiB) registered";
  }
  EXPECT_GT(lists, 0);
  Checkpoint("datasets: " + std::to_string(lists) + " lists of 2000 files of 4 KiB paths more");

  // 6. Checkpoints: the chief saves the most it may (64).
  for (int c = 0; c < 70; ++c) {
    CheckpointRequest r;
    r.set_tag("cp-" + std::to_string(c));
    CheckpointResponse resp;
    grpc::Status s = sharding_->SaveCheckpoint(Ctx(chief).get(), r, &resp);
    if (!s.ok()) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      break;
    }
  }
  Checkpoint("checkpoints: the chief saved the most it may");

  // 7. Workers: the job token registers workers until the table (65 536) is full, 16 a node.
  constexpr int kJunkPerNode = 16;
  {
    std::atomic<int> next{0}, exhausted{0}, other{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&] {
        for (int i; (i = next++) < 65'540;) {
          RegisterWorkerRequest r;
          r.set_worker_id("junk-" + std::to_string(i));
          r.set_node("flood-" + std::to_string(i / kJunkPerNode));
          RegisterWorkerResponse resp;
          grpc::Status s = sharding_->RegisterWorker(Ctx(job_).get(), r, &resp);
          if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
            ++exhausted;
          } else if (!s.ok()) {
            ++other;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_GT(exhausted.load(), 0);
    EXPECT_EQ(other.load(), 0);
  }
  Checkpoint("workers: 65536 registered by the job token");

  // 8. Agents: the job token registers an agent for each node of junk workers, each listing its
  // node's workers, until the agent table (4 096) refuses one.
  {
    std::atomic<int> next{0}, exhausted{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int a; exhausted.load() == 0 && (a = next++) < 5000;) {
          AgentHeartbeat hb;
          hb.set_job("job");
          hb.set_node("flood-" + std::to_string(a));
          hb.set_agent_id(hb.node());
          hb.set_incarnation(1);
          for (int w = 0; w < kJunkPerNode; ++w) {
            WorkerProcess* p = hb.add_workers();
            p->set_worker_id("junk-" + std::to_string(a * kJunkPerNode + w));
            p->set_pid(1000 + w);
            p->set_state(WORKER_STATE_RUNNING);
          }
          AgentHeartbeatReply reply;
          grpc::Status s = agents_->Heartbeat(Ctx(job_).get(), hb, &reply);
          if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_GT(exhausted.load(), 0);
  }
  Checkpoint("agents: the table filled by the job token");

  std::printf("pacerd peak RSS over every step: %.1f MiB (limit 1024 MiB)\n", peak_kb_ / 1024.0);
  for (auto& p : parked) p->ctx->TryCancel();
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, 60s, [&] { return finished == static_cast<int>(parked.size()); }));
}

}  // namespace
}  // namespace pacer
