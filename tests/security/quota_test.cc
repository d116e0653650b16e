// Quotas against a real pacerd on loopback: a flood of agent heartbeats (a launcher's job token,
// which may list any workers: an agent credential lists only the workers registered on its node)
// reaches the agent-table quota with RESOURCE_EXHAUSTED while pacerd's memory
// stays bounded, and an honest agent's heartbeat is served promptly during the flood (heartbeat
// validation looks workers up in an index: it no longer compares every listed worker with every
// worker of every agent under the registry's lock); the rendezvous store's byte cap holds for
// keys written through Add as for Set.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "common/auth.h"
#include "proto/pacer/agent.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/rendezvous.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using namespace std::chrono_literals;

using testing::RssKb;

AgentHeartbeat Heartbeat(const std::string& node, int workers, int first_worker) {
  AgentHeartbeat hb;
  hb.set_job("job");
  hb.set_node(node);
  hb.set_agent_id(node);
  hb.set_incarnation(1);
  for (int i = 0; i < workers; ++i) {
    WorkerProcess* w = hb.add_workers();
    w->set_worker_id("w" + std::to_string(first_worker + i));
    w->set_pid(1000 + i);
    w->set_state(WORKER_STATE_RUNNING);
  }
  return hb;
}

class QuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
    channel_ = grpc::CreateChannel(pacerd_->address(), grpc::InsecureChannelCredentials());
  }
  std::string Agent(const std::string& node) {
    return MintCredential(pacerd_->job_token(), CredentialKind::kAgent, node).value();
  }
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx.get(), token);
    ctx->set_deadline(std::chrono::system_clock::now() + 30s);
    return ctx;
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true, .adjust = [](PacerdOptions& p) {
    p.agents.max_agents = 64;
    p.agents.max_workers_per_agent = 1024;
    p.rendezvous.max_bytes = 4 << 20;
    p.sharding.max_datasets = 50;
    p.sharding.max_files_total = 100'000;
    p.sharding.max_workers = 2'000;
    p.sharding.max_dataset_bytes = 32 << 20;
    p.monitor.max_nodes = 256;  // the node table: small, so one worker's flood reaches it quickly
  }}};
  const testing::TempDir& dir_ = h_.dir();
  Pacerd* pacerd_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(QuotaTest, AnAgentFloodReachesTheTableQuotaAndDoesNotDelayAnHonestAgent) {
  auto stub = AgentService::NewStub(channel_);
  AgentHeartbeatReply reply;
  ASSERT_TRUE(stub->Heartbeat(Ctx(pacerd_->job_token()).get(), Heartbeat("honest", 8, 900000), &reply).ok());
  const int64_t rss0 = RssKb();

  // 63 flooding agents fill the table (64 with the honest one), each listing 1 000 workers: 63 000
  // listed workers, more than the 40 000 that used to block an honest heartbeat for seconds. The
  // flood lists workers that never registered, which only the job token may (an agent credential's
  // unregistered workers are left out of the table); so does the honest agent, as pacer-agent does
  // with the job token, so each of its heartbeats looks its 8 workers up in the 63 000-entry index.
  std::atomic<bool> stop{false};
  std::atomic<int> flood_ok{0}, flood_exhausted{0}, flood_other{0};
  std::thread flood([&] {
    for (int round = 0; !stop.load(); ++round) {
      for (int a = 0; a < 80 && !stop.load(); ++a) {  // 80 > the 63 free places
        const std::string node = "flood-" + std::to_string(a);
        grpc::Status s = stub->Heartbeat(Ctx(pacerd_->job_token()).get(), Heartbeat(node, 1000, a * 1000), &reply);
        if (s.ok()) {
          ++flood_ok;
        } else if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++flood_exhausted;
        } else {
          ++flood_other;
        }
      }
    }
  });
  // The honest agent keeps heartbeating through the flood; its slowest heartbeat is reported.
  ASSERT_TRUE(testing::WaitFor([&] { return flood_exhausted.load() > 0; }, 60s));
  double worst_ms = 0;
  for (int i = 0; i < 50; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    grpc::Status s = stub->Heartbeat(Ctx(pacerd_->job_token()).get(), Heartbeat("honest", 8, 900000), &reply);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(s.ok()) << s.error_message();
    worst_ms = std::max(worst_ms, ms);
  }
  stop = true;
  flood.join();
  const int64_t rss1 = RssKb();
  std::cout << "flood: " << flood_ok << " heartbeats accepted, " << flood_exhausted
            << " RESOURCE_EXHAUSTED, " << flood_other << " other; agents "
            << pacerd_->agents()->Agents().size() << "; honest heartbeat worst " << worst_ms
            << " ms; RSS " << rss0 / 1024 << " -> " << rss1 / 1024 << " MiB" << std::endl;
  EXPECT_EQ(flood_other.load(), 0);
  EXPECT_GT(flood_exhausted.load(), 0);
  EXPECT_EQ(pacerd_->agents()->Agents().size(), 64u);
  // A bound an order of magnitude above what the index needs (a few ms on a loaded 2-core
  // machine) and below the seconds the quadratic check took.
  EXPECT_LT(worst_ms, 1500.0);
  // 64 agents x 1 000 workers of state: tens of MiB at most, not the gigabytes of an unbounded table.
  EXPECT_LT(rss1 - rss0, 256 * 1024) << "RSS grew by " << (rss1 - rss0) / 1024 << " MiB";

  // One heartbeat past the per-agent list limit is refused whole.
  grpc::Status s = stub->Heartbeat(Ctx(pacerd_->job_token()).get(), Heartbeat("honest", 1025, 900000), &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
}

