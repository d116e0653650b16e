// pacer-ps limits (worker_sdk/ps/ps_limits.h): per request keys and keys x dim, per
// table and per server rows and bytes, tables per server — each reached gives
// RESOURCE_EXHAUSTED naming its flag and applies nothing; a Pull never creates a row; a
// snapshot over the limits is refused, not half loaded; the flags' values are validated.
#include <gtest/gtest.h>

#include "worker_sdk/ps/parameter_store.h"

namespace pacer {
namespace {

PsTableSpec Spec(const std::string& name, uint32_t dim, PsOptimizer::Kind kind = PsOptimizer::SGD) {
  PsTableSpec s;
  s.set_name(name);
  s.set_dim(dim);
  s.mutable_optimizer()->set_kind(kind);
  s.mutable_optimizer()->set_learning_rate(0.1f);
  s.mutable_optimizer()->set_initial_accumulator(0.1f);
  s.set_init_scale(0.01f);
  s.set_seed(3);
  return s;
}

void ExpectExhausted(const absl::Status& s, const std::string& flag) {
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(std::string(s.message()).find(flag), std::string::npos) << s;
}

std::vector<uint64_t> Keys(uint64_t from, uint64_t n) {
  std::vector<uint64_t> k(n);
  for (uint64_t i = 0; i < n; ++i) k[i] = from + i;
  return k;
}

TEST(PsLimitsTest, TheOversizedPullIsRefusedBeforeAnyWork) {
  ParameterStore store;  // the defaults
  ASSERT_TRUE(store.CreateTable(Spec("huge", 1u << 20)).ok());
  std::vector<float> v;
  ExpectExhausted(store.Pull("huge", Keys(0, 300), &v), "--max-values-per-request");
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(store.rows(), 0u);
  ASSERT_TRUE(store.Pull("huge", Keys(0, 2), &v).ok());  // 2 Mi values: within the default
  EXPECT_EQ(v.size(), 2u << 20);
  EXPECT_EQ(store.rows(), 0u) << "a pull stores nothing";
  EXPECT_EQ(store.bytes(), 0u);
}

TEST(PsLimitsTest, PullReturnsTheInitialRowWithoutStoringIt) {
  ParameterStore store;
  ASSERT_TRUE(store.CreateTable(Spec("emb", 4)).ok());
  std::vector<float> before, after;
  ASSERT_TRUE(store.Pull("emb", {5, 6}, &before).ok());
  EXPECT_EQ(store.rows(), 0u);
  ASSERT_TRUE(store.Push("emb", {5}, {0, 0, 0, 0}).ok());  // a zero gradient: the row is stored as it was
  EXPECT_EQ(store.rows(), 1u);
  ASSERT_TRUE(store.Pull("emb", {5, 6}, &after).ok());
  EXPECT_EQ(before, after) << "the stored row starts where the pulled one was";
}

TEST(PsLimitsTest, RequestTableAndServerLimitsRefuseWholePushes) {
  PsLimits l;
  l.max_keys_per_request = 100;
  l.max_values_per_request = 400;
  l.max_tables = 2;
  l.max_table_rows = 50;
  l.max_server_rows = 80;
  l.max_server_bytes = 80 * RowBytes(4, false);
  ASSERT_TRUE(l.Resolve().ok());
  ParameterStore store(l);
  ASSERT_TRUE(store.CreateTable(Spec("a", 4)).ok());
  ASSERT_TRUE(store.CreateTable(Spec("b", 4)).ok());
  ExpectExhausted(store.CreateTable(Spec("c", 4)).status(), "--max-tables");
  EXPECT_TRUE(store.CreateTable(Spec("a", 4)).ok()) << "an identical table is still fine";

  std::vector<float> g(101 * 4, 0.5f);
  ExpectExhausted(store.Push("a", Keys(0, 101), g).status(), "--max-keys-per-request");
  g.resize(40 * 4);
  ASSERT_TRUE(store.Push("a", Keys(0, 40), g).ok());
  ExpectExhausted(store.Push("a", Keys(35, 40), g).status(), "--max-table-rows");  // 35 new: 75 > 50
  EXPECT_EQ(store.rows(), 40u) << "nothing of the refused push applied";
  ASSERT_TRUE(store.Push("a", Keys(0, 40), g).ok()) << "existing rows: no new bytes";
  ASSERT_TRUE(store.Push("b", Keys(0, 40), g).ok());
  ExpectExhausted(store.Push("b", Keys(100, 1), std::vector<float>(4, 1)).status(), "--max-server-rows");
  EXPECT_EQ(store.rows(), 80u);
  EXPECT_EQ(store.bytes(), 80 * RowBytes(4, false));
}

TEST(PsLimitsTest, BytesCountAdagradAccumulatorsAndTheTableBudget) {
  PsLimits l;
  l.max_server_bytes = 10 * RowBytes(8, true);
  l.max_table_bytes = 6 * RowBytes(8, true);
  ASSERT_TRUE(l.Resolve().ok());
  ParameterStore store(l);
  ASSERT_TRUE(store.CreateTable(Spec("ada", 8, PsOptimizer::ADAGRAD)).ok());
  ASSERT_TRUE(store.CreateTable(Spec("ada2", 8, PsOptimizer::ADAGRAD)).ok());
  ASSERT_TRUE(store.Push("ada", Keys(0, 6), std::vector<float>(6 * 8, 1)).ok());
  ExpectExhausted(store.Push("ada", Keys(6, 1), std::vector<float>(8, 1)).status(), "--max-table-bytes");
  ASSERT_TRUE(store.Push("ada2", Keys(0, 4), std::vector<float>(4 * 8, 1)).ok());
  ExpectExhausted(store.Push("ada2", Keys(4, 1), std::vector<float>(8, 1)).status(), "--max-server-bytes");
  // Duplicate keys in one push are one new row.
  ParameterStore fresh(l);
  ASSERT_TRUE(fresh.CreateTable(Spec("ada", 8, PsOptimizer::ADAGRAD)).ok());
  ASSERT_TRUE(fresh.Push("ada", {7, 7, 7, 7, 7, 7, 7}, std::vector<float>(7 * 8, 1)).ok());
  EXPECT_EQ(fresh.rows(), 1u);
}

TEST(PsLimitsTest, ASnapshotOverTheLimitsIsRefusedAndNothingLoaded) {
  ParameterStore big;
  ASSERT_TRUE(big.CreateTable(Spec("t", 4)).ok());
  ASSERT_TRUE(big.Push("t", Keys(0, 20), std::vector<float>(80, 1)).ok());
  PsLimits l;
  l.max_table_rows = 10;
  ASSERT_TRUE(l.Resolve().ok());
  ParameterStore small(l);
  ExpectExhausted(small.Restore(big.Snapshot()), "--max-table-rows");
  EXPECT_EQ(small.rows(), 0u);
  ParameterStore same;
  ASSERT_TRUE(same.Restore(big.Snapshot()).ok());
  EXPECT_EQ(same.rows(), 20u);
  EXPECT_EQ(same.bytes(), big.bytes());
}

TEST(PsLimitsTest, FlagValuesAreValidated) {
  auto bad = [](PsLimits l, const std::string& flag) {
    absl::Status s = l.Resolve();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(std::string(s.message()).find(flag), std::string::npos) << s;
  };
  PsLimits l;
  l.max_values_per_request = 0;
  bad(l, "--max-values-per-request");
  l = PsLimits();
  l.max_values_per_request = 1ull << 30;
  bad(l, "--max-values-per-request");
  l = PsLimits();
  l.max_server_bytes = 1 << 20;
  l.max_table_bytes = 2 << 20;
  bad(l, "--max-table-bytes");
  l = PsLimits();
  l.max_table_rows = 10;
  l.max_server_rows = 5;
  bad(l, "--max-table-rows");
  l = PsLimits();
  ASSERT_TRUE(l.Resolve().ok());
  EXPECT_GT(l.max_server_bytes, 0u) << "automatic: a quarter of the memory limit";
  EXPECT_LE(l.max_server_bytes, ProcessMemoryLimitBytes());
}

}  // namespace
}  // namespace pacer
