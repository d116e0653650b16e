// Pacerd's rendezvous store (rendezvous/) and its SDK side (worker_sdk/rendezvous_client.h):
// the group and generation rules on the service itself; then over gRPC against a real
// in-process pacerd: set/get, a wait bounded by its deadline (DEADLINE_EXCEEDED, not a hang),
// a wait woken by a set, a wait aborted by a new generation, a wrong token refused with
// UNAUTHENTICATED, the regroup command on heartbeats, and a two-rank Gloo all-reduce that
// rendezvoused through the store.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "rendezvous/rendezvous_service.h"
#include "tests/testing/pacerd_harness.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/client.h"
#include "worker_sdk/elastic_gloo.h"
#include "worker_sdk/rendezvous_client.h"

namespace pacer {
namespace {

using std::chrono::milliseconds;
using testing::TempDir;
using testing::WaitFor;

RendezvousJoinRequest JoinReq(const std::string& worker, uint64_t incarnation, int rank,
                              uint32_t world) {
  RendezvousJoinRequest r;
  r.set_worker_id(worker);
  r.set_incarnation(incarnation);
  r.set_rank(rank);
  r.set_world_size(world);
  return r;
}

TEST(RendezvousServiceTest, GroupAndGenerationRules) {
  MetricsRegistry metrics;
  RendezvousServiceImpl s({}, &metrics);
  RendezvousJoinResponse j;
  ASSERT_TRUE(s.Join(JoinReq("a", 1, -1, 3), &j).ok());
  EXPECT_EQ(j.generation(), 1u);
  EXPECT_EQ(j.rank(), 0);
  ASSERT_TRUE(s.Join(JoinReq("b", 1, 2, 3), &j).ok());
  EXPECT_EQ(j.rank(), 2);
  ASSERT_TRUE(s.Join(JoinReq("c", 1, -1, 3), &j).ok());
  EXPECT_EQ(j.rank(), 1);  // the lowest free rank
  EXPECT_EQ(j.generation(), 1u) << "new members of a forming group do not regroup";
  // Bad joins change nothing.
  EXPECT_EQ(s.Join(JoinReq("d", 1, -1, 3), &j).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Join(JoinReq("d", 1, 0, 3), &j).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Join(JoinReq("a", 1, 0, 4), &j).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Join(JoinReq("a", 1, 5, 3), &j).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Join(JoinReq("a", 1, 1, 3), &j).code(), absl::StatusCode::kFailedPrecondition);
  // A retried join (same incarnation) is idempotent; a restarted worker regroups.
  ASSERT_TRUE(s.Join(JoinReq("a", 1, -1, 3), &j).ok());
  EXPECT_EQ(j.generation(), 1u);
  ASSERT_TRUE(s.Join(JoinReq("c", 2, -1, 3), &j).ok());
  EXPECT_EQ(j.generation(), 2u);
  EXPECT_EQ(j.rank(), 1) << "a restarted worker keeps its rank";

  // Keys belong to one generation; older generations are refused with ABORTED.
  RendezvousSetRequest set;
  set.set_generation(2);
  set.set_key("k");
  set.set_value("v");
  RendezvousSetResponse sr;
  ASSERT_TRUE(s.Set(set, &sr).ok());
  set.set_generation(1);
  EXPECT_EQ(s.Set(set, &sr).code(), absl::StatusCode::kAborted);
  set.set_generation(7);
  EXPECT_EQ(s.Set(set, &sr).code(), absl::StatusCode::kFailedPrecondition);

  // Reform is compare-and-bump: the first report of generation 2 bumps, the second does not.
  RendezvousReformRequest rf;
  rf.set_worker_id("a");  // only a member reforms
  rf.set_generation(2);
  RendezvousReformResponse rr;
  ASSERT_TRUE(s.Reform(rf, &rr).ok());
  EXPECT_EQ(rr.generation(), 3u);
  ASSERT_TRUE(s.Reform(rf, &rr).ok());
  EXPECT_EQ(rr.generation(), 3u);
  RendezvousCheckRequest ck;
  ck.set_generation(3);
  ck.add_keys("k");
  RendezvousCheckResponse cr;
  ASSERT_TRUE(s.Check(ck, &cr).ok());
  EXPECT_FALSE(cr.all_set()) << "a new generation starts empty";

  // Heartbeats: a member reporting an older generation gets a RegroupCommand; the current one
  // or another incarnation gets nothing.
  HeartbeatRequest hb;
  hb.set_worker_id("b");
  hb.set_incarnation(1);
  hb.set_regroup_generation(1);
  HeartbeatResponse resp;
  s.OnHeartbeat(hb, &resp);
  ASSERT_EQ(resp.commands_size(), 1);
  EXPECT_EQ(resp.commands(0).regroup().generation(), 3u);
  EXPECT_EQ(resp.commands(0).regroup().rank(), 2);
  EXPECT_EQ(resp.commands(0).regroup().world_size(), 3u);
  hb.set_regroup_generation(3);
  resp.Clear();
  s.OnHeartbeat(hb, &resp);
  EXPECT_EQ(resp.commands_size(), 0);
  hb.set_regroup_generation(0);
  hb.set_incarnation(9);
  s.OnHeartbeat(hb, &resp);
  EXPECT_EQ(resp.commands_size(), 0);

  // Add: a counter per key.
  RendezvousAddRequest add;
  add.set_generation(3);
  add.set_key("n");
  add.set_delta(2);
  RendezvousAddResponse ar;
  ASSERT_TRUE(s.Add(add, &ar).ok());
  ASSERT_TRUE(s.Add(add, &ar).ok());
  EXPECT_EQ(ar.value(), 4);

  const std::string text = metrics.RenderText();
  EXPECT_NE(text.find("pacer_rendezvous_generation 3"), std::string::npos) << text;
  EXPECT_NE(text.find("pacer_rendezvous_regroups_total 2"), std::string::npos) << text;
  EXPECT_NE(text.find("pacer_rendezvous_keys 1"), std::string::npos) << text;
}

// Random operations against the service: every Get completes exactly once (at once, when its
// keys are set, when its generation is superseded, when cancelled, or at Shutdown); a Get
// still waiting is always for the current generation and misses a key.
TEST(RendezvousServiceTest, RandomOperationsCompleteEveryGetExactlyOnce) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    RendezvousServiceImpl s;
    struct Call {
      int completions = 0;
      absl::Status status;
      RendezvousGetResponse resp;
      std::vector<std::string> keys;
    };
    std::vector<std::unique_ptr<Call>> calls;
    auto pick = [&](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
    auto generation = [&] {
      const uint64_t g = s.stats().generation;
      return g > 1 && pick(4) == 0 ? g - 1 : g;  // now and then an old one
    };
    for (int op = 0; op < 2000; ++op) {
      switch (pick(6)) {
        case 0: {
          RendezvousJoinResponse j;
          (void)s.Join(JoinReq("w" + std::to_string(pick(4)), pick(3), -1, 4), &j);
          break;
        }
        case 1: {
          RendezvousReformRequest r;
          r.set_worker_id("w" + std::to_string(pick(5)));  // w4 is never a member: refused
          r.set_generation(generation());
          RendezvousReformResponse rr;
          (void)s.Reform(r, &rr);
          break;
        }
        case 2:
        case 3: {
          RendezvousSetRequest r;
          r.set_generation(generation());
          r.set_key("k" + std::to_string(pick(6)));
          r.set_value("v");
          RendezvousSetResponse sr;
          (void)s.Set(r, &sr);
          break;
        }
        case 4: {
          auto c = std::make_unique<Call>();
          RendezvousGetRequest r;
          r.set_generation(generation());
          r.set_wait(true);
          for (uint64_t i = 0, n = 1 + pick(2); i < n; ++i) {
            c->keys.push_back("k" + std::to_string(pick(6)));
            r.add_keys(c->keys.back());
          }
          Call* raw = c.get();
          calls.push_back(std::move(c));
          s.Get(r, &raw->resp, raw, [raw](absl::Status st) {
            ++raw->completions;
            raw->status = st;
          });
          break;
        }
        case 5:
          if (!calls.empty()) s.CancelWait(calls[pick(calls.size())].get());
          break;
      }
      size_t waiting = 0;
      for (const auto& c : calls) {
        ASSERT_LE(c->completions, 1) << "seed " << seed;
        if (c->completions == 1 && c->status.ok()) {
          ASSERT_EQ(c->resp.values_size(), static_cast<int>(c->keys.size()));
        }
        if (c->completions == 0) {
          ++waiting;
          RendezvousCheckRequest ck;
          ck.set_generation(s.stats().generation);
          for (const auto& k : c->keys) ck.add_keys(k);
          RendezvousCheckResponse cr;
          ASSERT_TRUE(s.Check(ck, &cr).ok());
          ASSERT_FALSE(cr.all_set()) << "seed " << seed << ": a Get waits for keys that are set";
        }
      }
      ASSERT_EQ(s.stats().waiting, waiting) << "seed " << seed;
    }
    s.Shutdown();
    for (const auto& c : calls) {
      ASSERT_EQ(c->completions, 1) << "seed " << seed;
    }
  }
}

class RendezvousStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { StartPacerd(0); }
  void StartPacerd(int port) {
    h_.Restart();  // the same data dir and port on a restart
    ASSERT_TRUE(h_.ok());
    pacerd_ = &h_.pacerd();
  }
  RendezvousClientOptions Options(const std::string& token = "") {
    RendezvousClientOptions o;
    o.address = pacerd_->address();
    o.token = token.empty() ? pacerd_->job_token() : token;
    o.retry_budget_ms = 5'000;
    return o;
  }
  std::unique_ptr<Client> Connect(const std::string& worker) {
    ClientOptions o;
    o.address = pacerd_->address();
    o.token = pacerd_->job_token();
    o.worker_id = worker;
    o.connect_budget_ms = 20'000;
    o.report_steps = false;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // pacerd in process (tests/testing/pacerd_harness.h), on the real clock with its thread.
  testing::PacerdHarness h_{{.real_clock = true, .start = false, .adjust = [](PacerdOptions& p) {
    p.sharding.heartbeat_interval_ms = 50;
  }}};
  const testing::TempDir& dir_ = h_.dir();
  Pacerd* pacerd_ = nullptr;
};

TEST_F(RendezvousStoreTest, SetGetAndWaitsThatEnd) {
  RendezvousClient rc(Options());
  auto j = rc.Join("w0", 1, 0, 2);
  ASSERT_TRUE(j.ok()) << j.status();
  const uint64_t gen = j->generation();
  ASSERT_TRUE(rc.Set(gen, "a", std::string("\0x", 2)).ok());
  auto v = rc.Get(gen, {"a"}, false, milliseconds(1000));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0], std::string("\0x", 2));
  EXPECT_EQ(rc.Get(gen, {"a", "missing"}, false, milliseconds(1000)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(*rc.Check(gen, {"a", "missing"}));

  // A wait for a key nobody sets ends at its deadline, with DEADLINE_EXCEEDED.
  const auto t0 = std::chrono::steady_clock::now();
  auto missing = rc.Get(gen, {"missing"}, true, milliseconds(300));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded) << missing.status();
  EXPECT_GE(waited, milliseconds(250));
  EXPECT_LT(waited, milliseconds(15'000));  // not a hang (generous: a loaded CI machine)
  EXPECT_TRUE(WaitFor([&] { return pacerd_->rendezvous()->stats().waiting == 0; }, milliseconds(20'000)))
      << "the cancelled wait was taken out of the service";

  // A wait is woken by the set it waits for.
  absl::StatusOr<std::vector<std::string>> woken;
  std::thread waiter([&] { woken = rc.Get(gen, {"b", "a"}, true, milliseconds(20'000)); });
  ASSERT_TRUE(WaitFor([&] { return pacerd_->rendezvous()->stats().waiting == 1; }, milliseconds(10'000)));
  ASSERT_TRUE(rc.Set(gen, "b", "B").ok());
  waiter.join();
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ((*woken)[0], "B");
  EXPECT_EQ((*woken)[1], std::string("\0x", 2));

  // A wait in a generation that is superseded ends with ABORTED.
  absl::StatusOr<std::vector<std::string>> aborted;
  std::thread waiter2([&] { aborted = rc.Get(gen, {"c"}, true, milliseconds(20'000)); });
  ASSERT_TRUE(WaitFor([&] { return pacerd_->rendezvous()->stats().waiting == 1; }, milliseconds(10'000)));
  auto next = rc.Reform("w0", gen);
  waiter2.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, gen + 1);
  EXPECT_EQ(aborted.status().code(), absl::StatusCode::kAborted) << aborted.status();
  EXPECT_EQ(rc.Set(gen, "a", "x").code(), absl::StatusCode::kAborted);
}

TEST_F(RendezvousStoreTest, WrongTokenIsRefused) {
  RendezvousClient bad(Options("not-the-job-token"));
  EXPECT_EQ(bad.Join("w0", 1, 0, 1).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(bad.Set(1, "a", "b").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(bad.Get(1, {"a"}, true, milliseconds(2000)).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(pacerd_->rendezvous()->stats().generation, 0u) << "nothing was joined";
}

TEST_F(RendezvousStoreTest, RegroupCommandReachesTheClient) {
  auto client = Connect("w0");
  ASSERT_TRUE(client);
  RendezvousClient rc(Options());
  auto j = rc.Join("w0", client->registration().incarnation(), -1, 2);
  ASSERT_TRUE(j.ok()) << j.status();
  client->NoteRegroupGeneration(j->generation());
  auto g = rc.Reform("w0", j->generation());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(WaitFor([&] { return client->regroup_generation() == *g; }, milliseconds(10'000)))
      << "held " << client->regroup_generation() << ", want " << *g;
  // A heartbeat reply may carry generation 1 before the test notes it, so the client counts one
  // regroup per generation it had not yet held: at least the reform, never more than one each.
  EXPECT_GE(client->stats().regroups_received, 1u);
  EXPECT_LE(client->stats().regroups_received, *g);
}

// Two ranks (threads) of one ElasticGlooCollective group all-reduce once; `store_dir` empty:
// through pacerd's store, else through a FileStore there under the generation's prefix.
void TwoRanksAllReduce(Client* c0, Client* c1, const std::string& store_dir) {
  absl::StatusOr<std::unique_ptr<ElasticGlooCollective>> e1;
  ElasticGlooOptions eo;
  eo.store_dir = store_dir;
  eo.world_size = 2;
  eo.timeout_ms = 10'000;
  eo.regroup_timeout_ms = 30'000;
  std::thread t([&] { e1 = ElasticGlooCollective::Create(c1, eo); });
  auto e0 = ElasticGlooCollective::Create(c0, eo);
  t.join();
  ASSERT_TRUE(e0.ok()) << e0.status();
  ASSERT_TRUE(e1.ok()) << e1.status();
  EXPECT_NE((*e0)->rank(), (*e1)->rank());
  std::vector<float> a = {1, 2}, b = {10, 20};
  absl::Status s1;
  std::thread t2([&] { s1 = (*e1)->AllReduceSum(b); });
  absl::Status s0 = (*e0)->AllReduceSum(a);
  t2.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(a, (std::vector<float>{11, 22}));
  EXPECT_EQ(b, (std::vector<float>{11, 22}));
  EXPECT_FALSE((*e0)->regroup_pending());
  EXPECT_EQ((*e0)->generation(), (*e1)->generation());
}

TEST_F(RendezvousStoreTest, TwoRanksAllReduceThroughThePacerdStore) {
  auto c0 = Connect("w0");
  auto c1 = Connect("w1");
  ASSERT_TRUE(c0 && c1);
  TwoRanksAllReduce(c0.get(), c1.get(), "");
  EXPECT_GE(pacerd_->rendezvous()->stats().keys, 2u) << "the ranks' addresses went through pacerd";
}

// The store is soft state: after a pacerd restart (same port and data dir) both ranks regroup
// from generation 1 again and all-reduce.
TEST_F(RendezvousStoreTest, RanksRegroupAfterAPacerdRestart) {
  auto c0 = Connect("w0");
  auto c1 = Connect("w1");
  ASSERT_TRUE(c0 && c1);
  ElasticGlooOptions eo;
  eo.world_size = 2;
  eo.timeout_ms = 5'000;
  eo.regroup_timeout_ms = 60'000;
  absl::StatusOr<std::unique_ptr<ElasticGlooCollective>> e0, e1;
  std::thread t([&] { e1 = ElasticGlooCollective::Create(c1.get(), eo); });
  e0 = ElasticGlooCollective::Create(c0.get(), eo);
  t.join();
  ASSERT_TRUE(e0.ok() && e1.ok()) << e0.status() << " " << e1.status();

  const int port = pacerd_->port();
  h_.Stop();
  pacerd_ = nullptr;
  StartPacerd(port);
  ASSERT_TRUE(pacerd_);
  EXPECT_EQ(pacerd_->rendezvous()->stats().generation, 0u) << "rendezvous state is not journaled";

  absl::Status r1;
  std::thread t1([&] { r1 = (*e1)->Regroup(); });
  absl::Status r0 = (*e0)->Regroup();
  t1.join();
  ASSERT_TRUE(r0.ok()) << r0;
  ASSERT_TRUE(r1.ok()) << r1;
  EXPECT_EQ((*e0)->generation(), (*e1)->generation());
  std::vector<float> a = {1}, b = {2};
  absl::Status s1;
  std::thread t2([&] { s1 = (*e1)->AllReduceSum(b); });
  absl::Status s0 = (*e0)->AllReduceSum(a);
  t2.join();
  ASSERT_TRUE(s0.ok() && s1.ok()) << s0 << " " << s1;
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_EQ(b[0], 3.0f);
}

TEST_F(RendezvousStoreTest, TwoRanksAllReduceThroughAFileStoreWithPacerdGenerations) {
  auto c0 = Connect("w0");
  auto c1 = Connect("w1");
  ASSERT_TRUE(c0 && c1);
  TwoRanksAllReduce(c0.get(), c1.get(), dir_.Sub("gloo"));
  EXPECT_EQ(pacerd_->rendezvous()->stats().keys, 0u);
  EXPECT_TRUE(std::filesystem::exists(dir_.Sub("gloo"))) << "keys were exchanged in the directory";
}

}  // namespace
}  // namespace pacer
