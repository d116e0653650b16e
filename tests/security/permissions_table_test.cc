// The permissions table (docs/security.md, "What each caller may do"), tested as a table against a
// real pacerd on loopback: every method of every service pacerd serves, called by every kind of
// caller for its own id, and each cell checked — let through (the service then answers whatever
// it answers: OK, NOT_FOUND, INVALID_ARGUMENT ...), PERMISSION_DENIED or UNAUTHENTICATED.
//
// A caller acts as itself: a worker or chief credential names its own worker id, an agent
// credential its own node, a server credential its own id; the tokens name w1 / n0. What a
// credential may do as *another* id is identity_attack_test's subject. The table is complete by
// construction: every method of the seven services in the protos must have a row, and every
// row a method, so a new RPC cannot go untested.
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>

#include "common/auth.h"
#include "proto/pacer/agent.grpc.pb.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/operator.grpc.pb.h"
#include "proto/pacer/rendezvous.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"
#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

// What a cell expects.
enum Cell { Y, D, U };  // let through | PERMISSION_DENIED | UNAUTHENTICATED
constexpr const char* kCellName[] = {"let through", "PERMISSION_DENIED", "UNAUTHENTICATED"};

// The callers, in the table's column order.
enum Kind { kAdmin, kJob, kChief, kWorker, kAgent, kServer, kNone, kForged, kKinds };
constexpr const char* kKindName[] = {"admin", "job token", "chief w0", "worker w1",
                                     "agent n0", "server ps0", "none", "forged"};

struct Row {
  const char* method;  // Service/Method
  Cell cells[kKinds];
};

