// ScenarioDriver: replays a SyntheticTrace into a MonitorState on a SimulatedClock and records
// every classification event, so a scenario test reads as a script:
//   ScenarioDriver d(trace_options);
//   d.RunForMs(60'000);                        // warm up
//   d.trace().AddSlowdown({...});
//   int windows = d.RunUntil([&] { return d.Class("w5") == WORKER_CLASS_STRAGGLER; }, 10);
// The clock starts on a window boundary. No sleeps, no real time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "monitor/monitor_state.h"
#include "monitor/synthetic_trace.h"

namespace pacer::testing {

class ScenarioDriver {
 public:
  explicit ScenarioDriver(const SyntheticTraceOptions& trace_options,
                          const MonitorOptions& monitor_options = MonitorOptions())
      : clock_(1'700'000'000'000 - 1'700'000'000'000 % monitor_options.window_ms) {
    state_ = std::move(MonitorState::Create(monitor_options, &clock_).value());
    trace_ = std::make_unique<SyntheticTrace>(trace_options, &clock_);
    for (size_t i = 0; i < trace_->num_workers(); ++i) {
      (void)state_->RegisterWorker(trace_->worker_id(i), trace_->node_of(i));
    }
  }

  // One tick: the trace advances the clock, due windows close, then the tick's reports arrive.
  void Tick() {
    SyntheticTrace::Batch b = trace_->Next();
    windows_closed_ += state_->AdvanceWindows(&events_);
    for (const StepReport& r : b.steps) state_->IngestStep(r);
    for (const ServerLatency& l : b.latency) state_->IngestServerLatency(l);
    for (const NodeMetrics& m : b.nodes) state_->IngestNodeMetrics(m);
  }
  void RunForMs(int64_t ms) {
    const int64_t end = clock_.NowMs() + ms;
    while (clock_.NowMs() < end) Tick();
  }
  // Runs until `done` holds after a window close, for at most `max_windows` closes. Returns the
  // number of windows closed until it held, or -1.
  int RunUntil(const std::function<bool()>& done, int max_windows) {
    const int64_t start = windows_closed_;
    while (windows_closed_ - start < max_windows) {
      const int64_t before = windows_closed_;
      Tick();
      if (windows_closed_ != before && done()) return static_cast<int>(windows_closed_ - start);
    }
    return -1;
  }

  Classification Of(const std::string& worker) const {
    return state_->Worker(worker).value().classification();
  }
  WorkerClass Class(const std::string& worker) const { return Of(worker).worker_class(); }
  std::vector<WorkerStatus> Servers() const { return state_->Servers(); }
  Classification ServerOf(const std::string& server) const {
    for (const WorkerStatus& s : state_->Servers()) {
      if (s.id() == server) return s.classification();
    }
    return Classification();
  }
  // Ids that were ever flagged (straggler or leader) since `from_seq`, other than `except`.
  std::vector<std::string> FlaggedSince(uint64_t from_seq, const std::vector<std::string>& except) const {
    std::vector<std::string> out;
    for (const ClassificationEvent& e : events_) {
      if (e.seq() <= from_seq) continue;
      const WorkerClass c = e.current().worker_class();
      if (c != WORKER_CLASS_STRAGGLER && c != WORKER_CLASS_LEADER) continue;
      if (std::find(except.begin(), except.end(), e.id()) != except.end()) continue;
      out.push_back(e.id() + "@" + std::to_string(e.window()));
    }
    return out;
  }
  uint64_t last_seq() const { return events_.empty() ? 0 : events_.back().seq(); }
  int64_t now_ms() const { return clock_.NowMs(); }

  SimulatedClock& clock() { return clock_; }
  SyntheticTrace& trace() { return *trace_; }
  MonitorState& state() { return *state_; }
  const std::vector<ClassificationEvent>& events() const { return events_; }

 private:
  SimulatedClock clock_;
  std::unique_ptr<MonitorState> state_;
  std::unique_ptr<SyntheticTrace> trace_;
  std::vector<ClassificationEvent> events_;
  int64_t windows_closed_ = 0;
};

}  // namespace pacer::testing
