// SyntheticTrace: a generated workload for the monitor — workers with noisy step times on
// nodes, PS servers, node agents — with injected slowdowns, contention and hot servers whose
// ground truth is known. Scenario tests, bench/monitor_bench.cc and the simulator replay it.
//
// Model. Worker i's compute time per step is
//   (fixed_s + per_sample_s * batch) * speed_scale_i * slowdown_i(t) * U[1-noise, 1+noise]
// where slowdown_i(t) is the product of the injected slowdowns active at t that name the
// worker or its node. Communication and data wait are small noisy constants (communication
// grows with the latency of a hot server). Time advances in ticks (the SDK's batching
// interval): Next() moves the SimulatedClock one tick and returns every step that ended in it,
// plus the node metrics and server latencies due, as the SDK and agents would send them.
//
// Slowdowns of kind kContention or kNodeContention also raise their node's CPU steal (the
// signal the monitor uses to call a slowdown contention); kHardware leaves node signals clean.
//
// Deterministic: all randomness comes from one seeded std::mt19937_64. Not thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

struct SyntheticTraceOptions {
  uint32_t workers = 16;
  uint32_t workers_per_node = 4;
  uint32_t servers = 0;          // PS servers (0: an all-reduce job)
  uint32_t batch = 32;
  double fixed_s = 0.2;          // compute seconds per step independent of batch
  double per_sample_s = 0.025;   // compute seconds per sample (1.0 s per step at batch 32)
  double noise = 0.10;           // uniform +- on every step time
  double speed_spread = 0.0;     // per-worker static speed scale in [1-spread, 1+spread]
  double spike_probability = 0;  // heavy tail: this share of steps (GC, page faults) ...
  double spike_factor = 3;       // ... takes this many times longer
  double comm_s = 0.10;
  double data_wait_s = 0.01;
  double server_latency_ms = 4.0;
  int64_t tick_ms = 1'000;             // SDK batching interval
  int64_t node_interval_ms = 5'000;    // agent metrics interval
  int64_t latency_interval_ms = 5'000; // SDK server-latency interval
  uint64_t seed = 1;
};

class SyntheticTrace {
 public:
  static constexpr int64_t kForever = std::numeric_limits<int64_t>::max();

  enum class SlowdownKind {
    kHardware,        // one worker, stable, no node signal (deterministic)
    kContention,      // one worker, with its node's steal raised
    kNodeContention,  // every worker of `target` (a node name), with the node's steal raised
  };
  struct Slowdown {
    SlowdownKind kind = SlowdownKind::kHardware;
    std::string target;  // worker id, or node name for kNodeContention
    double factor = 1.3; // step time multiplier (> 1 slower, < 1 faster: a leader)
    int64_t start_ms = 0;
    int64_t end_ms = kForever;
  };
  struct HotServer {
    std::string server;
    double factor = 5;  // latency multiplier
    int64_t start_ms = 0;
    int64_t end_ms = kForever;
  };
  struct Batch {
    std::vector<StepReport> steps;
    std::vector<ServerLatency> latency;
    std::vector<NodeMetrics> nodes;
  };

  // Workers are "w<i>" on nodes "n<i / workers_per_node>", servers "ps<j>"; the trace starts
  // at `clock`'s current time.
  SyntheticTrace(const SyntheticTraceOptions& options, SimulatedClock* clock);

  void AddSlowdown(const Slowdown& slowdown) { slowdowns_.push_back(slowdown); }
  void AddHotServer(const HotServer& hot) { hot_servers_.push_back(hot); }

  // Advances the clock by one tick; returns what was reported during it.
  Batch Next();

  size_t num_workers() const { return workers_.size(); }
  const std::string& worker_id(size_t i) const { return workers_[i].id; }
  const std::string& node_of(size_t i) const { return workers_[i].node; }
  int64_t start_ms() const { return start_ms_; }
  // Step-time multiplier of worker i at time t (ground truth).
  double SlowdownAt(size_t worker, int64_t t_ms) const;

 private:
  struct Worker {
    std::string id, node;
    double scale = 1;
    int64_t next_end_us = 0;  // end of the step in progress (µs since trace start)
    uint64_t step = 0;
  };
  double Uniform() { return dist_(rng_); }
  double Noise() { return 1 + options_.noise * (2 * Uniform() - 1); }
  bool NodeContended(const std::string& node, int64_t t_ms) const;
  double ServerFactor(const std::string& server, int64_t t_ms) const;
  double StepSeconds(size_t w, int64_t t_ms);

  const SyntheticTraceOptions options_;
  SimulatedClock* clock_;
  const int64_t start_ms_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> dist_{0.0, 1.0};
  std::vector<Worker> workers_;
  std::vector<std::string> nodes_;
  std::vector<std::string> servers_;
  std::vector<Slowdown> slowdowns_;
  std::vector<HotServer> hot_servers_;
  int64_t next_node_ms_;
  int64_t next_latency_ms_;
};

}  // namespace pacer
