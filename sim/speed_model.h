// The modelled cluster's speeds over time: who runs how fast, when (docs/design.md §7).
//
// SpeedModel (immutable, built once per scenario from its seed) holds each worker's base speed
// (median × lognormal(sigma)), each node's hardware factor (scenario groups are drawn over the
// job's nodes; spare nodes, where migrations land, are median hardware), the workers' home
// nodes, and the scheduled events.
//
// SpeedState (one per simulation run, and one for the balanced bound) walks the timeline:
// it opens and closes slowdown episodes (scheduled ones, and Poisson transients drawn lazily
// from one splitmix64 stream per (event, worker), so memory stays O(workers) over a day at
// 4 096 workers), reports failures, and gives each worker's current speed
//   v_i(t) = base_i × hardware(node_i) × Π worker episodes_i × Π node episodes(node_i)
// and each PS server's latency factor. Relaunches change it: a restart cures the worker's
// contention episodes, a migration also its hardware-like ones and moves it to another node.
// Every random draw depends only on the scenario seed, never on what a policy did, so every
// policy and the bound face the same cluster.
//
// Invariants: episodes open and close in (time, id) order; the dirty list names every worker
// whose speed changed since TakeDirty(). Thread-compatible; SpeedModel is immutable and may be
// shared across threads.
#pragma once

#include <cstdint>
#include <limits>
#include <queue>
#include <vector>

#include "sim/scenario.h"

namespace pacer::sim {

inline constexpr double kForever = std::numeric_limits<double>::infinity();

// splitmix64: a tiny, fast, well-mixed generator; its whole state is one integer.
struct SplitMix {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Exponential(double mean);
  double Normal();
};
uint64_t MixSeed(uint64_t a, uint64_t b);

enum class Scope : uint8_t { kWorker, kNode, kServer };

struct Episode {
  double start_s = 0, end_s = kForever;
  Scope scope = Scope::kWorker;
  int64_t target = 0;  // worker, node or server index
  double factor = 1;   // speed multiplier (server: 1/latency multiplier)
  bool contention = true;
};

class SpeedModel {
 public:
  explicit SpeedModel(const Scenario& scenario);

  const Scenario& scenario() const { return sc_; }
  int64_t workers() const { return sc_.job.workers; }
  int64_t nodes() const { return static_cast<int64_t>(hardware_.size()); }  // incl. spares
  int64_t job_nodes() const { return job_nodes_; }
  double base_speed(int64_t w) const { return base_[w]; }
  double hardware(int64_t node) const { return hardware_[node]; }
  int64_t home_node(int64_t w) const { return w / sc_.job.workers_per_node; }
  // Scheduled episodes sorted by (start, index); transients are drawn by SpeedState.
  const std::vector<Episode>& scheduled() const { return scheduled_; }
  struct Failure {
    double at_s;
    int64_t worker;
  };
  const std::vector<Failure>& scheduled_failures() const { return failures_; }
  // Random streams: transients (episodes) and failures (at a rate), one per (event, worker).
  struct Stream {
    size_t event;    // index in scenario.events
    int64_t worker;
    double from_s, to_s;
  };
  const std::vector<Stream>& streams() const { return streams_; }

 private:
  Scenario sc_;
  int64_t job_nodes_ = 0;
  std::vector<double> base_;
  std::vector<double> hardware_;
  std::vector<Episode> scheduled_;
  std::vector<Failure> failures_;
  std::vector<Stream> streams_;
};

class SpeedState {
 public:
  explicit SpeedState(const SpeedModel* model);

  // Opens/closes every episode due by `t_s` (t never goes back). Failures due are appended to
  // `failed` (may be null: the bound ignores failures).
  void AdvanceTo(double t_s, std::vector<int64_t>* failed);
  // The next time anything changes (kForever when nothing will).
  double NextChange() const;

  double Speed(int64_t w) const { return model_->base_speed(w) * model_->hardware(node_[w]) * wf_[w] * nf_[node_[w]]; }
  double ServerFactor(int64_t s) const { return sf_[s]; }
  // Worst (smallest) server factor: every worker of a PS job touches every server.
  double MinServerFactor() const;
  int64_t node(int64_t w) const { return node_[w]; }
  const std::vector<int64_t>& workers_on(int64_t node) const { return on_node_[node]; }
  // Largest (1 − factor) over the contention episodes touching the node now (its CPU steal).
  double NodeContention(int64_t node) const;
  bool server_changed() { bool c = server_changed_; server_changed_ = false; return c; }

  // Relaunch effects. Restart: ends the worker's contention episodes. Migrate: ends all its
  // worker episodes and moves it to `new_node`.
  void Restart(int64_t w);
  void Migrate(int64_t w, int64_t new_node);
  // Ends every episode of the server (a restart or key move relieved it).
  void RelieveServer(int64_t s);

  // Workers whose speed changed since the last call (may repeat); `all` when too many did.
  std::vector<int64_t> TakeDirty(bool* all);

 private:
  struct Active {
    uint64_t id;
    double factor;
    bool contention;
  };
  struct Due {
    double t;
    uint64_t id;  // episode id or stream index
    bool operator>(const Due& o) const { return t != o.t ? t > o.t : id > o.id; }
  };
  using MinHeap = std::priority_queue<Due, std::vector<Due>, std::greater<Due>>;

  void Open(const Episode& e, uint64_t id);
  void Close(uint64_t id);
  void RecomputeWorker(int64_t w);
  void RecomputeNode(int64_t n);
  void MarkNode(int64_t n);
  void StreamNext(size_t stream, double after_s);

  const SpeedModel* model_;
  std::vector<int64_t> node_;
  std::vector<std::vector<int64_t>> on_node_;
  std::vector<double> wf_, nf_, sf_;
  std::vector<std::vector<Active>> w_active_, n_active_, s_active_;
  std::vector<Episode> episodes_;      // every opened episode, by id (transients appended)
  size_t next_scheduled_ = 0;
  size_t next_failure_ = 0;
  MinHeap ends_, arrivals_;
  std::vector<SplitMix> rng_;          // per stream
  std::vector<int64_t> dirty_;
  bool all_dirty_ = false;
  bool server_changed_ = true;
};

}  // namespace pacer::sim
