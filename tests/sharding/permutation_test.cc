#include "sharding_service/permutation.h"

#include <gtest/gtest.h>

#include <set>

namespace pacer {
namespace {

TEST(PermutationTest, IsABijectionAndInvertible) {
  for (uint64_t n : {1ULL, 2ULL, 3ULL, 7ULL, 100ULL, 1000ULL, 4097ULL}) {
    Permutation p(n, 42, 3);
    std::set<uint64_t> seen;
    for (uint64_t x = 0; x < n; ++x) {
      uint64_t y = p.Apply(x);
      ASSERT_LT(y, n);
      ASSERT_TRUE(seen.insert(y).second) << "n=" << n << " duplicate image " << y;
      ASSERT_EQ(p.Invert(y), x);
    }
  }
}

TEST(PermutationTest, SeedAndEpochChangeTheOrderReproducibly) {
  Permutation a(1000, 1, 0), b(1000, 1, 0), c(1000, 2, 0), d(1000, 1, 1);
  int same_c = 0, same_d = 0;
  for (uint64_t x = 0; x < 1000; ++x) {
    EXPECT_EQ(a.Apply(x), b.Apply(x));
    same_c += a.Apply(x) == c.Apply(x);
    same_d += a.Apply(x) == d.Apply(x);
  }
  EXPECT_LT(same_c, 50);
  EXPECT_LT(same_d, 50);
}

TEST(PermutationTest, HugeDomainNeedsNoMemory) {
  Permutation p(10'000'000'000ULL, 7, 0);
  for (uint64_t x : {0ULL, 1ULL, 9'999'999'999ULL, 123'456'789ULL}) {
    uint64_t y = p.Apply(x);
    EXPECT_LT(y, 10'000'000'000ULL);
    EXPECT_EQ(p.Invert(y), x);
  }
}

// Every shuffle mode maps the positions of an epoch onto all records exactly once, whatever
// the cut points of the leases.
TEST(MapPositionsTest, EveryModeCoversEachRecordOnce) {
  for (auto mode : {SHUFFLE_NONE, SHUFFLE_SHARDS, SHUFFLE_RECORDS}) {
    for (uint64_t n : {1ULL, 10ULL, 97ULL, 1000ULL}) {
      DatasetSpec spec;
      spec.set_num_records(n);
      spec.set_shard_size(7);
      spec.set_shuffle(mode);
      spec.set_seed(5);
      std::vector<int> count(n, 0);
      uint64_t pos = 0, cut = 1;
      while (pos < n) {
        const uint64_t end = std::min(n, pos + cut);
        for (const auto& r : MapPositionsToRecords(spec, 2, pos, end)) {
          for (uint64_t id = r.begin(); id < r.end(); ++id) {
            ASSERT_LT(id, n);
            count[id]++;
          }
        }
        pos = end;
        cut = cut % 11 + 3;  // uneven cuts, crossing block boundaries
      }
      for (uint64_t id = 0; id < n; ++id) {
        ASSERT_EQ(count[id], 1) << "mode " << mode << " n=" << n << " record " << id;
      }
    }
  }
}

TEST(MapPositionsTest, ShardShuffleKeepsBlocksContiguous) {
  DatasetSpec spec;
  spec.set_num_records(100);
  spec.set_shard_size(10);
  spec.set_shuffle(SHUFFLE_SHARDS);
  spec.set_seed(9);
  auto ranges = MapPositionsToRecords(spec, 0, 0, 10);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].end() - ranges[0].begin(), 10u);
  EXPECT_EQ(ranges[0].begin() % 10, 0u);
}

TEST(MapPositionsTest, FileSegmentsSplitAtFileBoundaries) {
  DatasetSpec spec;
  auto* f = spec.mutable_files();
  auto* a = f->add_files();
  a->set_path("a");
  a->set_num_records(5);
  auto* e = f->add_files();
  e->set_path("empty");
  e->set_num_records(0);
  auto* b = f->add_files();
  b->set_path("b");
  b->set_num_records(5);
  auto segs = RecordsToFileSegments(spec, MapPositionsToRecords(spec, 0, 3, 8));
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0].path(), "a");
  EXPECT_EQ(segs[0].begin(), 3u);
  EXPECT_EQ(segs[0].end(), 5u);
  EXPECT_EQ(segs[1].path(), "b");
  EXPECT_EQ(segs[1].begin(), 0u);
  EXPECT_EQ(segs[1].end(), 3u);
}

}  // namespace
}  // namespace pacer
