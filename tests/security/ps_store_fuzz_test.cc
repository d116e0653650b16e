// Robustness of pacer-ps's state, which every job-token or credential holder reaches: raw random
// bytes parsed as requests and structured hostile requests (huge dims, key lists past the
// limits, wrong gradient counts, NaN / inf gradients, duplicate keys, unknown tables, snapshots
// of random bytes) are answered with a status and never crash the store or break its limits:
//   - rows() <= max_server_rows and bytes() <= max_server_bytes at every step;
//   - a refused Push changes nothing (the push count and the pulled rows stay);
//   - a Pull stores nothing (rows() unchanged).
// The store keeps serving an honest table afterwards. Bounded and seeded.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "worker_sdk/ps/parameter_store.h"

namespace pacer {
namespace {

PsTableSpec RandomSpec(std::mt19937_64& rng) {
  PsTableSpec spec;
  spec.set_name(rng() % 10 == 0 ? "" : "t" + std::to_string(rng() % 5));
  switch (rng() % 5) {
    case 0: spec.set_dim(0); break;
    case 1: spec.set_dim(1u << 20); break;
    case 2: spec.set_dim(static_cast<uint32_t>(rng())); break;
    default: spec.set_dim(1 + static_cast<uint32_t>(rng() % 16)); break;
  }
  spec.mutable_optimizer()->set_kind(static_cast<PsOptimizer::Kind>(rng() % 3));
  const float lr[] = {0.1f, 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()};
  spec.mutable_optimizer()->set_learning_rate(lr[rng() % 5]);
  spec.mutable_optimizer()->set_initial_accumulator(rng() % 4 == 0 ? -1.0f : 0.1f);
  spec.set_init_scale(rng() % 6 == 0 ? std::numeric_limits<float>::infinity() : 0.01f);
  spec.set_seed(rng());
  return spec;
}

std::vector<uint64_t> RandomKeys(std::mt19937_64& rng) {
  std::vector<uint64_t> keys(rng() % 10 == 0 ? 5000 + rng() % 100 : rng() % 40);
  for (auto& k : keys) k = rng() % 4 == 0 ? rng() : rng() % 64;
  return keys;
}

TEST(PsStoreFuzzTest, HostileRequestsNeverCrashOrPassTheLimits) {
  PsLimits limits;
  limits.max_keys_per_request = 4096;
  limits.max_values_per_request = 1 << 16;
  limits.max_tables = 4;
  limits.max_table_rows = 2000;
  limits.max_server_rows = 3000;
  limits.max_server_bytes = 8 << 20;
  limits.max_table_bytes = 4 << 20;
  ParameterStore store(limits);
  std::mt19937_64 rng(20261202);
  int ok = 0, refused = 0;
  for (int i = 0; i < 20'000; ++i) {
    switch (rng() % 5) {
      case 0: {
        PsTableSpec spec;
        if (rng() % 4 == 0) {
          std::string bytes(rng() % 64, '\0');
          for (char& c : bytes) c = static_cast<char>(rng());
          if (!spec.ParseFromString(bytes)) continue;
        } else {
          spec = RandomSpec(rng);
        }
        (store.CreateTable(spec).ok() ? ok : refused)++;
        break;
      }
      case 1: {
        const uint64_t rows_before = store.rows();
        std::vector<float> values;
        (store.Pull("t" + std::to_string(rng() % 6), RandomKeys(rng), &values).ok() ? ok : refused)++;
        ASSERT_EQ(store.rows(), rows_before) << "a Pull stored rows";
        break;
      }
      default: {
        const std::string table = "t" + std::to_string(rng() % 6);
        std::vector<uint64_t> keys = RandomKeys(rng);
        std::vector<float> grads(keys.size() * (1 + rng() % 16) + (rng() % 8 == 0 ? 1 : 0));
        for (auto& g : grads) {
          const uint64_t r = rng() % 200;
          g = r == 0 ? std::numeric_limits<float>::quiet_NaN()
              : r == 1 ? std::numeric_limits<float>::infinity()
                       : static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 1000;
        }
        const uint64_t rows_before = store.rows();
        const uint64_t changes_before = store.changes();
        auto pushed = store.Push(table, keys, grads);
        if (pushed.ok()) {
          ++ok;
        } else {
          ++refused;
          ASSERT_EQ(store.rows(), rows_before) << pushed.status();
          ASSERT_EQ(store.changes(), changes_before) << pushed.status();
        }
        break;
      }
    }
    ASSERT_LE(store.rows(), limits.max_server_rows);
    ASSERT_LE(store.bytes(), limits.max_server_bytes);
  }
  // A snapshot of random bytes restores into a fresh store or is refused, never crashes.
  for (int i = 0; i < 500; ++i) {
    std::string bytes(rng() % 256, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    PsSnapshot snap;
    if (!snap.ParseFromString(bytes)) continue;
    ParameterStore fresh(limits);
    (void)fresh.Restore(snap);
    ASSERT_LE(fresh.rows(), limits.max_server_rows);
  }
  // The real state round-trips through a snapshot.
  ParameterStore copy(limits);
  absl::Status restored = copy.Restore(store.Snapshot());
  ASSERT_TRUE(restored.ok()) << restored;
  EXPECT_EQ(copy.rows(), store.rows());
  std::cout << ok << " requests served, " << refused << " refused; " << store.rows() << " rows, "
            << store.bytes() << " bytes" << std::endl;
  EXPECT_GT(ok, 100);
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace pacer
