// Parameter-server backend (worker_sdk/ps): the store's optimizers by hand-computed values, and
// two in-process pacer-ps servers on loopback (port 0) behind one PsClient: keys spread over
// both servers, pull/push round trips in key order, async pushes, dense tensors, per-server
// latency stats, authentication and bad input as clear errors.
#include <atomic>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "worker_sdk/ps/parameter_store.h"
#include "worker_sdk/ps/ps_client.h"
#include "worker_sdk/ps/ps_server.h"

namespace pacer {
namespace {

PsTableSpec Spec(const std::string& name, uint32_t dim, PsOptimizer::Kind kind, float lr, float scale = 0) {
  PsTableSpec s;
  s.set_name(name);
  s.set_dim(dim);
  s.mutable_optimizer()->set_kind(kind);
  s.mutable_optimizer()->set_learning_rate(lr);
  s.mutable_optimizer()->set_initial_accumulator(0.1f);
  s.set_init_scale(scale);
  s.set_seed(5);
  return s;
}

TEST(ParameterStoreTest, SgdAndAdagradStepsAndDuplicateKeysSum) {
  ParameterStore store;
  ASSERT_TRUE(*store.CreateTable(Spec("sgd", 2, PsOptimizer::SGD, 0.5f)));
  ASSERT_FALSE(*store.CreateTable(Spec("sgd", 2, PsOptimizer::SGD, 0.5f)));  // identical: fine
  EXPECT_EQ(store.CreateTable(Spec("sgd", 3, PsOptimizer::SGD, 0.5f)).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(*store.CreateTable(Spec("ada", 1, PsOptimizer::ADAGRAD, 1.0f)));
  // Key 7 twice: gradients sum before one step. w = 0 - 0.5 * (1 + 3) = -2.
  ASSERT_TRUE(store.Push("sgd", {7, 7, 9}, {1, 2, 3, 4, 5, 6}).ok());
  std::vector<float> v;
  ASSERT_TRUE(store.Pull("sgd", {7, 9}, &v).ok());
  EXPECT_EQ(v, (std::vector<float>{-2, -3, -2.5, -3}));
  // Adagrad: a = 0.1 + 4 = 4.1; w = -1 * 2 / sqrt(4.1).
  ASSERT_TRUE(store.Push("ada", {1}, {2}).ok());
  v.clear();
  ASSERT_TRUE(store.Pull("ada", {1}, &v).ok());
  EXPECT_NEAR(v[0], -2.0 / std::sqrt(4.1), 1e-6);
  EXPECT_EQ(store.Push("sgd", {1}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Push("sgd", {1}, {NAN, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Pull("nope", {1}, &v).code(), absl::StatusCode::kNotFound);
}

TEST(ParameterStoreTest, RowsInitialiseFromSeedAndKeyOnEveryServer) {
  ParameterStore a, b;
  ASSERT_TRUE(a.CreateTable(Spec("emb", 4, PsOptimizer::SGD, 0.1f, 0.05f)).ok());
  ASSERT_TRUE(b.CreateTable(Spec("emb", 4, PsOptimizer::SGD, 0.1f, 0.05f)).ok());
  std::vector<float> va, vb;
  ASSERT_TRUE(a.Pull("emb", {42, 43}, &va).ok());
  ASSERT_TRUE(b.Pull("emb", {42, 43}, &vb).ok());
  EXPECT_EQ(va, vb);
  for (float x : va) EXPECT_LE(std::abs(x), 0.05f);
  EXPECT_NE(std::vector<float>(va.begin(), va.begin() + 4), std::vector<float>(va.begin() + 4, va.end()));
}

class PsClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      PsServerOptions o;
      o.server_id = "ps" + std::to_string(i);
      o.job_token = "secret";
      auto s = PsServer::Start(o);
      ASSERT_TRUE(s.ok()) << s.status();
      servers_.push_back(std::move(*s));
    }
  }
  std::unique_ptr<PsClient> Client(const std::string& token = "secret") {
    PsClientOptions o;
    for (auto& s : servers_) o.servers.push_back(s->address());
    o.token = token;
    o.reporter = "w0";
    o.rpc_timeout_ms = 5'000;
    auto c = PsClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }
  std::vector<std::unique_ptr<PsServer>> servers_;
};

TEST_F(PsClusterTest, PullPushAcrossServersInKeyOrder) {
  auto c = Client();
  ASSERT_TRUE(c->CreateTable(Spec("emb", 3, PsOptimizer::SGD, 1.0f)).ok());
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  for (uint64_t k = 0; k < 200; ++k) {
    keys.push_back(k * 7919);
    for (int j = 0; j < 3; ++j) grads.push_back(static_cast<float>(k) + 0.25f * j);
  }
  auto pushed = c->PushAsync("emb", keys, grads);  // async: returns at once
  ASSERT_TRUE(pushed.get().ok());
  std::vector<float> v;
  ASSERT_TRUE(c->Pull("emb", keys, &v).ok());
  ASSERT_EQ(v.size(), grads.size());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], -grads[i]) << i;  // w = 0 - 1.0 * g
  // Both servers hold rows, and together exactly the 200 keys.
  uint64_t rows = 0;
  for (auto& s : servers_) {
    EXPECT_GT(s->store().rows(), 20u);
    rows += s->store().rows();
  }
  EXPECT_EQ(rows, 200u);
  // Latency stats: one entry per server, every request counted once, then reset.
  auto lat = c->TakeLatency(1);
  ASSERT_EQ(lat.size(), 2u);
  std::set<std::string> ids;
  for (const auto& l : lat) {
    ids.insert(l.server_id());
    EXPECT_EQ(l.requests(), 2u);  // one push + one pull
    EXPECT_EQ(l.reporter(), "w0");
    EXPECT_GE(l.p99_latency_ms(), l.mean_latency_ms() * 0.999 - 1e-9);
  }
  EXPECT_EQ(ids, (std::set<std::string>{"ps0", "ps1"}));
  EXPECT_TRUE(c->TakeLatency(2).empty());
}

TEST_F(PsClusterTest, DenseTensorRoundTrip) {
  auto c = Client();
  ASSERT_TRUE(c->CreateTable(Spec("dense", 16, PsOptimizer::SGD, 0.5f)).ok());
  std::vector<float> g(100);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  ASSERT_TRUE(c->PushDenseAsync("dense", g).get().ok());
  std::vector<float> v;
  ASSERT_TRUE(c->PullDense("dense", 100, &v).ok());
  ASSERT_EQ(v.size(), 100u);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], -0.5f * g[i]);
}

