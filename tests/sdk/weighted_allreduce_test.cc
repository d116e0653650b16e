// Numerical tests of the SDK's weighted gradient averaging on real Gloo (TCP on loopback,
// FileStore rendezvous in a private temp dir, one thread per rank), and LocalBatchPlan switching.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "examples/mlp_trainer/mlp.h"
#include "examples/mlp_trainer/synthetic_task.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/batch_plan.h"
#include "worker_sdk/collective.h"
#include "worker_sdk/gloo_collective.h"
#ifdef PACER_HAVE_NCCL
#include "worker_sdk/nccl_collective.h"
#endif

namespace pacer {
namespace {

using examples::Mlp;
using examples::SyntheticTask;
using examples::TaskSpec;

// Mean gradient of `model` over records [begin, end).
std::vector<float> MeanGradient(Mlp model, const SyntheticTask& task, uint64_t begin, uint64_t end) {
  const uint32_t d = task.spec().dims;
  std::vector<float> x((end - begin) * d);
  std::vector<uint32_t> y(end - begin);
  for (uint64_t r = begin; r < end; ++r) y[r - begin] = task.Sample(r, &x[(r - begin) * d]);
  std::vector<float> g;
  model.Gradient(x.data(), y.data(), end - begin, &g);
  return g;
}

// Runs WeightedAverage on `batches.size()` Gloo ranks (threads); rank i holds the mean
// gradient of its own slice of records. Returns each rank's result.
std::vector<std::vector<float>> AverageOnGloo(const std::vector<uint64_t>& batches, const Mlp& model,
                                              const SyntheticTask& task, double* total,
                                              GlooOptions::Algorithm algorithm = GlooOptions::Algorithm::kRing) {
  testing::TempDir dir;
  const int n = static_cast<int>(batches.size());
  std::vector<std::vector<float>> out(n);
  std::vector<absl::Status> status(n);
  std::vector<double> totals(n);
  std::vector<std::thread> threads;
  uint64_t begin = 0;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i, begin] {
      GlooOptions o;
      o.rank = i;
      o.size = n;
      o.store_dir = dir.Sub("store");
      o.timeout_ms = 60'000;
      o.algorithm = algorithm;
      auto c = GlooCollective::Create(o);
      if (!c.ok()) {
        status[i] = c.status();
        return;
      }
      out[i] = batches[i] ? MeanGradient(model, task, begin, begin + batches[i])
                          : std::vector<float>(model.num_params(), 0.0f);
      std::vector<float> scratch;
      status[i] = WeightedAverage(**c, out[i], static_cast<double>(batches[i]), &totals[i], &scratch);
    });
    begin += batches[i];
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) EXPECT_TRUE(status[i].ok()) << "rank " << i << ": " << status[i];
  *total = totals[0];
  return out;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_err = std::max(max_err, std::abs(double(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::abs(double(want[i])));
  }
  EXPECT_LE(max_err, 1e-5 * std::max(1.0, max_ref)) << "largest |difference| " << max_err;
}