// clang-format off
constexpr Row kTable[] = {
  //  method                                 admin job chief worker agent server none forged
  {"ShardingService/RegisterDataset",      {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/RegisterWorker",       {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/FetchShard",           {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/ReportProgress",       {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/CompleteShard",        {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/ReleaseShard",         {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/Heartbeat",            {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/SaveCheckpoint",       {Y,    Y,  Y,    D,     D,    D,     U,   U}},
  {"ShardingService/RestoreCheckpoint",    {Y,    Y,  Y,    D,     D,    D,     U,   U}},
  {"ShardingService/ListDatasets",         {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ShardingService/SetAllocation",        {Y,    D,  D,    D,     D,    D,     U,   U}},
  {"ShardingService/SetTailBackup",        {Y,    D,  D,    D,     D,    D,     U,   U}},
  {"ShardingService/DeleteDataset",        {Y,    D,  D,    D,     D,    D,     U,   U}},
  {"ShardingService/ResetDataset",         {Y,    D,  D,    D,     D,    D,     U,   U}},
  {"Monitor/RegisterWorker",               {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"Monitor/ReportSteps",                  {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"Monitor/ReportNode",                   {Y,    Y,  D,    D,     Y,    D,     U,   U}},
  {"Monitor/ListWorkers",                  {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ControllerService/ListActions",        {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"ControllerService/ApplyPolicy",        {Y,    D,  D,    D,     D,    D,     U,   U}},
  {"AgentService/Heartbeat",               {Y,    Y,  D,    D,     Y,    D,     U,   U}},
  {"ContentionSwitch/SetContention",       {Y,    D,  D,    D,     D,    D,     U,   U}},
  {"ContentionSwitch/GetCommand",          {Y,    D,  D,    D,     D,    D,     U,   U}},
  {"Operator/ListAgents",                  {Y,    Y,  D,    D,     D,    D,     U,   U}},
  {"Operator/GetPolicy",                   {Y,    Y,  D,    D,     D,    D,     U,   U}},
  {"Operator/GetTimeline",                 {Y,    Y,  D,    D,     D,    D,     U,   U}},
  {"Operator/GetServer",                   {Y,    Y,  D,    D,     D,    D,     U,   U}},
  {"Rendezvous/Join",                      {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"Rendezvous/Reform",                    {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"Rendezvous/Set",                       {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"Rendezvous/Get",                       {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"Rendezvous/Add",                       {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
  {"Rendezvous/Check",                     {Y,    Y,  Y,    Y,     D,    D,     U,   U}},
};
// clang-format on

// The services pacerd registers (cmd/pacerd/pacerd.cc), by their full proto names.
const char* const kServices[] = {"pacer.ShardingService", "pacer.Monitor",          "pacer.ControllerService",
                                 "pacer.AgentService",    "pacer.ContentionSwitch", "pacer.Operator",
                                 "pacer.Rendezvous"};

struct Caller {
  std::optional<std::string> token;  // none: no authorization metadata
  std::string worker;                // the worker id it acts as
  std::string node;                  // the node it speaks for
};

// A request to `method` in which `c` acts as itself. Each names nothing that exists (a dataset
// "nope", generation 99 ...) where the call would change something shared, so the cells do not
// depend on the order they are tried in.
std::unique_ptr<google::protobuf::Message> RequestFor(const std::string& method, const Caller& c) {
  using Builder = std::function<std::unique_ptr<google::protobuf::Message>(const Caller&)>;
  static const std::map<std::string, Builder> kBuilders = {
      {"ShardingService/RegisterDataset", [](const Caller& c) {
         auto r = std::make_unique<RegisterDatasetRequest>();
         r->mutable_spec()->set_name("table-" + c.worker + "-" + c.node);
         r->mutable_spec()->set_num_records(10);
         r->mutable_spec()->set_shard_size(5);
         r->mutable_spec()->set_num_epochs(1);
         return r;
       }},
      {"ShardingService/RegisterWorker", [](const Caller& c) {
         auto r = std::make_unique<RegisterWorkerRequest>();
         r->set_worker_id(c.worker);
         return r;
       }},
      {"ShardingService/FetchShard", [](const Caller& c) {
         auto r = std::make_unique<FetchShardRequest>();
         r->set_worker_id(c.worker);
         r->set_incarnation(1);
         r->set_dataset("nope");
         return r;
       }},
      {"ShardingService/ReportProgress", [](const Caller& c) {
         auto r = std::make_unique<ProgressRequest>();
         r->set_worker_id(c.worker);
         r->set_incarnation(1);
         r->set_lease_id(1);
         return r;
       }},
      {"ShardingService/CompleteShard", [](const Caller& c) {
         auto r = std::make_unique<CompleteShardRequest>();
         r->set_worker_id(c.worker);
         r->set_incarnation(1);
         r->set_lease_id(1);
         return r;
       }},
      {"ShardingService/ReleaseShard", [](const Caller& c) {
         auto r = std::make_unique<ReleaseShardRequest>();
         r->set_worker_id(c.worker);
         r->set_incarnation(1);
         r->set_lease_id(1);
         return r;
       }},
      {"ShardingService/Heartbeat", [](const Caller& c) {
         auto r = std::make_unique<HeartbeatRequest>();
         r->set_worker_id(c.worker);
         r->set_incarnation(1);
         return r;
       }},
      {"ShardingService/SaveCheckpoint", [](const Caller& c) {
         auto r = std::make_unique<CheckpointRequest>();
         r->set_tag("table-" + c.worker);
         return r;
       }},
      {"ShardingService/RestoreCheckpoint", [](const Caller&) {
         auto r = std::make_unique<CheckpointRequest>();
         r->set_tag("nope");
         return r;
       }},
      {"ShardingService/ListDatasets", [](const Caller&) { return std::make_unique<ListDatasetsRequest>(); }},
      {"ShardingService/SetAllocation", [](const Caller&) { return std::make_unique<SetAllocationRequest>(); }},
      {"ShardingService/SetTailBackup", [](const Caller&) { return std::make_unique<SetTailBackupRequest>(); }},
      {"ShardingService/DeleteDataset", [](const Caller&) {
         auto r = std::make_unique<DeleteDatasetRequest>();
         r->set_dataset("nope");
         return r;
       }},
      {"ShardingService/ResetDataset", [](const Caller&) {
         auto r = std::make_unique<ResetDatasetRequest>();
         r->set_dataset("nope");
         return r;
       }},
      {"Monitor/RegisterWorker", [](const Caller& c) {
         auto r = std::make_unique<MonitorRegisterRequest>();
         r->set_worker_id(c.worker);
         return r;
       }},
      {"Monitor/ReportSteps", [](const Caller& c) {
         auto r = std::make_unique<ReportStepsRequest>();
         StepReport* s = r->add_steps();
         s->set_worker_id(c.worker);
         s->set_step(1);
         s->set_local_batch(1);
         s->set_samples(1);
         s->set_compute_s(0.1);
         s->set_wall_s(0.1);
         return r;
       }},
      {"Monitor/ReportNode", [](const Caller& c) {
         auto r = std::make_unique<ReportNodeRequest>();
         r->mutable_metrics()->set_node(c.node);
         r->mutable_metrics()->set_interval_s(1);
         r->mutable_metrics()->set_num_cpus(1);
         return r;
       }},
      {"Monitor/ListWorkers", [](const Caller&) { return std::make_unique<ListWorkersRequest>(); }},
      {"ControllerService/ListActions", [](const Caller&) { return std::make_unique<ListActionsRequest>(); }},
      {"ControllerService/ApplyPolicy", [](const Caller&) {
         auto r = std::make_unique<ApplyPolicyRequest>();
         r->set_file_name("empty.yaml");
         return r;
       }},
      {"AgentService/Heartbeat", [](const Caller& c) {
         auto r = std::make_unique<AgentHeartbeat>();
         r->set_job("job");
         r->set_node(c.node);
         r->set_agent_id(c.node);
         r->set_incarnation(1);
         return r;
       }},
      {"ContentionSwitch/SetContention", [](const Caller&) {
         auto r = std::make_unique<ContentionRequest>();
         r->set_worker_id("nope");
         r->set_factor(2);
         return r;
       }},
      {"ContentionSwitch/GetCommand", [](const Caller&) {
         auto r = std::make_unique<GetCommandRequest>();
         r->set_command_id("nope");
         return r;
       }},
      {"Operator/ListAgents", [](const Caller&) { return std::make_unique<ListAgentsRequest>(); }},
      {"Operator/GetPolicy", [](const Caller&) { return std::make_unique<GetPolicyRequest>(); }},
      {"Operator/GetTimeline", [](const Caller&) { return std::make_unique<GetTimelineRequest>(); }},
      {"Operator/GetServer", [](const Caller&) { return std::make_unique<GetServerRequest>(); }},
      {"Rendezvous/Join", [](const Caller& c) {
         auto r = std::make_unique<RendezvousJoinRequest>();
         r->set_worker_id(c.worker);
         r->set_incarnation(1);
         r->set_rank(-1);
         r->set_world_size(4);
         return r;
       }},
      {"Rendezvous/Reform", [](const Caller& c) {
         auto r = std::make_unique<RendezvousReformRequest>();
         r->set_worker_id(c.worker);
         r->set_generation(99);
         return r;
       }},
      {"Rendezvous/Set", [](const Caller&) {
         auto r = std::make_unique<RendezvousSetRequest>();
         r->set_generation(99);
         r->set_key("k");
         r->set_value("v");
         return r;
       }},
      {"Rendezvous/Get", [](const Caller&) {
         auto r = std::make_unique<RendezvousGetRequest>();
         r->set_generation(99);
         r->add_keys("k");
         return r;
       }},
      {"Rendezvous/Add", [](const Caller&) {
         auto r = std::make_unique<RendezvousAddRequest>();
         r->set_generation(99);
         r->set_key("c");
         r->set_delta(1);
         return r;
       }},
      {"Rendezvous/Check", [](const Caller&) {
         auto r = std::make_unique<RendezvousCheckRequest>();
         r->set_generation(99);
         r->add_keys("k");
         return r;
       }},
  };
  auto it = kBuilders.find(method);
  return it == kBuilders.end() ? nullptr : it->second(c);
}

class PermissionsTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    auto mint = [&](CredentialKind kind, const std::string& id) {
      return MintCredential(h_.job_token(), kind, id).value();
    };
    std::string forged = mint(CredentialKind::kWorker, "w1");
    forged.back() = forged.back() == '0' ? '1' : '0';
    callers_[kAdmin] = {h_.admin_token(), "w1", "n0"};
    callers_[kJob] = {h_.job_token(), "w1", "n0"};
    callers_[kChief] = {mint(CredentialKind::kChief, "w0"), "w0", "n0"};
    callers_[kWorker] = {mint(CredentialKind::kWorker, "w1"), "w1", "n0"};
    callers_[kAgent] = {mint(CredentialKind::kAgent, "n0"), "n0", "n0"};
    callers_[kServer] = {mint(CredentialKind::kServer, "ps0"), "ps0", "ps0"};
    callers_[kNone] = {std::nullopt, "w1", "n0"};
    callers_[kForged] = {forged, "w1", "n0"};
  }

  // One unary call through the generic stub: the request's bytes to "/pacer.<method>".
  grpc::Status Call(const std::string& method, const Caller& c, const google::protobuf::Message& req) {
    grpc::GenericStub stub(h_.channel());
    grpc::ClientContext ctx;
    if (c.token) AttachToken(&ctx, *c.token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    const std::string bytes = req.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&ctx, "/pacer." + method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      std::lock_guard<std::mutex> l(mu);
      status = s;
      done = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });  // the call's own deadline bounds the wait
    return status;
  }

  testing::PacerdHarness h_;
  Caller callers_[kKinds];
};

TEST_F(PermissionsTableTest, EveryMethodOfEveryServiceHasARow) {
  std::set<std::string> in_protos, in_table;
  for (const char* name : kServices) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int m = 0; m < service->method_count(); ++m) {
      in_protos.insert(service->name() + "/" + service->method(m)->name());
    }
  }
  for (const Row& row : kTable) {
    EXPECT_TRUE(in_table.insert(row.method).second) << row.method << " has two rows";
    EXPECT_NE(RequestFor(row.method, callers_[kAdmin]), nullptr) << row.method << " has no request";
  }
  EXPECT_EQ(in_protos, in_table);
  std::cout << "permissions table: " << in_table.size() << " methods x " << kKinds << " kinds = "
            << in_table.size() * kKinds << " cells" << std::endl;
}

TEST_F(PermissionsTableTest, EachCellIsAllowedOrRefusedAsTheTableSays) {
  int cells = 0, wrong = 0;
  for (const Row& row : kTable) {
    for (int k = 0; k < kKinds; ++k) {
      const Caller& c = callers_[k];
      auto req = RequestFor(row.method, c);
      ASSERT_NE(req, nullptr) << row.method;
      const grpc::Status s = Call(row.method, c, *req);
      const Cell got = s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? D
                       : s.error_code() == grpc::StatusCode::UNAUTHENTICATED ? U
                                                                             : Y;
      ++cells;
      if (got == row.cells[k]) continue;
      ++wrong;
      ADD_FAILURE() << row.method << " by " << kKindName[k] << ": expected " << kCellName[row.cells[k]]
                    << ", got " << s.error_code() << " '" << s.error_message() << "'";
    }
  }
  std::cout << cells << " cells, " << wrong << " not as the table says" << std::endl;
}

// A refusal names the credential and what it tried, and never reveals a secret.
TEST_F(PermissionsTableTest, ARefusalNamesTheCredential) {
  auto req = RequestFor("Operator/ListAgents", callers_[kWorker]);
  grpc::Status s = Call("Operator/ListAgents", callers_[kWorker], *req);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("the worker credential of 'w1'"), std::string::npos) << s.error_message();
  req = RequestFor("ShardingService/ListDatasets", callers_[kServer]);
  s = Call("ShardingService/ListDatasets", callers_[kServer], *req);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("the server credential of 'ps0'"), std::string::npos) << s.error_message();
  for (const std::string& secret : {h_.job_token(), h_.admin_token()}) {
    EXPECT_EQ(s.error_message().find(secret), std::string::npos);
  }
}

}  // namespace
}  // namespace pacer