TEST_F(PsClusterTest, BadInputIsAClearError) {
  auto bad = Client("wrong");
  absl::Status s = bad->CreateTable(Spec("t", 1, PsOptimizer::SGD, 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  auto c = Client();
  std::vector<float> v;
  EXPECT_EQ(c->Pull("never-created", {1}, &v).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->CreateTable(Spec("t", 0, PsOptimizer::SGD, 1.0f)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->CreateTable(Spec("t", 2, PsOptimizer::SGD, 1.0f)).ok());
  EXPECT_EQ(c->Push("t", {1}, {1}).code(), absl::StatusCode::kInvalidArgument);
  // An unreachable server: an error within the deadline, no hang.
  servers_[1]->Shutdown();
  std::vector<uint64_t> keys(50);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k;
  absl::Status down = c->Pull("t", keys, &v);
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_TRUE(v.empty());
}

// A server serving one call at a time (--max-threads 1) under many concurrent callers: gRPC's
// sync server turns away the calls it has no thread for (RESOURCE_EXHAUSTED "Server Threadpool
// Exhausted", before any handler runs). The client waits and calls again within its deadline,
// so every call succeeds, and every push is applied exactly once (the CTR demo's worker died of
// one such refusal). A limit of the store (naming its --max-* flag) is still returned at once.
TEST(PsOverloadTest, CallsTurnedAwayForWantOfAThreadAreRetriedAndAppliedOnce) {
  PsServerOptions so;
  so.server_id = "ps0";
  so.job_token = "secret";
  so.max_threads = 1;
  so.limits.max_keys_per_request = 64;
  auto server = PsServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kClients = 4, kThreads = 8, kPushes = 40;
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int c = 0; c < kClients; ++c) {
    PsClientOptions o;
    o.servers = {(*server)->address()};
    o.token = "secret";
    o.reporter = "w" + std::to_string(c);
    o.rpc_timeout_ms = 30'000;
    auto client = PsClient::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->CreateTable(Spec("t", 1, PsOptimizer::SGD, 1.0f)).ok());
    clients.push_back(std::move(*client));
  }
  std::atomic<int> failed{0}, pushes_failed{0};
  std::string first_error;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, c] {
        for (int i = 0; i < kPushes; ++i) {
          absl::Status s = clients[c]->Push("t", {0, 1}, {1.0f, 1.0f});
          if (!s.ok()) ++pushes_failed;
          std::vector<float> v;
          if (s.ok()) s = clients[c]->Pull("t", {0}, &v);
          if (!s.ok()) {
            std::lock_guard<std::mutex> l(mu);
            if (failed++ == 0) first_error = s.ToString();
          }
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0) << first_error;
  std::vector<float> v;
  ASSERT_TRUE(clients[0]->Pull("t", {0, 1}, &v).ok());
  const float pushes = static_cast<float>(kClients * kThreads * kPushes - pushes_failed.load());
  EXPECT_EQ(v, (std::vector<float>{-pushes, -pushes})) << "every accepted push applied once, none twice";
  std::vector<uint64_t> too_many(65);
  for (uint64_t k = 0; k < too_many.size(); ++k) too_many[k] = k;
  const absl::Status limit = clients[0]->Pull("t", too_many, &v);
  EXPECT_EQ(limit.code(), absl::StatusCode::kResourceExhausted) << limit;
  EXPECT_NE(std::string(limit.message()).find("--max-keys-per-request"), std::string::npos) << limit;
}

}  // namespace
}  // namespace pacer
