// The durable gRPC path of the sharding benchmarks: client loops on the callback API (the old
// path: FetchShard then CompleteShard; the new one: CompleteShard with next_dataset, as the SDK's
// ShardReader does), windows of them measured against an in-process pacerd, and that pacerd
// with a dataset "train" (DurablePacerd: its journal is whatever PacerdOptions name, RocksDB in a
// temp data dir by default, or etcd). Used by sharding_bench and ha_bench.
#pragma once

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "proto/pacer/sharding.grpc.pb.h"

namespace pacer::bench {

using Clock = std::chrono::steady_clock;

inline std::string MakeTempDir() {
  char tmpl[] = "/tmp/pacer-bench-XXXXXX";
  if (!mkdtemp(tmpl)) std::abort();
  return tmpl;
}

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One client: an endless chain of (call A, then call B) on the callback API, counting pairs.
class PairLoop {
 public:
  virtual ~PairLoop() = default;
  virtual void Start() = 0;
  std::atomic<uint64_t> pairs{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> stopped{false};
};


class ShardLoop final : public PairLoop {
 public:
  ShardLoop(ShardingService::Stub* stub, std::string token, std::string worker, uint64_t inc,
            std::string dataset)
      : stub_(stub), token_(std::move(token)) {
    fetch_.set_worker_id(worker);
    fetch_.set_incarnation(inc);
    fetch_.set_dataset(std::move(dataset));
    complete_.set_worker_id(std::move(worker));
    complete_.set_incarnation(inc);
  }
  void Start() override { Fetch(); }

 private:
  void Fetch() {
    if (stop) {
      stopped = true;
      return;
    }
    ctx_ = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx_.get(), token_);
    fetch_resp_.Clear();
    stub_->async()->FetchShard(ctx_.get(), &fetch_, &fetch_resp_, [this](grpc::Status s) {
      if (!s.ok() || fetch_resp_.outcome() != FetchShardResponse::LEASED) {
        errors++;
        Fetch();
        return;
      }
      Complete();
    });
  }
  void Complete() {
    ctx_ = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx_.get(), token_);
    complete_.set_lease_id(fetch_resp_.lease().lease_id());
    complete_.set_fencing_token(fetch_resp_.lease().fencing_token());
    stub_->async()->CompleteShard(ctx_.get(), &complete_, &complete_resp_, [this](grpc::Status s) {
      if (!s.ok()) errors++;
      else pairs++;
      Fetch();
    });
  }
  ShardingService::Stub* stub_;
  std::string token_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  FetchShardRequest fetch_;
  FetchShardResponse fetch_resp_;
  CompleteShardRequest complete_;
  CompleteShardResponse complete_resp_;
};

// The new path: one CompleteShard per shard that also leases the next one (next_dataset,
// next_request_id), as the SDK's ShardReader does; "pairs" counts shards here.
class CombinedLoop final : public PairLoop {
 public:
  CombinedLoop(ShardingService::Stub* stub, std::string token, std::string worker, uint64_t inc,
               std::string dataset)
      : stub_(stub), token_(std::move(token)) {
    fetch_.set_worker_id(worker);
    fetch_.set_incarnation(inc);
    fetch_.set_dataset(dataset);
    complete_.set_worker_id(std::move(worker));
    complete_.set_incarnation(inc);
    complete_.set_next_dataset(std::move(dataset));
  }
  void Start() override { Fetch(); }

 private:
  void Fetch() {  // only at the start, or when a combined call leased nothing
    if (stop) {
      stopped = true;
      return;
    }
    ctx_ = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx_.get(), token_);
    fetch_.set_request_id(++request_id_);
    fetch_resp_.Clear();
    stub_->async()->FetchShard(ctx_.get(), &fetch_, &fetch_resp_, [this](grpc::Status s) {
      if (!s.ok() || fetch_resp_.outcome() != FetchShardResponse::LEASED) {
        errors++;
        Fetch();
        return;
      }
      lease_ = fetch_resp_.lease();
      Complete();
    });
  }
  void Complete() {
    if (stop) {
      stopped = true;
      return;
    }
    ctx_ = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx_.get(), token_);
    complete_.set_lease_id(lease_.lease_id());
    complete_.set_fencing_token(lease_.fencing_token());
    complete_.set_next_request_id(++request_id_);
    complete_resp_.Clear();
    stub_->async()->CompleteShard(ctx_.get(), &complete_, &complete_resp_, [this](grpc::Status s) {
      if (!s.ok()) {
        errors++;
        Fetch();
        return;
      }
      pairs++;
      if (!complete_resp_.has_next() || complete_resp_.next().outcome() != FetchShardResponse::LEASED) {
        errors++;
        Fetch();
        return;
      }
      lease_ = complete_resp_.next().lease();
      Complete();
    });
  }
  ShardingService::Stub* stub_;
  std::string token_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  uint64_t request_id_ = 0;
  Lease lease_;
  FetchShardRequest fetch_;
  FetchShardResponse fetch_resp_;
  CompleteShardRequest complete_;
  CompleteShardResponse complete_resp_;
};

