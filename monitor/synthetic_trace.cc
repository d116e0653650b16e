#include "monitor/synthetic_trace.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pacer {

SyntheticTrace::SyntheticTrace(const SyntheticTraceOptions& options, SimulatedClock* clock)
    : options_(options),
      clock_(clock),
      start_ms_(clock->NowMs()),
      rng_(options.seed),
      next_node_ms_(clock->NowMs()),
      next_latency_ms_(clock->NowMs() + options.latency_interval_ms) {
  const uint32_t per_node = std::max<uint32_t>(options.workers_per_node, 1);
  for (uint32_t i = 0; i < options.workers; ++i) {
    Worker w;
    w.id = absl::StrCat("w", i);
    w.node = absl::StrCat("n", i / per_node);
    if (i % per_node == 0) nodes_.push_back(w.node);
    w.scale = 1 + options.speed_spread * (2 * Uniform() - 1);
    workers_.push_back(std::move(w));
  }
  for (uint32_t j = 0; j < options.servers; ++j) servers_.push_back(absl::StrCat("ps", j));
  // Stagger the first step ends so workers do not report in lockstep.
  for (size_t i = 0; i < workers_.size(); ++i) {
    workers_[i].next_end_us = static_cast<int64_t>(StepSeconds(i, start_ms_) * 1e6 * (0.5 + Uniform()));
  }
}

double SyntheticTrace::SlowdownAt(size_t worker, int64_t t) const {
  double f = 1;
  for (const Slowdown& s : slowdowns_) {
    if (t < s.start_ms || t >= s.end_ms) continue;
    const bool applies = s.kind == SlowdownKind::kNodeContention ? s.target == workers_[worker].node
                                                                 : s.target == workers_[worker].id;
    if (applies) f *= s.factor;
  }
  return f;
}

bool SyntheticTrace::NodeContended(const std::string& node, int64_t t) const {
  for (const Slowdown& s : slowdowns_) {
    if (t < s.start_ms || t >= s.end_ms || s.kind == SlowdownKind::kHardware) continue;
    if (s.kind == SlowdownKind::kNodeContention && s.target == node) return true;
    if (s.kind == SlowdownKind::kContention) {
      for (const Worker& w : workers_) {
        if (w.id == s.target && w.node == node) return true;
      }
    }
  }
  return false;
}

double SyntheticTrace::ServerFactor(const std::string& server, int64_t t) const {
  double f = 1;
  for (const HotServer& h : hot_servers_) {
    if (h.server == server && t >= h.start_ms && t < h.end_ms) f *= h.factor;
  }
  return f;
}

double SyntheticTrace::StepSeconds(size_t w, int64_t t_ms) {
  const double base = options_.fixed_s + options_.per_sample_s * options_.batch;
  double t = base * workers_[w].scale * SlowdownAt(w, t_ms) * Noise();
  // Drawn only when enabled, so traces without spikes keep their random sequence.
  if (options_.spike_probability > 0 && Uniform() < options_.spike_probability) t *= options_.spike_factor;
  return t;
}

SyntheticTrace::Batch SyntheticTrace::Next() {
  Batch batch;
  const int64_t tick_start = clock_->NowMs();
  const int64_t tick_end = tick_start + options_.tick_ms;
  const int64_t end_us = (tick_end - start_ms_) * 1000;
  double server_factor_max = 1;
  for (const std::string& s : servers_) server_factor_max = std::max(server_factor_max, ServerFactor(s, tick_start));
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    while (w.next_end_us <= end_us) {
      const int64_t step_end_ms = start_ms_ + w.next_end_us / 1000;
      StepReport r;
      r.set_worker_id(w.id);
      r.set_step(w.step++);
      r.set_local_batch(options_.batch);
      r.set_samples(options_.batch);
      // The step that just ended ran at the speed of the time it ended (close enough at 1 s
      // steps); its successor is drawn now.
      const double compute = StepSeconds(i, step_end_ms);
      const double comm = options_.comm_s * server_factor_max * Noise();
      const double data = options_.data_wait_s * Noise();
      r.set_compute_s(compute);
      r.set_comm_s(comm);
      r.set_data_wait_s(data);
      r.set_wall_s(compute + comm + data);
      r.set_time_ms(step_end_ms);
      batch.steps.push_back(std::move(r));
      w.next_end_us += static_cast<int64_t>((compute + comm + data) * 1e6);
    }
  }
  clock_->SetMs(tick_end);
  if (!servers_.empty() && tick_end >= next_latency_ms_) {
    next_latency_ms_ += options_.latency_interval_ms;
    for (const std::string& s : servers_) {
      const double f = ServerFactor(s, tick_end);
      for (const Worker& w : workers_) {
        ServerLatency l;
        l.set_server_id(s);
        l.set_reporter(w.id);
        l.set_requests(100);
        l.set_mean_latency_ms(options_.server_latency_ms * f * Noise());
        l.set_p99_latency_ms(l.mean_latency_ms() * 3);
        l.set_time_ms(tick_end);
        batch.latency.push_back(std::move(l));
      }
    }
  }
  if (tick_end >= next_node_ms_) {
    next_node_ms_ += options_.node_interval_ms;
    for (const std::string& n : nodes_) {
      NodeMetrics m;
      m.set_node(n);
      m.set_time_ms(tick_end);
      m.set_interval_s(options_.node_interval_ms / 1000.0);
      m.set_num_cpus(16);
      const bool contended = NodeContended(n, tick_end);
      m.set_cpu_busy_frac(std::min(1.0, 0.6 + 0.05 * Uniform() + (contended ? 0.3 : 0)));
      m.set_cpu_steal_frac(contended ? 0.15 + 0.05 * Uniform() : 0.01 * Uniform());
      m.set_other_cpu_frac(0.02 * Uniform());
      m.set_load1(8 + 2 * Uniform());
      m.set_memory_used_bytes(uint64_t{32} << 30);
      m.set_memory_limit_bytes(uint64_t{64} << 30);
      batch.nodes.push_back(std::move(m));
    }
  }
  return batch;
}

}  // namespace pacer
