// The etcd journal (journal/etcd_log.h) and the election that fences it (journal/etcd_election.h)
// against a real 3-member etcd cluster on loopback (tests/testing/etcd_cluster.h): what is
// acknowledged is read back whole and in order, records over etcd's limits are split and
// joined, damage is DATA_LOSS naming the key, a deposed leader's writes are refused by etcd,
// a full quota refuses writes and resumes, and a killed etcd member costs only retries.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "journal/etcd_client.h"
#include "journal/etcd_election.h"
#include "journal/etcd_log.h"
#include "pacer/etcd_journal.pb.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::EtcdAvailable;
using testing::EtcdCluster;
using testing::TempDir;

// What a replay delivered.
struct Replayed {
  std::map<std::string, std::string> pinned;
  uint64_t snapshot_seq = 0;
  std::string snapshot;
  std::vector<std::pair<uint64_t, std::string>> updates;
  DurableLog::Replay replay() {
    return {[this](uint64_t seq, const std::string& b) {
              snapshot_seq = seq;
              snapshot = b;
              return absl::OkStatus();
            },
            [this](uint64_t seq, const std::string& b) {
              updates.emplace_back(seq, b);
              return absl::OkStatus();
            },
            [this](const std::string& k, const std::string& b) {
              pinned[k] = b;
              return absl::OkStatus();
            }};
  }
};

std::shared_ptr<const google::protobuf::MessageLite> Message(const std::string& text) {
  auto m = std::make_shared<journal::EtcdJournalRecord>();
  m->add_entries(text);
  return m;
}

std::string Serialized(const std::string& text) { return Message(text)->SerializeAsString(); }

std::string Update(uint64_t seq, size_t bytes = 40) {
  std::string s = absl::StrCat("update-", seq, "-");
  s.resize(std::max(bytes, s.size()), static_cast<char>('a' + seq % 26));
  return s;
}

class EtcdLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdAvailable()) GTEST_SKIP() << testing::kEtcdMissing;
    StartCluster(EtcdCluster::Options());
  }
  void StartCluster(EtcdCluster::Options o) {
    cluster_.reset();
    auto c = EtcdCluster::Start(dir_, 3, o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    EtcdClientOptions co;
    co.endpoints = cluster_->endpoints();
    co.request_timeout_ms = 5000;
    auto client = EtcdClient::Connect(co);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  EtcdLogOptions Options(const std::string& prefix = "job/sharding/") {
    EtcdLogOptions o;
    o.client = client_.get();
    o.prefix = prefix;
    o.format = {"test-format-v1", {}};
    return o;
  }
  absl::StatusOr<std::unique_ptr<EtcdLog>> Open(EtcdLogOptions o, Replayed* r) {
    return EtcdLog::Open(std::move(o), r->replay());
  }

  TempDir dir_;
  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdLogTest, WhatIsAcknowledgedIsReadBackInOrderWithSnapshotAndPinnedEntries) {
  Replayed r0;
  auto log = Open(Options(), &r0);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_TRUE((*log)->recovery().created);
  for (uint64_t s = 1; s <= 50; ++s) (*log)->Append(s, Update(s));
  (*log)->WriteSnapshot(50, Message("state at 50"), {{"spec-a", Message("A")}, {"spec-b", Message("B")}});
  for (uint64_t s = 51; s <= 80; ++s) (*log)->Append(s, Update(s));
  ASSERT_TRUE((*log)->Flush().ok());
  // A second snapshot drops spec-a: its entry is deleted with the snapshot.
  (*log)->WriteSnapshot(80, Message("state at 80"), {{"spec-b", Message("B")}, {"spec-c", Message("C")}});
  for (uint64_t s = 81; s <= 100; ++s) (*log)->Append(s, Update(s));
  std::promise<absl::Status> acked;
  (*log)->WhenDurable(100, [&](absl::Status s) { acked.set_value(s); });
  ASSERT_TRUE(acked.get_future().get().ok());
  EXPECT_EQ((*log)->stats().snapshots, 2u);
  EXPECT_EQ((*log)->stats().pinned_written, 3u);  // spec-b once, though both snapshots list it
  log->reset();

  Replayed r;
  auto again = Open(Options(), &r);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(r.snapshot_seq, 80u);
  EXPECT_EQ(r.snapshot, Serialized("state at 80"));
  ASSERT_EQ(r.pinned.size(), 2u);
  EXPECT_EQ(r.pinned["spec-b"], Serialized("B"));
  EXPECT_EQ(r.pinned["spec-c"], Serialized("C"));
  ASSERT_EQ(r.updates.size(), 20u);
  for (size_t i = 0; i < r.updates.size(); ++i) {
    EXPECT_EQ(r.updates[i].first, 81 + i);
    EXPECT_EQ(r.updates[i].second, Update(81 + i));
  }
  EXPECT_EQ((*again)->last_seq(), 100u);
  // Nothing the snapshots cover is left in etcd: the old updates, snapshot and spec-a are gone.
  auto keys = cluster_->Etcdctl({"get", "job/sharding/", "--prefix", "--keys-only"});
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->find("s/0000000000000032"), std::string::npos) << *keys;  // snapshot 50
  EXPECT_EQ(keys->find("u/0000000000000001"), std::string::npos) << *keys;
  EXPECT_EQ(keys->find(absl::StrCat("p/", "737065632d61")), std::string::npos) << *keys;  // "spec-a"

  // A follower reads from the middle of a group.
  std::vector<uint64_t> tail;
  ASSERT_TRUE((*again)->ReadFrom(90, [&](uint64_t s, const std::string& b) {
    EXPECT_EQ(b, Update(s));
    tail.push_back(s);
    return absl::OkStatus();
  }).ok());
  ASSERT_EQ(tail.size(), 11u);
  EXPECT_EQ(tail.front(), 90u);
  EXPECT_EQ((*again)->ReadFrom(80, [](uint64_t, const std::string&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(EtcdLogTest, RecordsOverEtcdsLimitsAreSplitAcrossTransactionsAndJoined) {
  EtcdLogOptions o = Options();
  o.piece_bytes = 1 << 10;
  o.max_txn_bytes = 4 << 10;
  o.max_txn_ops = 5;
  Replayed r0;
  auto log = Open(o, &r0);
  ASSERT_TRUE(log.ok()) << log.status();
  std::vector<std::pair<uint64_t, std::string>> group;
  for (uint64_t s = 1; s <= 30; ++s) group.emplace_back(s, Update(s, s % 7 == 0 ? 10'000 : 300));
  (*log)->AppendAll(group);
  ASSERT_TRUE((*log)->Flush().ok());
  EXPECT_GT((*log)->stats().batches, 10u) << "one group, many transactions";
  (*log)->WriteSnapshot(30, Message(std::string(9'000, 'S')), {{"big", Message(std::string(5'000, 'P'))}});
  (*log)->Append(31, Update(31, 2'500));
  ASSERT_TRUE((*log)->Flush().ok());
  log->reset();

  Replayed r;
  auto again = Open(o, &r);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(r.snapshot, Serialized(std::string(9'000, 'S')));
  EXPECT_EQ(r.pinned["big"], Serialized(std::string(5'000, 'P')));
  ASSERT_EQ(r.updates.size(), 1u);
  EXPECT_EQ(r.updates[0].second, Update(31, 2'500));

  // A missing piece is DATA_LOSS naming it.
  auto pieces = cluster_->Etcdctl({"get", "job/sharding/u/", "--prefix", "--keys-only"});
  ASSERT_TRUE(pieces.ok());
  ASSERT_NE(pieces->find("u/000000000000001f.0001"), std::string::npos) << *pieces;
  ASSERT_TRUE(cluster_->Etcdctl({"del", "job/sharding/u/000000000000001f.0001"}).ok());
  again->reset();
  Replayed r2;
  auto damaged = Open(o, &r2);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(damaged.status().message().find("u/000000000000001f"), std::string::npos) << damaged.status();
}

TEST_F(EtcdLogTest, WithEtcdAuthenticationTheJournalLogsInAndARefusalIsClear) {
  ASSERT_TRUE(cluster_->Etcdctl({"user", "add", "root:rootpw"}).ok());
  ASSERT_TRUE(cluster_->Etcdctl({"auth", "enable"}).ok());
  // No user: etcd refuses, and the error says so.
  Replayed r0;
  auto anonymous = Open(Options(), &r0);
  ASSERT_FALSE(anonymous.ok());
  EXPECT_NE(anonymous.status().message().find("etcd"), std::string::npos) << anonymous.status();
  // A wrong password: refused when connecting.
  EtcdClientOptions co;
  co.endpoints = cluster_->endpoints();
  co.user = "root";
  co.password = "wrong";
  auto wrong = EtcdClient::Connect(co);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("authenticating as 'root'"), std::string::npos) << wrong.status();
  // The right one: the journal works, also after etcd forgets the token (a member restarted).
  co.password = "rootpw";
  auto authed = EtcdClient::Connect(co);
  ASSERT_TRUE(authed.ok()) << authed.status();
  EtcdLogOptions o = Options();
  o.client = authed->get();
  Replayed r1;
  auto log = Open(o, &r1);
  ASSERT_TRUE(log.ok()) << log.status();
  (*log)->Append(1, Update(1));
  ASSERT_TRUE((*log)->Flush().ok()) << (*log)->health();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster_->Restart(i).ok());
  (*log)->Append(2, Update(2));
  ASSERT_TRUE((*log)->Flush().ok()) << (*log)->health();
  log->reset();
  Replayed r2;
  auto again = Open(o, &r2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(r2.updates.size(), 2u);
}

TEST_F(EtcdLogTest, AGapOrForeignKeysAreRefusedNotSkipped) {
  Replayed r0;
  auto log = Open(Options(), &r0);
  ASSERT_TRUE(log.ok());
  for (uint64_t s = 1; s <= 3; ++s) {
    (*log)->Append(s, Update(s));
    ASSERT_TRUE((*log)->Flush().ok());  // one chunk per update
  }
  log->reset();
  ASSERT_TRUE(cluster_->Etcdctl({"del", "job/sharding/u/0000000000000002"}).ok());
  Replayed r;
  auto gap = Open(Options(), &r);
  ASSERT_FALSE(gap.ok());
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(gap.status().message().find("updates 2..2 are missing"), std::string::npos) << gap.status();

  ASSERT_TRUE(cluster_->Etcdctl({"put", "other/x", "1"}).ok());
  Replayed r3;
  auto foreign = Open(Options("other/"), &r3);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kDataLoss);

  EtcdLogOptions must = Options("nothing-here/");
  must.must_exist = true;
  Replayed r4;
  EXPECT_EQ(Open(must, &r4).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(EtcdLogTest, ADeposedLeadersWritesAreRefusedByEtcd) {
  EtcdElection a(client_.get(), {"job/leader", "a:1", 2});
  ASSERT_TRUE(a.Campaign().ok());
  ASSERT_TRUE(a.IsLeader());
  std::atomic<int> lost{0};
  a.set_on_lost([&](const std::string&) { lost++; });
  EtcdLogOptions o = Options();
  o.fence = [&] { return a.fence(); };
  std::atomic<int> fenced{0};
  o.on_fenced = [&](const std::string& why) {
    fenced++;
    a.Lost(why);
  };
  Replayed r0;
  auto log = Open(o, &r0);
  ASSERT_TRUE(log.ok()) << log.status();
  (*log)->Append(1, Update(1));
  ASSERT_TRUE((*log)->Flush().ok());

  // Another candidate waits; the leader's lease is revoked behind its back (as when it was
  // paused past its TTL): the other leads, and the old leader's next write is refused.
  EtcdClientOptions co;
  co.endpoints = cluster_->endpoints();
  auto other_client = EtcdClient::Connect(co);
  ASSERT_TRUE(other_client.ok());
  EtcdElection b((*other_client).get(), {"job/leader", "b:1", 2});
  auto b_won = std::async(std::launch::async, [&] { return b.Campaign(); });
  ASSERT_TRUE(client_->LeaseRevoke(a.lease_id()).ok());
  ASSERT_TRUE(b_won.get().ok());
  EXPECT_TRUE(b.IsLeader());

  (*log)->Append(2, Update(2));
  absl::Status s = (*log)->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(fenced.load(), 1);
  EXPECT_EQ(lost.load(), 1);
  EXPECT_FALSE(a.IsLeader());
  Replayed again;
  EXPECT_EQ((*log)->Recover(again.replay()).code(), absl::StatusCode::kFailedPrecondition);

  // The new leader reads update 1 only: the refused write left nothing.
  EtcdLogOptions ob = Options();
  ob.fence = [&] { return b.fence(); };
  Replayed rb;
  auto blog = Open(ob, &rb);
  ASSERT_TRUE(blog.ok()) << blog.status();
  ASSERT_EQ(rb.updates.size(), 1u);
  EXPECT_EQ((*blog)->last_seq(), 1u);
}

TEST_F(EtcdLogTest, ALeaderWhoseKeepalivesStopDemotesItselfWithinItsTtl) {
  EtcdElection a(client_.get(), {"job/leader", "a:1", 2});
  ASSERT_TRUE(a.Campaign().ok());
  std::promise<std::string> lost;
  a.set_on_lost([&](const std::string& why) { lost.set_value(why); });
  // Freeze the whole cluster: no keepalive is acknowledged.
  for (int i = 0; i < 3; ++i) cluster_->Pause(i);
  auto f = lost.get_future();
  const auto waited = f.wait_for(std::chrono::seconds(10));
  for (int i = 0; i < 3; ++i) cluster_->Resume(i);
  ASSERT_EQ(waited, std::future_status::ready);
  EXPECT_NE(f.get().find("no keepalive acknowledged"), std::string::npos);
  EXPECT_FALSE(a.IsLeader());
}

TEST_F(EtcdLogTest, AKilledEtcdMemberCostsOnlyRetries) {
  Replayed r0;
  auto log = Open(Options(), &r0);
  ASSERT_TRUE(log.ok());
  uint64_t seq = 0;
  auto write = [&](int n) {
    for (int i = 0; i < n; ++i) {
      (*log)->Append(++seq, Update(seq));
      ASSERT_TRUE((*log)->Flush().ok()) << (*log)->health();
    }
  };
  write(20);
  const int leader = cluster_->WaitForLeader();
  ASSERT_GE(leader, 0);
  cluster_->Kill(leader);  // the raft leader: the others elect a new one
  write(20);
  ASSERT_TRUE(cluster_->Restart(leader).ok());
  cluster_->Kill((leader + 1) % 3);
  write(20);
  log->reset();
  Replayed r;
  auto again = Open(Options(), &r);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(r.updates.size(), 60u);
  for (size_t i = 0; i < 60; ++i) EXPECT_EQ(r.updates[i].first, i + 1);
}

TEST_F(EtcdLogTest, AFullQuotaRefusesWritesClearlyAndResumesAfterCompaction) {
  // etcd keeps every revision until compacted: a journal that snapshots (and so deletes what the
  // snapshot covers) still fills the quota with history when nobody compacts.
  EtcdCluster::Options small;
  small.quota_backend_bytes = 4 << 20;
  StartCluster(small);
  EtcdLogOptions o = Options();
  o.write_retry_ms = 2000;
  Replayed r0;
  auto log = Open(o, &r0);
  ASSERT_TRUE(log.ok()) << log.status();
  uint64_t seq = 0, acknowledged = 0;
  absl::Status refused;
  for (int i = 0; i < 1000 && refused.ok(); ++i) {
    std::vector<std::pair<uint64_t, std::string>> group;
    for (int j = 0; j < 4; ++j) group.emplace_back(++seq, Update(seq, 60'000));
    (*log)->AppendAll(group);
    if (i % 4 == 3) (*log)->WriteSnapshot(seq, Message(absl::StrCat("state at ", seq)), {});
    refused = (*log)->Flush();
    if (refused.ok()) acknowledged = seq;
  }
  ASSERT_FALSE(refused.ok()) << "the quota was never reached";
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("NOSPACE"), std::string::npos) << refused;
  EXPECT_FALSE((*log)->health().ok());

  // Recover reads back what was acknowledged (reads work under the alarm), but the next write
  // is refused again until the operator frees space.
  // (The refused group may be there too: a transaction whose reply was lost was applied before
  // its retry met the full quota. It was never acknowledged; more than acknowledged is no loss.)
  Replayed r1;
  ASSERT_TRUE((*log)->Recover(r1.replay()).ok());
  EXPECT_GE((*log)->last_seq(), acknowledged);
  seq = (*log)->last_seq();
  (*log)->Append(++seq, Update(seq));
  EXPECT_EQ((*log)->Flush().code(), absl::StatusCode::kUnavailable);

  // The operator: compact, defragment, disarm.
  auto status = client_->MemberStatus(0);
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(client_->Compact(status->header().revision()).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->Defragment(i).ok());
  ASSERT_TRUE(client_->DisarmNoSpace().ok());

  Replayed r2;
  ASSERT_TRUE((*log)->Recover(r2.replay()).ok());
  EXPECT_GE((*log)->last_seq(), acknowledged) << "nothing acknowledged was lost";
  seq = (*log)->last_seq();
  (*log)->Append(++seq, Update(seq));
  EXPECT_TRUE((*log)->Flush().ok()) << (*log)->health();
}

}  // namespace
}  // namespace pacer
