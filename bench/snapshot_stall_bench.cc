// snapshot_stall_bench: what a snapshot costs the calls around it, with 100 datasets x 20 000
// files (2 M files, the quota). Prints, in one run:
//  1. time the service lock is held to capture a snapshot: before "specs apart" (ToSnapshot()
//     copies every file list, then the old WriteSnapshot serialized ~73 MB under the lock) and
//     after (ToJournalSnapshot(): dynamic state only, specs shared; serialized by the writer);
//  2. FetchShard+CompleteShard pair latency (p50/p99/max) of 8 concurrent clients on a real
//     journal (fsync on) with a snapshot every 1 000 updates, beside the same load without
//     snapshots.
//   snapshot_stall_bench [--quick]   (--quick: 10 datasets, for a smoke run)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "sharding_service/sharding_service.h"

namespace pacer {
namespace {

using Steady = std::chrono::steady_clock;
double Ms(Steady::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

DatasetSpec Spec(int d, int files) {
  DatasetSpec s;
  s.set_name("ds" + std::to_string(d));
  for (int i = 0; i < files; ++i) {
    FileSpec* f = s.mutable_files()->add_files();
    f->set_path("/mnt/data/ds" + std::to_string(d) + "/part-" + std::to_string(i) + ".tfrecord");
    f->set_num_records(1000);
  }
  s.set_shard_size(100);
  return s;
}

constexpr auto Call = [](auto&&... a) { return CallAndWait(a...); };

void LockTime(int datasets, int files) {
  ShardingState st;
  uint64_t seq = 0;
  for (int d = 0; d < datasets; ++d) {
    Update u;
    u.set_seq(++seq);
    *u.mutable_register_dataset()->mutable_spec() = Spec(d, files);
    if (!st.ApplyChecked(u).ok()) std::abort();
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> before, after;
  size_t before_bytes = 0, after_bytes = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Steady::now();
    ShardingSnapshot full = st.ToSnapshot();
    const std::string bytes = full.SerializeAsString();  // the old WriteSnapshot, under the lock
    before.push_back(Ms(Steady::now() - t0));
    before_bytes = bytes.size();
    t0 = Steady::now();
    ShardingState::JournalSnapshot js = st.ToJournalSnapshot();
    std::vector<PinnedEntry> pinned;
    for (auto& [key, spec] : js.specs) pinned.push_back(PinnedEntry{key, spec});
    after.push_back(Ms(Steady::now() - t0));
    after_bytes = js.snapshot.ByteSizeLong();
  }
  std::printf("1. service lock held per snapshot, %d datasets x %d files (median of 5)\n", datasets, files);
  std::printf("   before (specs inline: copy + serialize under the lock): %8.1f ms, %9zu bytes written per snapshot\n",
              median(before), before_bytes);
  std::printf("   after  (specs apart: ToJournalSnapshot)               : %8.3f ms, %9zu bytes per snapshot (+ each spec once)\n",
              median(after), after_bytes);
  std::printf("   ratio %.0fx\n\n", median(before) / std::max(1e-6, median(after)));
}

void Latency(int datasets, int files, uint64_t snapshot_every, const char* label) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("snapshot_stall_bench_" + std::to_string(::getpid()) + "_" + label);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + ".hwm");
  SimulatedClock clock;
  ShardingServiceOptions o;
  o.data_dir = dir;
  o.snapshot_every = snapshot_every;
  o.lease_timeout_ms = 3'600'000;
  o.worker_timeout_ms = 3'600'000;
  std::vector<double> lat;
  uint64_t snapshots = 0;
  {
    auto svc = ShardingServiceImpl::Open(o, &clock, nullptr);
    if (!svc.ok()) {
      std::fprintf(stderr, "%s\n", svc.status().ToString().c_str());
      std::exit(1);
    }
    for (int d = 0; d < datasets; ++d) {
      RegisterDatasetRequest r;
      *r.mutable_spec() = Spec(d, files);
      RegisterDatasetResponse rr;
      if (!Call(**svc, &ShardingServiceImpl::RegisterDataset, r, &rr).ok()) std::abort();
    }
    constexpr int kClients = 8;
    std::atomic<bool> stop{false};
    std::vector<std::vector<double>> per(kClients);
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&, c] {
        RegisterWorkerRequest rw;
        rw.set_worker_id("w" + std::to_string(c));
        RegisterWorkerResponse rwr;
        if (!Call(**svc, &ShardingServiceImpl::RegisterWorker, rw, &rwr).ok()) std::abort();
        for (int i = 0; !stop.load(); ++i) {
          const auto t0 = Steady::now();
          FetchShardRequest f;
          f.set_worker_id(rw.worker_id());
          f.set_incarnation(rwr.incarnation());
          f.set_dataset("ds" + std::to_string((c + i) % datasets));
          FetchShardResponse fr;
          if (!Call(**svc, &ShardingServiceImpl::FetchShard, f, &fr).ok()) std::abort();
          if (fr.outcome() != FetchShardResponse::LEASED) continue;
          CompleteShardRequest cs;
          cs.set_worker_id(rw.worker_id());
          cs.set_incarnation(rwr.incarnation());
          cs.set_lease_id(fr.lease().lease_id());
          cs.set_fencing_token(fr.lease().fencing_token());
          CompleteShardResponse cr;
          if (!Call(**svc, &ShardingServiceImpl::CompleteShard, cs, &cr).ok()) std::abort();
          per[c].push_back(Ms(Steady::now() - t0));
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::seconds(4));  // the measured window
    stop = true;
    for (auto& t : threads) t.join();
    for (auto& v : per) lat.insert(lat.end(), v.begin(), v.end());
    snapshots = (*svc)->stats().journal.snapshots;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + ".hwm");
  std::sort(lat.begin(), lat.end());
  auto q = [&](double p) { return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, size_t(p * lat.size()))]; };
  std::printf("   %-34s pairs %6zu  snapshots %3llu  p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms\n", label,
              lat.size(), static_cast<unsigned long long>(snapshots), q(0.5), q(0.99),
              lat.empty() ? 0.0 : lat.back());
}

}  // namespace
}  // namespace pacer

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int datasets = quick ? 10 : 100, files = 20'000;
  pacer::LockTime(datasets, files);
  std::printf("2. FetchShard+CompleteShard pairs, 8 clients, fsync on, %d datasets x %d files, 4 s each\n",
              datasets, files);
  pacer::Latency(datasets, files, 1'000'000'000, "no snapshots");
  pacer::Latency(datasets, files, 1'000, "after: a snapshot every 1000 upd.");
  return 0;
}
