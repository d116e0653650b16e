// The rendezvous store's memory limits, on the service itself (rendezvous/rendezvous_service.h):
// a Get reply is bounded before it is built (a Get naming one 1 MiB key 4 096 times built a 4 GiB
// reply and pacerd aborted), every key of a Get or Check is bounded like a Set's, parked Gets and
// unsent replies are charged in bytes to their caller and in all, and the store charges each key
// its own overhead (a flood of 1-byte keys held ~100 bytes each while it counted 1).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/reply_limit.h"
#include "rendezvous/rendezvous_service.h"

namespace pacer {
namespace {

constexpr size_t kMiB = 1 << 20;

class RendezvousLimitsTest : public ::testing::Test {
 protected:
  void Open(RendezvousOptions options) {
    s_ = std::make_unique<RendezvousServiceImpl>(options, &metrics_);
    RendezvousJoinRequest j;
    j.set_worker_id("w0");
    j.set_incarnation(1);
    j.set_rank(0);
    j.set_world_size(1);
    RendezvousJoinResponse jr;
    ASSERT_TRUE(s_->Join(j, &jr).ok());
    generation_ = jr.generation();
  }
  absl::Status Set(const std::string& key, const std::string& value) {
    RendezvousSetRequest r;
    r.set_generation(generation_);
    r.set_key(key);
    r.set_value(value);
    RendezvousSetResponse resp;
    return s_->Set(r, &resp);
  }
  // One Get call; `status` is set once it completes (at once, or when woken or cancelled).
  struct Call {
    RendezvousGetRequest req;
    RendezvousGetResponse resp;
    std::optional<absl::Status> status;
  };
  Call* Get(const std::vector<std::string>& keys, bool wait, const std::string& caller) {
    calls_.push_back(std::make_unique<Call>());
    Call* c = calls_.back().get();
    c->req.set_generation(generation_);
    c->req.set_wait(wait);
    for (const auto& k : keys) c->req.add_keys(k);
    s_->Get(c->req, &c->resp, c, [c](absl::Status st) { c->status = st; }, caller);
    return c;
  }

