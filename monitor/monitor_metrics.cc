#include "monitor/monitor_metrics.h"

namespace pacer {
namespace {

prometheus::Family<prometheus::Gauge>& GaugeFamily(MetricsRegistry* r, const std::string& name,
                                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r->registry());
}

}  // namespace

MonitorMetrics::MonitorMetrics(MetricsRegistry* r)
    : accepted_(r->Counter("pacer_monitor_reports_accepted_total",
                           "Step, server-latency and node reports used by the monitor")),
      rejected_family_(prometheus::BuildCounter()
                           .Name("pacer_monitor_reports_rejected_total")
                           .Help("Reports refused (or repaired: clamped_*) by reason")
                           .Register(r->registry())),
      windows_(r->Counter("pacer_monitor_windows_closed_total", "Estimation windows closed")),
      events_(r->Counter("pacer_monitor_events_total", "Classification changes emitted")),
      median_(r->Gauge("pacer_monitor_job_median_speed_samples_per_second",
                       "Median worker speed in the last closed window")),
      workers_by_class_(GaugeFamily(r, "pacer_monitor_workers", "Workers per class")),
      speed_(GaugeFamily(r, "pacer_monitor_worker_speed_samples_per_second",
                         "Worker speed (samples per compute second), last closed window")),
      relative_(GaugeFamily(r, "pacer_monitor_worker_relative_speed",
                            "Worker speed / job median speed")),
      class_(GaugeFamily(r, "pacer_monitor_worker_class",
                         "Worker class: 0 unknown, 1 normal, 2 straggler, 3 leader")),
      persistent_(GaugeFamily(r, "pacer_monitor_worker_persistent",
                              "1 when the worker's class is persistent")),
      step_(GaugeFamily(r, "pacer_monitor_worker_step_seconds",
                        "Mean step-time breakdown in the last closed window")),
      server_latency_(GaugeFamily(r, "pacer_monitor_server_latency_milliseconds",
                                  "PS server request latency (median over reporters)")),
      server_class_(GaugeFamily(r, "pacer_monitor_server_class",
                                "PS server class: 0 unknown, 1 normal, 2 straggler (hot)")) {
  for (size_t i = 1; i < rejected_.size(); ++i) {
    rejected_[i] = &rejected_family_.Add({{"reason", ReportIssueName(static_cast<ReportIssue>(i))}});
  }
  const char* names[] = {"unknown", "normal", "straggler", "leader"};
  for (size_t c = 0; c < class_counts_.size(); ++c) {
    class_counts_[c] = &workers_by_class_.Add({{"class", names[c]}});
  }
}

void MonitorMetrics::CountReports(uint64_t accepted, const RejectionCounts& issues) {
  if (accepted > published_accepted_) accepted_.Increment(static_cast<double>(accepted - published_accepted_));
  published_accepted_ = accepted;
  for (size_t i = 1; i < rejected_.size(); ++i) {
    const auto issue = static_cast<ReportIssue>(i);
    const uint64_t now = issues.Get(issue), before = published_issues_.Get(issue);
    if (now > before) {
      rejected_[i]->Increment(static_cast<double>(now - before));
      published_issues_.Add(issue, now - before);
    }
  }
}

void MonitorMetrics::CountWindows(int closed, size_t events) {
  if (closed > 0) windows_.Increment(closed);
  if (events > 0) events_.Increment(static_cast<double>(events));
}

void MonitorMetrics::Publish(double median_speed, const std::vector<WorkerStatus>& workers,
                             const std::vector<WorkerStatus>& servers) {
  median_.Set(median_speed);
  std::array<double, 4> counts{};
  for (const WorkerStatus& w : workers) {
    auto [it, inserted] = worker_series_.try_emplace(w.id());
    WorkerSeries& s = it->second;
    if (inserted) {
      const prometheus::Labels l{{"worker", w.id()}};
      s.speed = &speed_.Add(l);
      s.relative = &relative_.Add(l);
      s.worker_class = &class_.Add(l);
      s.persistent = &persistent_.Add(l);
      const char* phases[] = {"compute", "comm", "data_wait", "wall"};
      for (size_t p = 0; p < 4; ++p) s.step[p] = &step_.Add({{"worker", w.id()}, {"phase", phases[p]}});
    }
    const Classification& c = w.classification();
    s.speed->Set(w.speed());
    s.relative->Set(w.relative_speed());
    s.worker_class->Set(c.worker_class());
    s.persistent->Set(c.persistence() == PERSISTENCE_PERSISTENT ? 1 : 0);
    s.step[0]->Set(w.compute_s());
    s.step[1]->Set(w.comm_s());
    s.step[2]->Set(w.data_wait_s());
    s.step[3]->Set(w.wall_s());
    if (c.worker_class() >= 0 && c.worker_class() < 4) counts[c.worker_class()] += 1;
  }
  for (size_t c = 0; c < counts.size(); ++c) class_counts_[c]->Set(counts[c]);
  for (const WorkerStatus& sv : servers) {
    auto [it, inserted] = server_series_.try_emplace(sv.id());
    if (inserted) {
      const prometheus::Labels l{{"server", sv.id()}};
      it->second.latency = &server_latency_.Add(l);
      it->second.server_class = &server_class_.Add(l);
    }
    it->second.latency->Set(sv.latency_ms());
    it->second.server_class->Set(sv.classification().worker_class());
  }
}

}  // namespace pacer