// Runs the loops, measures pairs/s over `seconds` after a short warm-up, then stops them.
inline double Measure(std::vector<std::unique_ptr<PairLoop>>& loops, double seconds, uint64_t* errors) {
  for (auto& l : loops) l->Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // warm-up window
  auto count = [&] {
    uint64_t n = 0;
    for (auto& l : loops) n += l->pairs.load();
    return n;
  };
  const uint64_t before = count();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));  // measurement window
  const uint64_t after = count();
  const double rate = (after - before) / Seconds(t0, Clock::now());
  for (auto& l : loops) l->stop = true;
  for (auto& l : loops) {
    while (!l->stopped) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *errors = 0;
  for (auto& l : loops) *errors += l->errors.load();
  return rate;
}

inline std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& addr, int n) {
  std::vector<std::shared_ptr<grpc::Channel>> out;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("pacer.bench.channel", i);  // distinct channels, not one shared subchannel
    out.push_back(grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args));
  }
  return out;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

inline constexpr int kChannels = 4;

// One measurement window against a DurablePacerd.
struct Window {
  double shards_per_s = 0;
  double batches_per_1000 = 0;  // group commits (WAL fsyncs) per 1000 updates
  double marks_per_1000 = 0;    // high-water mark writes (fdatasyncs) per 1000 updates
  double write_ms = 0;          // mean time to write one batch (its fsync, or etcd transaction)
};

// The real pacerd service in process, with its durable journal, a dataset "train" and
// kChannels channels to it. `o` chooses the journal (PacerdOptions::journal: empty, RocksDB with
// sync=true; or etcd) and its options; its data dir, listen address (a port the OS picks) and
// metrics endpoint (none) are set here, the data dir a fresh temp dir.
class DurablePacerd {
 public:
  explicit DurablePacerd(PacerdOptions o = PacerdOptions()) : dir_(MakeTempDir()) {
    o.data_dir = dir_;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    auto pacerd = Pacerd::Start(o);
    if (!pacerd.ok()) {
      std::cerr << "pacerd: " << pacerd.status() << std::endl;
      std::exit(1);
    }
    pacerd_ = std::move(*pacerd);
    channels_ = Channels(pacerd_->address(), kChannels);
    for (auto& c : channels_) stubs_.push_back(ShardingService::NewStub(c));
    token_ = pacerd_->job_token();
    grpc::ClientContext ctx;
    AttachToken(&ctx, token_);
    RegisterDatasetRequest req;
    req.mutable_spec()->set_name("train");
    req.mutable_spec()->set_num_records(uint64_t{1} << 48);
    req.mutable_spec()->set_shard_size(64);
    RegisterDatasetResponse resp;
    if (!stubs_[0]->RegisterDataset(&ctx, req, &resp).ok()) std::abort();
  }
  ~DurablePacerd() {
    pacerd_->Shutdown();
    pacerd_.reset();  // its journal threads end here; only then is the dir left alone
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // One window of `clients` loops on the old (Fetch + Complete) or the new (combined) path,
  // each a fresh worker.
  Window RunWindow(int clients, bool combined, double seconds) {
    std::vector<std::unique_ptr<PairLoop>> loops;
    for (int i = 0; i < clients; ++i) {
      grpc::ClientContext ctx;
      AttachToken(&ctx, token_);
      RegisterWorkerRequest req;
      req.set_worker_id("w" + std::to_string(next_worker_++));
      RegisterWorkerResponse resp;
      if (!stubs_[0]->RegisterWorker(&ctx, req, &resp).ok()) std::abort();
      ShardingService::Stub* stub = stubs_[i % kChannels].get();
      if (combined) {
        loops.push_back(std::make_unique<CombinedLoop>(stub, token_, req.worker_id(),
                                                       resp.incarnation(), "train"));
      } else {
        loops.push_back(std::make_unique<ShardLoop>(stub, token_, req.worker_id(),
                                                    resp.incarnation(), "train"));
      }
    }
    uint64_t errors = 0;
    const JournalStats before = pacerd_->sharding()->stats().journal;
    Window w;
    w.shards_per_s = Measure(loops, seconds, &errors);
    const JournalStats after = pacerd_->sharding()->stats().journal;
    if (errors > 0) {
      std::cerr << "warning: " << errors << " failed calls at " << clients << " clients ("
                << (combined ? "new" : "old") << " path)\n";
    }
    const double updates = static_cast<double>(std::max<uint64_t>(1, after.appends - before.appends));
    w.batches_per_1000 = 1000.0 * static_cast<double>(after.batches - before.batches) / updates;
    w.marks_per_1000 = 1000.0 * static_cast<double>(after.hwm_writes - before.hwm_writes) / updates;
    const uint64_t batches = after.batches - before.batches;
    if (batches > 0) w.write_ms = 1e3 * (after.write_latency_sum_s - before.write_latency_sum_s) / batches;
    return w;
  }

 private:
  const std::string dir_;
  std::unique_ptr<Pacerd> pacerd_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<ShardingService::Stub>> stubs_;
  std::string token_;
  int next_worker_ = 0;
};


}  // namespace pacer::bench
