#include "monitor/monitor_metrics.h"

#include <algorithm>
#include <array>

namespace pacer {
namespace {

constexpr std::array<const char*, 4> kClassNames = {"unknown", "normal", "straggler", "leader"};
constexpr std::array<const char*, 4> kScopeNames = {"none", "worker", "node", "server"};
constexpr std::array<const char*, 3> kCauseNames = {"unknown", "deterministic", "contention"};
constexpr std::array<const char*, 3> kPersistenceNames = {"none", "transient", "persistent"};

template <size_t N>
size_t Index(int value, const std::array<const char*, N>&) {
  return value >= 0 && static_cast<size_t>(value) < N ? static_cast<size_t>(value) : 0;
}

}  // namespace

MonitorMetrics::MonitorMetrics(MetricsRegistry* r) : m_(r) {
  // Every bounded label value exists from the start (a rate() over a series that appears late
  // misses its first increase; dashboards show 0, not "no data").
  m_.accepted.Get();
  m_.windows.Get();
  m_.events.Get();
  for (size_t i = 1; i < static_cast<size_t>(ReportIssue::kCount); ++i) {
    m_.rejected.With({ReportIssueName(static_cast<ReportIssue>(i))});
  }
  for (const char* c : kClassNames) m_.workers_by_class.With({c});
  for (size_t s = 1; s < kScopeNames.size(); ++s) {
    for (const char* c : kCauseNames) {
      for (size_t p = 1; p < kPersistenceNames.size(); ++p) {
        m_.stragglers.With({kScopeNames[s], c, kPersistenceNames[p]});
      }
    }
  }
}

void MonitorMetrics::CountReports(uint64_t accepted, const RejectionCounts& issues) {
  if (accepted > published_accepted_) {
    m_.accepted.Get().Increment(static_cast<double>(accepted - published_accepted_));
  }
  published_accepted_ = accepted;
  for (size_t i = 1; i < static_cast<size_t>(ReportIssue::kCount); ++i) {
    const auto issue = static_cast<ReportIssue>(i);
    const uint64_t now = issues.Get(issue), before = published_issues_.Get(issue);
    if (now > before) {
      m_.rejected.With({ReportIssueName(issue)}).Increment(static_cast<double>(now - before));
      published_issues_.Add(issue, now - before);
    }
  }
}

void MonitorMetrics::CountWindows(int closed, size_t events) {
  if (closed > 0) m_.windows.Get().Increment(closed);
  if (events > 0) m_.events.Get().Increment(static_cast<double>(events));
}

void MonitorMetrics::Publish(double median_speed, const std::vector<WorkerStatus>& workers,
                             const std::vector<WorkerStatus>& servers, int64_t window_ms) {
  m_.median.Get().Set(median_speed);
  int64_t newest = 0;
  for (const WorkerStatus& w : workers) newest = std::max(newest, w.last_report_ms());
  const int64_t stale_ms = 3 * std::max<int64_t>(window_ms, 1);
  std::array<double, kClassNames.size()> counts{};
  std::array<std::array<std::array<double, kPersistenceNames.size()>, kCauseNames.size()>,
             kScopeNames.size()>
      stragglers{};
  double bound = 0, live = 0, batch_sum = 0;
  std::vector<double> walls;
  for (const WorkerStatus& w : workers) {
    const std::string& id = w.id();
    const Classification& c = w.classification();
    m_.speed.With({id}).Set(w.speed());
    m_.relative.With({id}).Set(w.relative_speed());
    m_.worker_class.With({id}).Set(c.worker_class());
    m_.persistent.With({id}).Set(c.persistence() == PERSISTENCE_PERSISTENT ? 1 : 0);
    const bool straggler = c.worker_class() == WORKER_CLASS_STRAGGLER;
    m_.scope.With({id}).Set(straggler ? c.scope() : 0);
    m_.cause.With({id}).Set(straggler ? c.cause() : 0);
    m_.local_batch.With({id}).Set(w.local_batch());
    m_.step.With({id, "compute"}).Set(w.compute_s());
    m_.step.With({id, "comm"}).Set(w.comm_s());
    m_.step.With({id, "data_wait"}).Set(w.data_wait_s());
    m_.step.With({id, "wall"}).Set(w.wall_s());
    counts[Index(c.worker_class(), kClassNames)] += 1;
    if (straggler) {
      stragglers[Index(c.scope(), kScopeNames)][Index(c.cause(), kCauseNames)]
                [Index(c.persistence(), kPersistenceNames)] += 1;
    }
    if (w.reports() > 0 && newest - w.last_report_ms() <= stale_ms) {
      live += 1;
      bound += w.speed();
      batch_sum += w.local_batch();
      if (w.wall_s() > 0) walls.push_back(w.wall_s());
    }
  }
  for (size_t c = 0; c < counts.size(); ++c) m_.workers_by_class.With({kClassNames[c]}).Set(counts[c]);
  for (size_t s = 1; s < kScopeNames.size(); ++s) {
    for (size_t c = 0; c < kCauseNames.size(); ++c) {
      for (size_t p = 1; p < kPersistenceNames.size(); ++p) {
        m_.stragglers.With({kScopeNames[s], kCauseNames[c], kPersistenceNames[p]})
            .Set(stragglers[s][c][p]);
      }
    }
  }
  double throughput = 0;
  if (!walls.empty()) {
    std::nth_element(walls.begin(), walls.begin() + walls.size() / 2, walls.end());
    throughput = batch_sum / walls[walls.size() / 2];
  }
  m_.throughput.Get().Set(throughput);
  m_.bound.Get().Set(bound);
  m_.live_workers.Get().Set(live);
  for (const WorkerStatus& sv : servers) {
    m_.server_latency.With({sv.id()}).Set(sv.latency_ms());
    m_.server_class.With({sv.id()}).Set(sv.classification().worker_class());
  }
}

}  // namespace pacer
