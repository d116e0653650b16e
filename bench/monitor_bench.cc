// monitor_bench: replays generated traces through the real monitor and prints how fast and how
// quietly it classifies, and what it costs.
//
//   detection   256 workers (64 nodes x 4), +-10 % step-time noise; slowdowns of 1.3x, 2x and 5x
//               injected on 8 workers per trial (each on its own node), persistent (to the end
//               of the trial; half "hardware", half "contention" with the node's CPU steal up)
//               or transient (15 s = 1.5 windows). Onsets fall at random points of a window.
//               Latency = windows closed after the onset until the worker is a straggler
//               (and, for persistent ones, until it is a persistent straggler).
//   quiet       noise-only traces; every straggler/leader flag is a false positive.
//   misclass    a persistent injection that does not end persistent with the right cause and
//               worker scope, or a transient one that ever becomes persistent.
//   ingest      10 000 step reports/s (2 000 workers, 0.2 s steps) as serialized
//               ReportStepsRequests (one per worker per second), parsed and fed to
//               MonitorServiceImpl (validation, windows, classification, Prometheus):
//               process CPU time per report -> fraction of one core at 10 000 reports/s.
//   memory      4 096 workers, one hour of reports (2.6 s steps) into MonitorServiceImpl:
//               bytes the monitor accounts for, and the process RSS growth.
//
// Usage: monitor_bench [--json] [--quick] [--seed N]. Benchmarks may read real time (CPU
// time here); the monitor itself only sees the simulated clock.
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "monitor/monitor_service.h"
#include "monitor/monitor_state.h"
#include "monitor/synthetic_trace.h"

namespace pacer {
namespace {

using Kind = SyntheticTrace::SlowdownKind;

constexpr int64_t kStartMs = 1'700'000'000'000;  // a multiple of 10 s

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

size_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, rss = 0;
  statm >> pages >> rss;
  return rss * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// A trace replayed into a MonitorState, one tick (1 s) at a time.
struct Replay {
  SimulatedClock clock{kStartMs};
  std::unique_ptr<MonitorState> state;
  std::unique_ptr<SyntheticTrace> trace;
  std::vector<ClassificationEvent> events;
  int64_t windows = 0;