  MetricsRegistry metrics_;
  std::unique_ptr<RendezvousServiceImpl> s_;
  uint64_t generation_ = 0;
  std::vector<std::unique_ptr<Call>> calls_;
};

TEST_F(RendezvousLimitsTest, AReplyOverTheLimitIsRefusedBeforeItIsBuilt) {
  Open({});
  ASSERT_TRUE(Set("big", std::string(kMiB, 'v')).ok());
  // 64 copies of a 1 MiB value: 64 MiB, four times the reply limit.
  std::vector<std::string> keys(64, "big");
  Call* c = Get(keys, /*wait=*/false, "w1");
  ASSERT_TRUE(c->status.has_value());
  EXPECT_EQ(c->status->code(), absl::StatusCode::kResourceExhausted) << *c->status;
  EXPECT_NE(c->status->message().find("reply limit"), std::string::npos) << *c->status;
  EXPECT_EQ(c->resp.values_size(), 0) << "the reply was built";
  // The same when the Get was parked and a Set completes it.
  keys.push_back("later");
  Call* parked = Get(keys, /*wait=*/true, "w1");
  EXPECT_FALSE(parked->status.has_value());
  ASSERT_TRUE(Set("later", "x").ok());
  ASSERT_TRUE(parked->status.has_value());
  EXPECT_EQ(parked->status->code(), absl::StatusCode::kResourceExhausted) << *parked->status;
  EXPECT_EQ(parked->resp.values_size(), 0);
  // Up to the limit a Get is served.
  Call* fits = Get(std::vector<std::string>(kMaxReplyBytes / kMiB - 1, "big"), false, "w1");
  ASSERT_TRUE(fits->status.has_value());
  EXPECT_TRUE(fits->status->ok()) << *fits->status;
}

TEST_F(RendezvousLimitsTest, EveryKeyOfAGetOrCheckIsBoundedLikeASetKey) {
  Open({});
  const std::string long_key(5000, 'k');  // over max_key_bytes (4 KiB)
  Call* c = Get({"a", long_key}, /*wait=*/true, "w1");
  ASSERT_TRUE(c->status.has_value()) << "a Get of an oversized key was parked";
  EXPECT_EQ(c->status->code(), absl::StatusCode::kInvalidArgument) << *c->status;
  EXPECT_NE(c->status->message().find("keys[1]"), std::string::npos) << *c->status;
  c = Get({""}, /*wait=*/false, "w1");
  EXPECT_EQ(c->status->code(), absl::StatusCode::kInvalidArgument);

  RendezvousCheckRequest check;
  check.set_generation(generation_);
  check.add_keys(long_key);
  RendezvousCheckResponse cr;
  EXPECT_EQ(s_->Check(check, &cr).code(), absl::StatusCode::kInvalidArgument);
  check.clear_keys();
  for (int i = 0; i < 5000; ++i) check.add_keys("k");  // over max_keys_per_get
  EXPECT_EQ(s_->Check(check, &cr).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RendezvousLimitsTest, ParkedGetsAreChargedInBytesToTheirCallerAndInAll) {
  RendezvousOptions o;
  o.max_waiting_bytes = 1 * kMiB;
  o.max_waiting_bytes_per_caller = 256 << 10;
  Open(o);
  // Each Get parks 100 keys of 1 000 bytes: ~210 KB charged (keys twice, plus the call).
  auto keys = [](const std::string& prefix) {
    std::vector<std::string> k;
    for (int i = 0; i < 100; ++i) k.push_back(prefix + std::string(1000, 'x') + std::to_string(i));
    return k;
  };
  Call* first = Get(keys("a0"), true, "attacker");
  EXPECT_FALSE(first->status.has_value());
  Call* second = Get(keys("a1"), true, "attacker");
  ASSERT_TRUE(second->status.has_value()) << "the caller's second Get of ~210 KB was parked";
  EXPECT_EQ(second->status->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second->status->message().find("max_waiting_bytes_per_caller"), std::string::npos)
      << *second->status;
  // Other callers still park, until the total is reached.
  int parked = 0;
  Call* refused = nullptr;
  for (int i = 0; i < 10 && refused == nullptr; ++i) {
    Call* c = Get(keys("b" + std::to_string(i)), true, "caller-" + std::to_string(i));
    if (c->status.has_value()) {
      refused = c;
    } else {
      ++parked;
    }
  }
  ASSERT_NE(refused, nullptr) << "10 callers parked 2 MB against a total of 1 MiB";
  EXPECT_EQ(refused->status->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused->status->message().find("RendezvousOptions::max_waiting_bytes)"),
            std::string::npos)
      << *refused->status;
  EXPECT_EQ(parked, 3);  // 4 x ~210 KB fit in 1 MiB, the attacker's included
  // A cancelled Get gives its bytes back: the attacker parks again.
  s_->CancelWait(first);
  ASSERT_TRUE(first->status.has_value());
  EXPECT_EQ(first->status->code(), absl::StatusCode::kCancelled);
  Call* again = Get(keys("a2"), true, "attacker");
  EXPECT_FALSE(again->status.has_value()) << *again->status;
}

TEST_F(RendezvousLimitsTest, UnsentRepliesAreChargedToTheirCallerUntilFinished) {
  RendezvousOptions o;
  o.max_reply_bytes_in_flight_per_caller = 3 * kMiB + 64;
  Open(o);
  ASSERT_TRUE(Set("big", std::string(kMiB, 'v')).ok());
  std::vector<Call*> sent;
  for (int i = 0; i < 3; ++i) {
    sent.push_back(Get({"big"}, false, "slow-reader"));
    ASSERT_TRUE(sent.back()->status->ok()) << *sent.back()->status;
  }
  Call* fourth = Get({"big"}, false, "slow-reader");
  EXPECT_EQ(fourth->status->code(), absl::StatusCode::kResourceExhausted) << *fourth->status;
  EXPECT_TRUE(Get({"big"}, false, "another")->status->ok());
  s_->Finished(sent[0]);  // its reply went out
  EXPECT_TRUE(Get({"big"}, false, "slow-reader")->status->ok());
}

TEST_F(RendezvousLimitsTest, TheStoreChargesEachKeyItsOverhead) {
  RendezvousOptions o;
  o.max_bytes = 64 << 10;
  Open(o);
  int keys = 0;
  absl::Status s;
  for (; keys < 100'000 && (s = Set("k" + std::to_string(keys), "")).ok(); ++keys) {
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // 64 KiB at ~130 bytes a key (the key and kStoreEntryOverheadBytes).
  EXPECT_LE(keys, static_cast<int>((64 << 10) / kStoreEntryOverheadBytes));
  EXPECT_GE(keys, static_cast<int>((64 << 10) / (kStoreEntryOverheadBytes + 8)));
}

// One credential fills at most its share of the store, so the other ranks can still write
// theirs; a key is charged to whoever wrote it last.
TEST_F(RendezvousLimitsTest, OneCallerFillsOnlyItsShareOfTheStore) {
  RendezvousOptions o;
  o.max_bytes = 1 * kMiB;
  o.max_bytes_per_caller = 256 << 10;
  Open(o);
  auto set = [&](const std::string& key, size_t bytes, const std::string& caller) {
    RendezvousSetRequest r;
    r.set_generation(generation_);
    r.set_key(key);
    r.set_value(std::string(bytes, 'v'));
    RendezvousSetResponse resp;
    return s_->Set(r, &resp, caller);
  };
  int stored = 0;
  absl::Status s;
  while (stored < 100 && (s = set("a" + std::to_string(stored), 100'000, "attacker")).ok()) ++stored;
  EXPECT_EQ(stored, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_bytes_per_caller"), std::string::npos) << s;
  EXPECT_TRUE(set("honest", 100'000, "w0").ok());
  // Overwriting a key moves its charge: the attacker shrinks its key and w0's share is unchanged.
  EXPECT_TRUE(set("a0", 10, "attacker").ok());
  EXPECT_TRUE(set("a2", 100'000, "attacker").ok());
  EXPECT_TRUE(set("honest2", 100'000, "w0").ok());
}

// Every handler of pacerd finishes through CheckReplySize: a reply over the limit is an error,
// never serialized; an error passes through unchanged.
TEST(ReplyLimitTest, AnOkReplyOverTheLimitBecomesResourceExhausted) {
  RendezvousGetResponse reply;
  reply.add_values(std::string(kMaxReplyBytes, 'x'));
  absl::Status s = CheckReplySize(absl::OkStatus(), reply, "Get");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("Get: the reply would be"), std::string::npos) << s;
  EXPECT_EQ(CheckReplySize(absl::NotFoundError("gone"), reply, "Get").code(), absl::StatusCode::kNotFound);
  reply.clear_values();
  reply.add_values(std::string(kMaxReplyBytes - 16, 'x'));
  EXPECT_TRUE(CheckReplySize(absl::OkStatus(), reply, "Get").ok());
}

}  // namespace
}  // namespace pacer
