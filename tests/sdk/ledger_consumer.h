// A trainer as the SDK's users write one, for tests: Client + ShardReader + ReaderLedger, reads
// batches with Blocking::kUntilData and marks each consumed, until the data ends, the client is
// closed (Stop) or an error. The ledger (examples/consumer/ledger.h) says what pacerd counted;
// CountLedgers checks every record of every epoch exactly once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "examples/consumer/ledger.h"
#include "examples/consumer/reader_ledger.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"

namespace pacer::testing {

class LedgerConsumer {
 public:
  // `step`: the simulated compute time of one batch.
  LedgerConsumer(ClientOptions options, std::string ledger, int prefetch_leases = 1,
                 size_t batch = 10, std::chrono::microseconds step = {})
      : options_(std::move(options)), ledger_(std::move(ledger)), prefetch_(prefetch_leases),
        batch_(batch), step_(step) {}

  // Runs on the calling thread until the end of data (OK) or a failure.
  absl::Status Run(const std::string& dataset = "train") {
    auto client = Client::Connect(options_);
    if (!client.ok()) return client.status();
    {
      std::lock_guard<std::mutex> l(mu_);
      client_ = std::move(*client);
      if (stopped_) client_->Close(0);
    }
    ShardReaderOptions ro;
    ro.dataset = dataset;
    ro.prefetch_leases = prefetch_;
    auto ledger = ReaderLedger::Attach(ledger_, client_.get(), &ro);
    if (!ledger.ok()) return ledger.status();
    auto reader = ShardReader::Create(client_.get(), ro);
    if (!reader.ok()) return reader.status();
    absl::Status status;
    std::vector<uint64_t> ids;
    for (;;) {
      ids.clear();
      auto out = (*reader)->Next(batch_, &ids, ShardReader::Blocking::kUntilData);
      if (!out.ok()) {
        status = out.status();
        break;
      }
      if (*out == ShardReader::Outcome::kEndOfData) break;
      records_read_ += ids.size();
      if (step_.count() > 0) std::this_thread::sleep_for(step_);  // "training" (not synchronisation)
      (*reader)->MarkConsumed();
    }
    if (status.ok()) status = client_->Flush(30'000);
    leasing_ = client_->sharding().leasing_stats();
    stats_ = client_->stats();
    client_->Close(status.ok() ? 5'000 : 0);
    reader->reset();
    ledger->reset();
    return status;
  }

  // Any thread: closes the client, so that a Run() stuck waiting returns.
  void Stop() {
    std::lock_guard<std::mutex> l(mu_);
    stopped_ = true;
    if (client_) client_->Close(0);
  }

  // Any thread: a leasing call (fetch, combined completion) of this trainer is in flight.
  bool leasing_in_flight() {
    std::lock_guard<std::mutex> l(mu_);
    return client_ && client_->sharding().leasing_calls_in_flight() > 0;
  }
  uint64_t records_read() const { return records_read_; }
  const LeasingStats& leasing() const { return leasing_; }  // after Run
  const ClientStats& stats() const { return stats_; }       // after Run
  const std::string& ledger() const { return ledger_; }

 private:
  const ClientOptions options_;
  const std::string ledger_;
  const int prefetch_;
  const size_t batch_;
  const std::chrono::microseconds step_;
  std::mutex mu_;
  bool stopped_ = false;
  std::unique_ptr<Client> client_;
  std::atomic<uint64_t> records_read_{0};
  LeasingStats leasing_;
  ClientStats stats_;
};

// Every record of epochs [0, epochs) of a `records`-record dataset counted exactly once over
// the merged ledgers (gtest failures otherwise).
inline void ExpectEachRecordCountedOnce(const std::vector<std::string>& ledgers, uint32_t epochs,
                                        uint64_t records) {
  auto ledger = ReadLedgers(ledgers);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  std::vector<std::vector<uint8_t>> count(epochs, std::vector<uint8_t>(records, 0));
  uint64_t outside = 0;
  ForEachCountedRange(*ledger, [&](uint32_t epoch, uint64_t b, uint64_t e) {
    for (uint64_t r = b; r < e; ++r) {
      if (epoch >= epochs || r >= records) {
        ++outside;
      } else if (count[epoch][r] < 255) {
        ++count[epoch][r];
      }
    }
  });
  EXPECT_EQ(outside, 0u) << "records outside the dataset were counted";
  for (uint32_t e = 0; e < epochs; ++e) {
    uint64_t missing = 0, twice = 0, first_bad = records;
    for (uint64_t r = 0; r < records; ++r) {
      if (count[e][r] == 0) ++missing;
      if (count[e][r] > 1) ++twice;
      if (count[e][r] != 1 && first_bad == records) first_bad = r;
    }
    EXPECT_EQ(missing, 0u) << "epoch " << e << ": records never counted (first " << first_bad << ")";
    EXPECT_EQ(twice, 0u) << "epoch " << e << ": records counted twice (first " << first_bad << ")";
  }
}

}  // namespace pacer::testing