  Replay(const SyntheticTraceOptions& to, const MonitorOptions& mo) {
    state = std::move(MonitorState::Create(mo, &clock).value());
    trace = std::make_unique<SyntheticTrace>(to, &clock);
    for (size_t i = 0; i < trace->num_workers(); ++i) {
      (void)state->RegisterWorker(trace->worker_id(i), trace->node_of(i));
    }
  }
  // Runs one tick; returns the number of windows closed.
  int Tick() {
    SyntheticTrace::Batch b = trace->Next();
    const int closed = state->AdvanceWindows(&events);
    windows += closed;
    for (const StepReport& r : b.steps) state->IngestStep(r);
    for (const NodeMetrics& m : b.nodes) state->IngestNodeMetrics(m);
    return closed;
  }
  void RunMs(int64_t ms) {
    const int64_t end = clock.NowMs() + ms;
    while (clock.NowMs() < end) Tick();
  }
};

struct DetectionResult {
  std::vector<double> flag_windows;        // until straggler (detected injections)
  std::vector<double> persistent_windows;  // until persistent (persistent injections)
  int injections = 0, detected = 0, misclassified = 0, collateral_flags = 0;
};

SyntheticTraceOptions Cluster256(const SyntheticTraceOptions* base) {
  SyntheticTraceOptions to = base ? *base : SyntheticTraceOptions();
  to.workers = 256;
  to.workers_per_node = 4;
  return to;
}

DetectionResult RunDetection(double factor, bool persistent, int trials, uint64_t seed,
                             const MonitorOptions& mo, const SyntheticTraceOptions* base = nullptr) {
  DetectionResult res;
  constexpr int kVictims = 8;
  constexpr int kRunWindows = 10;
  for (int trial = 0; trial < trials; ++trial) {
    SyntheticTraceOptions to = Cluster256(base);
    to.seed = seed * 1000 + trial;
    Replay r(to, mo);
    std::mt19937_64 rng(to.seed ^ 0x9e3779b97f4a7c15ull);
    r.RunMs(60'000);  // warm up: 6 windows
    r.RunMs(1'000 * static_cast<int64_t>(rng() % 10));  // onset anywhere in a window
    const int64_t onset = r.clock.NowMs();
    // Victims on distinct nodes (one of four workers: a worker-level slowdown).
    std::vector<int> nodes(64);
    for (int i = 0; i < 64; ++i) nodes[i] = i;
    std::shuffle(nodes.begin(), nodes.end(), rng);
    std::vector<std::string> victims;
    std::map<std::string, Kind> kind_of;
    for (int v = 0; v < kVictims; ++v) {
      const std::string id = "w" + std::to_string(nodes[v] * 4 + static_cast<int>(rng() % 4));
      const Kind kind = v % 2 == 0 ? Kind::kHardware : Kind::kContention;
      const int64_t end = persistent ? SyntheticTrace::kForever : onset + 15'000;
      r.trace->AddSlowdown({kind, id, factor, onset, end});
      victims.push_back(id);
      kind_of[id] = kind;
    }
    const uint64_t seq0 = r.events.empty() ? 0 : r.events.back().seq();
    std::map<std::string, int> flagged_at, persistent_at;
    std::set<std::string> ever_persistent;
    const int64_t w0 = r.windows;
    while (r.windows - w0 < kRunWindows) {
      if (r.Tick() == 0) continue;
      const int windows = static_cast<int>(r.windows - w0);
      for (const std::string& id : victims) {
        const Classification c = r.state->Worker(id)->classification();
        if (c.worker_class() == WORKER_CLASS_STRAGGLER) {
          flagged_at.try_emplace(id, windows);
          if (c.persistence() == PERSISTENCE_PERSISTENT) {
            persistent_at.try_emplace(id, windows);
            ever_persistent.insert(id);
          }
        }
      }
    }
    for (const ClassificationEvent& e : r.events) {
      if (e.seq() <= seq0 || std::find(victims.begin(), victims.end(), e.id()) != victims.end()) continue;
      if (e.current().worker_class() == WORKER_CLASS_STRAGGLER ||
          e.current().worker_class() == WORKER_CLASS_LEADER) {
        ++res.collateral_flags;
      }
    }
    for (const std::string& id : victims) {
      ++res.injections;
      auto f = flagged_at.find(id);
      if (f != flagged_at.end()) {
        ++res.detected;
        res.flag_windows.push_back(f->second);
      }
      if (persistent) {
        auto p = persistent_at.find(id);
        if (p != persistent_at.end()) res.persistent_windows.push_back(p->second);
        const Classification c = r.state->Worker(id)->classification();
        const StragglerCause want = kind_of[id] == Kind::kHardware ? CAUSE_DETERMINISTIC : CAUSE_CONTENTION;
        const bool right = c.worker_class() == WORKER_CLASS_STRAGGLER &&
                           c.persistence() == PERSISTENCE_PERSISTENT && c.cause() == want &&
                           c.scope() == SCOPE_WORKER;
        if (!right) ++res.misclassified;
      } else if (ever_persistent.count(id)) {
        ++res.misclassified;
      }
    }
  }
  return res;
}

struct NoiseResult {
  double worker_hours = 0;
  int flags = 0, persistent_flags = 0;
};

NoiseResult RunNoise(double hours, int runs, uint64_t seed, const MonitorOptions& mo,
                     const SyntheticTraceOptions* base = nullptr) {
  NoiseResult res;
  for (int run = 0; run < runs; ++run) {
    SyntheticTraceOptions to = Cluster256(base);
    to.seed = seed * 7919 + run;
    Replay r(to, mo);
    r.RunMs(static_cast<int64_t>(hours * 3'600'000));
    res.worker_hours += 256 * hours;
    for (const ClassificationEvent& e : r.events) {
      const WorkerClass c = e.current().worker_class();
      if (c != WORKER_CLASS_STRAGGLER && c != WORKER_CLASS_LEADER) continue;
      if (e.previous().worker_class() != c) ++res.flags;
      if (e.current().persistence() == PERSISTENCE_PERSISTENT &&
          e.previous().persistence() != PERSISTENCE_PERSISTENT) {
        ++res.persistent_flags;
      }
    }
  }
  return res;
}

struct IngestResult {
  double seconds_per_report_service = 0;
  double seconds_per_report_state = 0;
  uint64_t reports = 0;
};

IngestResult RunIngest(int seconds, uint64_t seed, const MonitorOptions& mo) {
  SyntheticTraceOptions to;
  to.workers = 2000;
  to.workers_per_node = 8;
  to.fixed_s = 0.04;
  to.per_sample_s = 0.005;  // 0.2 s compute + comm: ~4.5 reports per worker per second
  to.comm_s = 0.01;
  to.seed = seed;
  // 1. Generate the reports first (not measured), serialized per worker per tick as the SDK
  //    would send them.
  SimulatedClock gen_clock(kStartMs);
  SyntheticTrace trace(to, &gen_clock);
  std::vector<std::vector<std::string>> ticks;
  std::vector<std::vector<NodeMetrics>> node_ticks;
  IngestResult res;
  for (int t = 0; t < seconds; ++t) {
    SyntheticTrace::Batch b = trace.Next();
    std::map<std::string, ReportStepsRequest> per_worker;
    for (StepReport& s : b.steps) *per_worker[s.worker_id()].add_steps() = std::move(s);
    std::vector<std::string> wire;
    for (auto& [id, req] : per_worker) {
      res.reports += req.steps_size();
      wire.push_back(req.SerializeAsString());
    }
    ticks.push_back(std::move(wire));
    node_ticks.push_back(std::move(b.nodes));
  }
  // 2. Through the service (parse + lock + validate + ingest + windows + metrics).
  {
    SimulatedClock clock(kStartMs);
    MetricsRegistry metrics;
    auto svc = std::move(MonitorServiceImpl::Create(mo, &clock, &metrics).value());
    for (size_t i = 0; i < trace.num_workers(); ++i) {
      MonitorRegisterRequest reg;
      reg.set_worker_id(trace.worker_id(i));
      reg.set_node(trace.node_of(i));
      MonitorRegisterResponse resp;
      (void)svc->RegisterWorker(reg, &resp);
    }
    const double cpu0 = CpuSeconds();
    for (size_t t = 0; t < ticks.size(); ++t) {
      clock.AdvanceMs(1000);
      for (const std::string& wire : ticks[t]) {
        ReportStepsRequest req;
        req.ParseFromString(wire);
        ReportStepsResponse resp;
        (void)svc->ReportSteps(req, &resp);
      }
      for (const NodeMetrics& m : node_ticks[t]) {
        ReportNodeRequest req;
        *req.mutable_metrics() = m;
        ReportNodeResponse resp;
        (void)svc->ReportNode(req, &resp);
      }
    }
    svc->Tick();
    res.seconds_per_report_service = (CpuSeconds() - cpu0) / static_cast<double>(res.reports);
  }
  // 3. The pure state alone (what the simulator pays).
  {
    SimulatedClock clock(kStartMs);
    auto state = std::move(MonitorState::Create(mo, &clock).value());
    for (size_t i = 0; i < trace.num_workers(); ++i) (void)state->RegisterWorker(trace.worker_id(i), trace.node_of(i));
    std::vector<std::vector<StepReport>> parsed;
    for (const auto& wire_tick : ticks) {
      std::vector<StepReport> steps;
      for (const std::string& wire : wire_tick) {
        ReportStepsRequest req;
        req.ParseFromString(wire);
        for (const StepReport& s : req.steps()) steps.push_back(s);
      }
      parsed.push_back(std::move(steps));
    }
    const double cpu0 = CpuSeconds();
    for (const auto& steps : parsed) {
      clock.AdvanceMs(1000);
      state->AdvanceWindows(nullptr);
      for (const StepReport& s : steps) state->IngestStep(s);
    }
    res.seconds_per_report_state = (CpuSeconds() - cpu0) / static_cast<double>(res.reports);
  }
  return res;
}

struct MemoryResult {
  size_t accounted_bytes = 0;
  size_t rss_growth_bytes = 0;
  uint64_t reports = 0;
  double wall_hours = 0;
};

MemoryResult RunMemory(double hours, uint64_t seed, const MonitorOptions& mo) {
  MemoryResult res;
  SyntheticTraceOptions to;
  to.workers = 4096;
  to.workers_per_node = 8;
  to.per_sample_s = 0.075;  // 2.6 s steps
  to.seed = seed;
  SimulatedClock clock(kStartMs);
  const size_t rss0 = RssBytes();
  MetricsRegistry metrics;
  auto svc = std::move(MonitorServiceImpl::Create(mo, &clock, &metrics).value());
  SyntheticTrace trace(to, &clock);
  for (size_t i = 0; i < trace.num_workers(); ++i) {
    MonitorRegisterRequest reg;
    reg.set_worker_id(trace.worker_id(i));
    reg.set_node(trace.node_of(i));
    MonitorRegisterResponse resp;
    (void)svc->RegisterWorker(reg, &resp);
  }
  const int64_t end = clock.NowMs() + static_cast<int64_t>(hours * 3'600'000);
  while (clock.NowMs() < end) {
    SyntheticTrace::Batch b = trace.Next();
    ReportStepsRequest req;
    for (StepReport& s : b.steps) *req.add_steps() = std::move(s);
    res.reports += req.steps_size();
    ReportStepsResponse resp;
    (void)svc->ReportSteps(req, &resp);
    for (const NodeMetrics& m : b.nodes) {
      ReportNodeRequest nreq;
      *nreq.mutable_metrics() = m;
      ReportNodeResponse nresp;
      (void)svc->ReportNode(nreq, &nresp);
    }
  }
  svc->Tick();
  res.accounted_bytes = svc->MemoryBytes();
  res.rss_growth_bytes = RssBytes() - rss0;
  res.wall_hours = hours;
  return res;
}

int Main(int argc, char** argv) {
  bool json = false, quick = false;
  uint64_t seed = 42;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--help")) {
      std::printf("usage: monitor_bench [--json] [--quick] [--seed N]\n");
      return 0;
    } else {
      std::fprintf(stderr, "monitor_bench: unknown flag '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  const MonitorOptions mo;  // the defaults a policy file starts from
  // Memory first: later runs free heap that a new allocation would reuse without RSS growth.
  const MemoryResult mem = RunMemory(quick ? 0.25 : 1.0, seed, mo);
  const int trials = quick ? 4 : 16;
  const double noise_hours = quick ? 1 : 4;
  const int noise_runs = quick ? 1 : 2;

  nlohmann::json out;
  out["workers"] = 256;
  out["window_s"] = mo.window_ms / 1000.0;
  out["persistent_k_of_w"] = std::to_string(mo.persistent_k) + "/" + std::to_string(mo.persistent_w);
  nlohmann::json p50 = nlohmann::json::object(), p95 = nlohmann::json::object(),
                 persist_p95 = nlohmann::json::object(), persist_p50 = nlohmann::json::object(),
                 detect_rate = nlohmann::json::object(), transient = nlohmann::json::object();
  int injections = 0, misclassified = 0, collateral = 0;
  struct Row {
    std::string factor;
    std::string kind;
    DetectionResult r;
  };
  std::vector<Row> rows;
  for (double factor : {1.3, 2.0, 5.0}) {
    char key[16];
    std::snprintf(key, sizeof key, "%.1fx", factor);
    for (bool persistent : {true, false}) {
      DetectionResult r = RunDetection(factor, persistent, trials, seed, mo);
      injections += r.injections;
      misclassified += r.misclassified;
      collateral += r.collateral_flags;
      if (persistent) {
        p50[key] = Percentile(r.flag_windows, 0.5);
        p95[key] = Percentile(r.flag_windows, 0.95);
        persist_p50[key] = Percentile(r.persistent_windows, 0.5);
        persist_p95[key] = Percentile(r.persistent_windows, 0.95);
        detect_rate[key] = static_cast<double>(r.detected) / r.injections;
      } else {
        transient[key] = {{"detected_fraction", static_cast<double>(r.detected) / r.injections},
                          {"detect_windows_p50", Percentile(r.flag_windows, 0.5)},
                          {"became_persistent", r.misclassified}};
      }
      rows.push_back({key, persistent ? "persistent" : "transient 15s", std::move(r)});
    }
  }
  out["detect_windows_p50"] = p50;
  out["detect_windows_p95"] = p95;
  out["persistent_windows_p50"] = persist_p50;
  out["persistent_windows_p95"] = persist_p95;
  out["persistent_detected_fraction"] = detect_rate;
  out["transient"] = transient;
  out["injections"] = injections;
  out["misclassification_rate"] = injections ? static_cast<double>(misclassified) / injections : 0;
  out["collateral_flags_during_injections"] = collateral;

  const NoiseResult noise = RunNoise(noise_hours, noise_runs, seed, mo);
  out["noise_worker_hours"] = noise.worker_hours;
  out["false_positives_per_1000_worker_hours"] = 1000.0 * noise.flags / noise.worker_hours;
  out["persistent_false_positives_per_1000_worker_hours"] = 1000.0 * noise.persistent_flags / noise.worker_hours;

  // Stress: the same, plus +-5 % static speed differences between workers and a heavy tail
  // (2 % of steps take 3x). Not a target; it shows the margin.
  SyntheticTraceOptions stress;
  stress.speed_spread = 0.05;
  stress.spike_probability = 0.02;
  stress.spike_factor = 3;
  const NoiseResult stress_noise = RunNoise(noise_hours / 2, 1, seed + 1, mo, &stress);
  const DetectionResult stress_detect = RunDetection(1.3, true, trials / 2, seed + 1, mo, &stress);
  out["stress_false_positives_per_1000_worker_hours"] = 1000.0 * stress_noise.flags / stress_noise.worker_hours;
  out["stress_persistent_false_positives_per_1000_worker_hours"] =
      1000.0 * stress_noise.persistent_flags / stress_noise.worker_hours;
  out["stress_detect_windows_p95_1.3x"] = Percentile(stress_detect.flag_windows, 0.95);
  out["stress_persistent_windows_p95_1.3x"] = Percentile(stress_detect.persistent_windows, 0.95);
  out["stress_misclassified_1.3x"] = stress_detect.misclassified;
  out["stress_detected_fraction_1.3x"] = static_cast<double>(stress_detect.detected) / stress_detect.injections;

  const IngestResult ingest = RunIngest(quick ? 30 : 60, seed, mo);
  out["ingest_us_per_report"] = ingest.seconds_per_report_service * 1e6;
  out["ingest_us_per_report_state_only"] = ingest.seconds_per_report_state * 1e6;
  out["ingest_core_fraction_10k_per_s"] = ingest.seconds_per_report_service * 10'000;
  out["ingest_reports_measured"] = ingest.reports;

  out["memory_hours_fed"] = mem.wall_hours;
  out["memory_bytes_4096_workers_1h"] = mem.accounted_bytes;
  out["memory_rss_growth_bytes_4096_workers_1h"] = mem.rss_growth_bytes;
  out["memory_reports_fed"] = mem.reports;
  out["quick"] = quick;

  if (json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("monitor_bench: 256 workers, window %.0f s, persistent = %u of %u windows, seed %llu%s\n\n",
              mo.window_ms / 1000.0, mo.persistent_k, mo.persistent_w,
              static_cast<unsigned long long>(seed), quick ? " (quick)" : "");
  std::printf("%-7s %-14s %6s %9s %10s %10s %12s %12s %8s\n", "factor", "slowdown", "inject",
              "detected", "flag p50", "flag p95", "persist p50", "persist p95", "misclass");
  for (const Row& row : rows) {
    const bool persistent = row.kind == "persistent";
    std::printf("%-7s %-14s %6d %8.0f%% %10.1f %10.1f %12s %12s %8d\n", row.factor.c_str(),
                row.kind.c_str(), row.r.injections, 100.0 * row.r.detected / row.r.injections,
                Percentile(row.r.flag_windows, 0.5), Percentile(row.r.flag_windows, 0.95),
                persistent ? std::to_string(Percentile(row.r.persistent_windows, 0.5)).substr(0, 4).c_str() : "-",
                persistent ? std::to_string(Percentile(row.r.persistent_windows, 0.95)).substr(0, 4).c_str() : "-",
                row.r.misclassified);
  }
  std::printf("\n(flag / persist: windows closed after the onset until flagged straggler / persistent;"
              " -1: never)\n");
  std::printf("misclassification rate           %.4f (%d of %d injections)\n",
              injections ? static_cast<double>(misclassified) / injections : 0.0, misclassified, injections);
  std::printf("other workers flagged in trials  %d\n", collateral);
  std::printf("noise only: %.0f worker-hours     %.2f flags, %.2f persistent flags per 1000 worker-hours\n",
              noise.worker_hours, 1000.0 * noise.flags / noise.worker_hours,
              1000.0 * noise.persistent_flags / noise.worker_hours);
  std::printf("stress (+-5%% static spread, 2%% of steps 3x): %.2f flags, %.2f persistent flags per 1000 "
              "worker-hours (%.0f worker-hours); 1.3x persistent: %.0f%% detected, flag p95 %.1f, "
              "persistent p95 %.1f windows, %d misclassified\n",
              1000.0 * stress_noise.flags / stress_noise.worker_hours,
              1000.0 * stress_noise.persistent_flags / stress_noise.worker_hours, stress_noise.worker_hours,
              100.0 * stress_detect.detected / stress_detect.injections,
              Percentile(stress_detect.flag_windows, 0.95), Percentile(stress_detect.persistent_windows, 0.95),
              stress_detect.misclassified);
  std::printf("ingest (service, parsed protos)  %.2f us/report -> %.2f%% of a core at 10 000 reports/s"
              "  (state only: %.2f us/report)\n",
              ingest.seconds_per_report_service * 1e6, ingest.seconds_per_report_service * 1e6,
              ingest.seconds_per_report_state * 1e6);
  std::printf("memory, 4096 workers, %.2f h      %.1f MiB accounted, %.1f MiB RSS growth\n",
              mem.wall_hours, mem.accounted_bytes / 1048576.0, mem.rss_growth_bytes / 1048576.0);
  std::printf("targets: persistent >=1.3x flagged p95 <= 3 windows; 0 persistent false positives;"
              " ingest < 10%% of a core; memory < 256 MiB\n");
  return 0;
}

}  // namespace
}  // namespace pacer

int main(int argc, char** argv) { return pacer::Main(argc, argv); }