TEST(WeightedAllReduce, UnevenBatchesGiveTheFullBatchGradient) {
  const SyntheticTask task(TaskSpec{});
  const Mlp model(task.spec().dims, 32, task.spec().classes, 3);
  const std::vector<uint64_t> batches = {7, 13, 44};
  const std::vector<float> full = MeanGradient(model, task, 0, 64);
  double total = 0;
  auto results = AverageOnGloo(batches, model, task, &total);
  EXPECT_EQ(total, 64.0);
  for (const auto& r : results) ExpectClose(r, full);
  // Same with BCube (what pacer-train-mlp uses by default) on 4 and 5 ranks.
  for (const std::vector<uint64_t>& b : {std::vector<uint64_t>{7, 13, 44, 0}, std::vector<uint64_t>{7, 13, 20, 3, 21}}) {
    auto bcube = AverageOnGloo(b, model, task, &total, GlooOptions::Algorithm::kBcube);
    EXPECT_EQ(total, 64.0);
    for (const auto& r : bcube) ExpectClose(r, full);
  }
  // The property is not vacuous: the plain (unweighted) mean of the three gradients differs.
  std::vector<float> plain(full.size(), 0.0f);
  uint64_t begin = 0;
  for (uint64_t b : batches) {
    auto g = MeanGradient(model, task, begin, begin + b);
    for (size_t i = 0; i < g.size(); ++i) plain[i] += g[i] / 3.0f;
    begin += b;
  }
  double diff = 0;
  for (size_t i = 0; i < full.size(); ++i) diff = std::max(diff, std::abs(double(plain[i]) - full[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(WeightedAllReduce, AWorkerWithoutDataContributesNothing) {
  const SyntheticTask task(TaskSpec{});
  const Mlp model(task.spec().dims, 16, task.spec().classes, 5);
  double total = 0;
  auto results = AverageOnGloo({20, 0, 12}, model, task, &total);
  EXPECT_EQ(total, 32.0);
  const std::vector<float> full = MeanGradient(model, task, 0, 32);
  for (const auto& r : results) ExpectClose(r, full);
  auto none = AverageOnGloo({0, 0}, model, task, &total);
  EXPECT_EQ(total, 0.0);
  for (const auto& r : none) {
    for (float v : r) ASSERT_EQ(v, 0.0f);
  }
}

TEST(WeightedAllReduce, RendezvousWithAMissingPeerTimesOutWithAnError) {
  testing::TempDir dir;
  GlooOptions o;
  o.rank = 0;
  o.size = 2;
  o.store_dir = dir.Sub("store");
  o.timeout_ms = 1'000;
  auto c = GlooCollective::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  GlooOptions bad = o;
  bad.rank = 2;
  EXPECT_EQ(GlooCollective::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclAllReduce, WeightedAverageOnTheGpu) {
#ifndef PACER_HAVE_NCCL
  GTEST_SKIP() << "NCCL backend not built (CUDA toolkit or NCCL not found at configure time)";
#else
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine: NCCL test skipped";
  // One rank per GPU; with one GPU the group has one rank (NCCL refuses two ranks on a device).
  const int ranks = std::min(CudaDeviceCount(), 3);
  const std::vector<uint64_t> all = {7, 13, 44};
  const std::vector<uint64_t> batches(all.begin(), all.begin() + ranks);
  uint64_t n = 0;
  for (uint64_t b : batches) n += b;
  const SyntheticTask task(TaskSpec{});
  const Mlp model(task.spec().dims, 32, task.spec().classes, 3);
  const std::vector<float> full = MeanGradient(model, task, 0, n);
  testing::TempDir dir;
  std::vector<std::vector<float>> out(ranks);
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  uint64_t begin = 0;
  for (int i = 0; i < ranks; ++i) {
    threads.emplace_back([&, i, begin] {
      NcclOptions o;
      o.rank = i;
      o.size = ranks;
      o.device = i;
      o.store_dir = dir.Sub("store");
      auto c = NcclCollective::Create(o);
      if (!c.ok()) {
        status[i] = c.status();
        return;
      }
      out[i] = MeanGradient(model, task, begin, begin + batches[i]);
      std::vector<float> scratch;
      double total = 0;
      status[i] = WeightedAverage(**c, out[i], static_cast<double>(batches[i]), &total, &scratch);
    });
    begin += batches[i];
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < ranks; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    ExpectClose(out[i], full);
  }
#endif
}

TEST(LocalBatchPlan, ANewPlanTakesEffectAtItsEffectiveStepAndOnlyMovesForward) {
  LocalBatch initial;
  initial.micro_batch = 32;
  LocalBatchPlan plan(initial);
  BatchPlanCommand c;
  c.set_version(2);
  c.set_effective_step(10);
  c.set_micro_batch(24);
  c.set_accumulation_steps(2);
  EXPECT_TRUE(plan.Offer(c));
  EXPECT_EQ(plan.newest_version(), 2u);
  EXPECT_EQ(plan.ForStep(9).micro_batch, 32u);
  EXPECT_EQ(plan.ForStep(10).micro_batch, 24u);
  EXPECT_EQ(plan.current().samples(), 48u);
  BatchPlanCommand old = c;
  old.set_version(1);
  old.set_micro_batch(8);
  EXPECT_FALSE(plan.Offer(old));  // older version: ignored
  BatchPlanCommand zero = c;
  zero.set_version(5);
  zero.set_micro_batch(0);
  EXPECT_FALSE(plan.Offer(zero));  // malformed
  // Two pending plans, both due: the newest wins.
  BatchPlanCommand a = c, b = c;
  a.set_version(3);
  a.set_effective_step(20);
  a.set_micro_batch(16);
  b.set_version(4);
  b.set_effective_step(25);
  b.set_micro_batch(12);
  EXPECT_TRUE(plan.Offer(a));
  EXPECT_TRUE(plan.Offer(b));
  EXPECT_EQ(plan.ForStep(19).micro_batch, 24u);
  EXPECT_EQ(plan.ForStep(30).micro_batch, 12u);
  EXPECT_EQ(plan.current().version, 4u);
}

}  // namespace
}  // namespace pacer