TEST_F(QuotaTest, TheRendezvousStoreCapHoldsForAdd) {
  auto stub = Rendezvous::NewStub(channel_);
  const std::string chief = MintCredential(pacerd_->job_token(), CredentialKind::kChief, "w0").value();
  RegisterWorkerRequest reg;  // a Join carries the incarnation of the worker's registration
  reg.set_worker_id("w0");
  RegisterWorkerResponse registered;
  ASSERT_TRUE(ShardingService::NewStub(channel_)->RegisterWorker(Ctx(chief).get(), reg, &registered).ok());
  RendezvousJoinRequest join;
  join.set_worker_id("w0");
  join.set_incarnation(registered.incarnation());
  join.set_rank(0);
  join.set_world_size(1);
  RendezvousJoinResponse joined;
  ASSERT_TRUE(stub->Join(Ctx(chief).get(), join, &joined).ok());
  const int64_t rss0 = RssKb();
  RendezvousAddRequest add;
  add.set_generation(joined.generation());
  add.set_delta(1);
  grpc::Status last;
  RendezvousAddResponse added;
  int n = 0;
  for (; n < 5000 && last.ok(); ++n) {  // 4 MiB / ~4 KiB per key: about 1 000 fit
    add.set_key(std::to_string(n) + std::string(4000, 'k'));
    last = stub->Add(Ctx(chief).get(), add, &added);
  }
  const int64_t rss1 = RssKb();
  std::cout << "rendezvous Add: " << n - 1 << " keys stored before " << last.error_message()
            << "; RSS " << rss0 / 1024 << " -> " << rss1 / 1024 << " MiB" << std::endl;
  EXPECT_EQ(last.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_GT(n, 900);
  EXPECT_LT(n, 1100);
  EXPECT_LE(pacerd_->rendezvous()->stats().keys, 1100u);
  EXPECT_LT(rss1 - rss0, 64 * 1024);
}

// The sharding quotas, reached over gRPC by the job token (a launcher: a worker credential can
// register only itself, so a junk-worker flood needs the job token): datasets, files over every
// dataset and workers each end in RESOURCE_EXHAUSTED, and pacerd's memory stays bounded.
TEST_F(QuotaTest, DatasetFileAndWorkerQuotasBoundPacerdsMemory) {
  auto stub = ShardingService::NewStub(channel_);
  const std::string launcher = pacerd_->job_token();
  const int64_t rss0 = RssKb();
  // Files: 20 000 per dataset, the quota of 100 000 reached at the sixth dataset.
  grpc::Status files_refused;
  int file_datasets = 0;
  for (; file_datasets < 10 && files_refused.ok(); ++file_datasets) {
    RegisterDatasetRequest req;
    DatasetSpec* spec = req.mutable_spec();
    spec->set_name("files-" + std::to_string(file_datasets));
    for (int f = 0; f < 20'000; ++f) {
      FileSpec* file = spec->mutable_files()->add_files();
      file->set_path("/data/part-" + std::to_string(f) + ".rec");
      file->set_num_records(10);
    }
    RegisterDatasetResponse resp;
    files_refused = stub->RegisterDataset(Ctx(launcher).get(), req, &resp);
  }
  EXPECT_EQ(files_refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << files_refused.error_message();
  EXPECT_EQ(file_datasets, 6);
  // Datasets: 50 in all.
  grpc::Status datasets_refused;
  int datasets = file_datasets - 1;
  for (; datasets < 200 && datasets_refused.ok(); ++datasets) {
    RegisterDatasetRequest req;
    req.mutable_spec()->set_name("d-" + std::to_string(datasets));
    req.mutable_spec()->set_num_records(1000);
    RegisterDatasetResponse resp;
    datasets_refused = stub->RegisterDataset(Ctx(launcher).get(), req, &resp);
  }
  EXPECT_EQ(datasets_refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << datasets_refused.error_message();
  // Workers: 2 000 junk workers.
  grpc::Status workers_refused;
  int workers = 0;
  for (; workers < 3000 && workers_refused.ok(); ++workers) {
    RegisterWorkerRequest req;
    req.set_worker_id("junk-" + std::to_string(workers));
    RegisterWorkerResponse resp;
    workers_refused = stub->RegisterWorker(Ctx(launcher).get(), req, &resp);
  }
  EXPECT_EQ(workers_refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << workers_refused.error_message();
  EXPECT_EQ(workers, 2001);
  const int64_t rss1 = RssKb();
  std::cout << "sharding quotas: files refused after " << file_datasets - 1 << " x 20 000 ('"
            << files_refused.error_message() << "'), datasets after " << datasets - 1 << " ('"
            << datasets_refused.error_message() << "'), workers after " << workers - 1 << " ('"
            << workers_refused.error_message() << "'); RSS " << rss0 / 1024 << " -> " << rss1 / 1024
            << " MiB" << std::endl;
  EXPECT_LT(rss1 - rss0, 512 * 1024) << "RSS grew by " << (rss1 - rss0) / 1024 << " MiB";
}

// What datasets hold is counted in bytes (--max-dataset-bytes), not in datasets and files: a
// stream of 65 536 partitions is charged ~35 MiB whether or not any partition has data (its
// state, checkpoints and snapshot copies), and a file list of 4 096-byte paths 4 KiB a file.
// Both were taken while the dataset and file counts allowed them (156 such streams took pacerd
// to 8.1 GB).
TEST_F(QuotaTest, StreamPartitionsAndFilePathsCountInBytes) {
  auto stub = ShardingService::NewStub(channel_);
  const std::string worker = MintCredential(pacerd_->job_token(), CredentialKind::kWorker, "w1").value();
  const int64_t rss0 = RssKb();
  RegisterDatasetRequest stream;
  stream.mutable_spec()->set_name("stream");
  for (uint32_t p = 0; p < 65'536; ++p) stream.mutable_spec()->mutable_stream()->add_partitions()->set_id(p);
  RegisterDatasetResponse resp;
  grpc::Status s = stub->RegisterDataset(Ctx(worker).get(), stream, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max-dataset-bytes"), std::string::npos) << s.error_message();
  const std::string stream_refused = s.error_message();
  // Half the partitions fit.
  stream.mutable_spec()->mutable_stream()->mutable_partitions()->DeleteSubrange(32'768, 32'768);
  s = stub->RegisterDataset(Ctx(worker).get(), stream, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();

  // 2 500 files of 4 KiB paths: ~10 MiB, more than the ~14 MiB left can take twice.
  grpc::Status files_refused;
  int lists = 0;
  for (; lists < 5 && files_refused.ok(); ++lists) {
    RegisterDatasetRequest req;
    req.mutable_spec()->set_name("long-paths-" + std::to_string(lists));
    for (int f = 0; f < 2'500; ++f) {
      FileSpec* file = req.mutable_spec()->mutable_files()->add_files();
      file->set_path(std::string(4'080, 'p') + std::to_string(f));
      file->set_num_records(10);
    }
    files_refused = stub->RegisterDataset(Ctx(worker).get(), req, &resp);
  }
  EXPECT_EQ(files_refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << files_refused.error_message();
  EXPECT_EQ(lists, 2) << "file lists accepted while 5 000 files are far below the file quota";
  const int64_t rss1 = RssKb();
  std::cout << "dataset bytes: a stream of 65 536 partitions refused ('" << stream_refused
            << "'), of 32 768 taken, " << lists - 1 << " list(s) of 2 500 4 KiB paths taken; RSS "
            << rss0 / 1024 << " -> " << rss1 / 1024 << " MiB" << std::endl;
  EXPECT_LT(rss1 - rss0, 256 * 1024) << "RSS grew by " << (rss1 - rss0) / 1024 << " MiB";
}

// One client could fill a shared table and locked honest ones out. Each table is
// now bound per credential: a worker adds at most max_servers_per_reporter server rows and holds
// at most one node row of its own; an agent credential registers one agent, its node.

// One request with 4 096 junk server ids filled the monitor's server table (4 096), and an
// honest worker's sample for ps0 was then rejected.
TEST_F(QuotaTest, OneWorkerCannotFillTheServerTable) {
  auto monitor = Monitor::NewStub(channel_);
  const std::string w0 = MintCredential(pacerd_->job_token(), CredentialKind::kWorker, "w0").value();
  const std::string w1 = MintCredential(pacerd_->job_token(), CredentialKind::kWorker, "w1").value();
  for (const auto& [id, cred] : {std::pair{"w0", w0}, std::pair{"w1", w1}}) {
    MonitorRegisterRequest req;
    req.set_worker_id(id);
    MonitorRegisterResponse resp;
    ASSERT_TRUE(monitor->RegisterWorker(Ctx(cred).get(), req, &resp).ok());
  }
  auto sample = [](const std::string& server, const std::string& reporter) {
    ServerLatency l;
    l.set_server_id(server);
    l.set_reporter(reporter);
    l.set_requests(10);
    l.set_mean_latency_ms(2);
    l.set_p99_latency_ms(4);
    return l;
  };
  ReportStepsRequest junk;
  for (int i = 0; i < 4096; ++i) *junk.add_server_latency() = sample("junk-" + std::to_string(i), "w1");
  ReportStepsResponse resp;
  grpc::Status s = monitor->ReportSteps(Ctx(w1).get(), junk, &resp);
  std::cout << "junk servers: " << s.error_code() << " '" << s.error_message() << "', "
            << resp.accepted() << " accepted, " << resp.rejected() << " rejected" << std::endl;

  ReportStepsRequest honest;
  *honest.add_server_latency() = sample("ps0", "w0");
  ASSERT_TRUE(monitor->ReportSteps(Ctx(w0).get(), honest, &resp).ok());
  EXPECT_EQ(resp.accepted(), 1u) << resp.ShortDebugString();
  ListWorkersResponse workers;
  ASSERT_TRUE(monitor->ListWorkers(Ctx(w0).get(), ListWorkersRequest(), &workers).ok());
  bool ps0 = false;
  for (const WorkerStatus& server : workers.servers()) ps0 = ps0 || server.id() == "ps0";
  EXPECT_TRUE(ps0);
  EXPECT_LE(workers.servers_size(), 257) << "one worker added " << workers.servers_size() - 1 << " servers";
}

// 65 534 Monitor.RegisterWorker(own id, a new node name) calls filled the node table (here 256),
// after which an honest agent's ReportNode and an honest worker on a new node got
// RESOURCE_EXHAUSTED.
TEST_F(QuotaTest, OneWorkerCannotFillTheNodeTable) {
  auto monitor = Monitor::NewStub(channel_);
  const std::string w1 = MintCredential(pacerd_->job_token(), CredentialKind::kWorker, "w1").value();
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    MonitorRegisterRequest req;
    req.set_worker_id("w1");
    req.set_node("junk-node-" + std::to_string(i));
    MonitorRegisterResponse resp;
    if (!monitor->RegisterWorker(Ctx(w1).get(), req, &resp).ok()) ++refused;
  }
  std::cout << "one worker on 300 node names: " << refused << " registrations refused" << std::endl;

  ReportNodeRequest node;
  node.mutable_metrics()->set_node("honest-node");
  node.mutable_metrics()->set_interval_s(1);
  node.mutable_metrics()->set_num_cpus(4);
  ReportNodeResponse nresp;
  grpc::Status s = monitor->ReportNode(Ctx(Agent("honest-node")).get(), node, &nresp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  MonitorRegisterRequest req;
  req.set_worker_id("w2");
  req.set_node("n-w2");
  MonitorRegisterResponse resp;
  s = monitor->RegisterWorker(
      Ctx(MintCredential(pacerd_->job_token(), CredentialKind::kWorker, "w2").value()).get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ListWorkersResponse workers;
  ASSERT_TRUE(monitor->ListWorkers(Ctx(w1).get(), ListWorkersRequest(), &workers).ok());
  EXPECT_LE(workers.nodes_size(), 3) << "one worker holds " << workers.nodes_size() - 2 << " node rows";
}

// One agent credential registered 4 095 extra agent ids (here 63, the table holds 64) and the
// next honest agent got "the table is full".
TEST_F(QuotaTest, OneAgentCredentialCannotFillTheAgentTable) {
  auto stub = AgentService::NewStub(channel_);
  const std::string n1 = Agent("n1");
  int accepted = 0;
  for (int i = 0; i < 70; ++i) {
    AgentHeartbeat hb = Heartbeat("n1", 0, 0);
    hb.set_agent_id("extra-" + std::to_string(i));
    AgentHeartbeatReply reply;
    grpc::Status s = stub->Heartbeat(Ctx(n1).get(), hb, &reply);
    if (s.ok()) ++accepted;
    else EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  EXPECT_EQ(accepted, 0);
  AgentHeartbeatReply reply;
  grpc::Status s = stub->Heartbeat(Ctx(Agent("honest")).get(), Heartbeat("honest", 0, 0), &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_LE(pacerd_->agents()->Agents().size(), 1u);
}

}  // namespace
}  // namespace pacer
