// The checks every kill -9 test ends with: the workers' ledgers (examples/consumer/ledger.h)
// count every record of every epoch exactly once, and nothing outside the dataset; and the
// service's own counters agree.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "examples/consumer/ledger.h"
#include "worker_sdk/sharding_client.h"

namespace pacer::testing {

inline void ExpectEveryRecordCountedOnce(const std::vector<std::string>& ledgers, uint32_t epochs,
                                         uint64_t records) {
  std::vector<std::vector<uint8_t>> count(epochs, std::vector<uint8_t>(records, 0));
  uint64_t overflow = 0;
  auto ledger = ReadLedgers(ledgers);  // merged: a tail-backup pair may span two ledgers
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ForEachCountedRange(*ledger, [&](uint32_t epoch, uint64_t b, uint64_t e) {
    for (uint64_t r = b; r < e; ++r) {
      if (epoch >= epochs || r >= records) {
        ++overflow;
      } else if (count[epoch][r] < 255) {
        count[epoch][r]++;
      }
    }
  });
  EXPECT_EQ(overflow, 0u) << "records outside the dataset were counted";
  for (uint32_t e = 0; e < epochs; ++e) {
    uint64_t missing = 0, twice = 0, first_bad = records;
    for (uint64_t r = 0; r < records; ++r) {
      if (count[e][r] == 0) ++missing;
      if (count[e][r] > 1) ++twice;
      if (count[e][r] != 1) first_bad = std::min(first_bad, r);
    }
    EXPECT_EQ(missing, 0u) << "epoch " << e << ": records never counted (first bad " << first_bad << ")";
    EXPECT_EQ(twice, 0u) << "epoch " << e << ": records counted twice (first bad " << first_bad << ")";
  }
}

// The service agrees with the ledgers: pacerd at `address` holds one dataset, finished, with
// exactly records x epochs counted.
inline void ExpectServiceCountedAll(const std::string& address, const std::string& token, uint32_t epochs,
                                    uint64_t records) {
  ShardingClientOptions opts;
  opts.address = address;
  opts.token = token;
  opts.worker_id = "checker";
  auto client = ShardingClient::Connect(opts);
  ASSERT_TRUE(client.ok()) << client.status();
  auto list = (*client)->ListDatasets();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->datasets_size(), 1);
  EXPECT_TRUE(list->datasets(0).finished());
  EXPECT_EQ(list->datasets(0).records_done_total(), records * epochs);
  EXPECT_EQ(list->datasets(0).completed_epochs(), epochs);
}

}  // namespace pacer::testing
