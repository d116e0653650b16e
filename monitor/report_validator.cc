#include "monitor/report_validator.h"

#include <algorithm>
#include <cmath>

namespace pacer {
namespace {

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

ReportIssue CheckTime(const MonitorOptions& o, int64_t now_ms, int64_t time_ms) {
  if (time_ms == 0) return ReportIssue::kNone;  // unknown: the receive time is used
  if (time_ms < now_ms - o.max_report_age_ms) return ReportIssue::kStale;
  if (time_ms > now_ms + o.max_clock_skew_ms) return ReportIssue::kFutureTime;
  return ReportIssue::kNone;
}

ReportIssue CheckId(const MonitorOptions& o, const std::string& id) {
  if (id.empty()) return ReportIssue::kMissingId;
  if (id.size() > o.max_id_length) return ReportIssue::kIdTooLong;
  return ReportIssue::kNone;
}

}  // namespace

const char* ReportIssueName(ReportIssue issue) {
  switch (issue) {
    case ReportIssue::kNone: return "none";
    case ReportIssue::kMissingId: return "missing_id";
    case ReportIssue::kIdTooLong: return "id_too_long";
    case ReportIssue::kUnknownWorker: return "unknown_worker";
    case ReportIssue::kTooManyEntities: return "too_many_entities";
    case ReportIssue::kBadBatch: return "bad_batch";
    case ReportIssue::kBadSamples: return "bad_samples";
    case ReportIssue::kBadComputeTime: return "bad_compute_time";
    case ReportIssue::kImplausibleSpeed: return "implausible_speed";
    case ReportIssue::kStale: return "stale";
    case ReportIssue::kFutureTime: return "future_time";
    case ReportIssue::kDuplicateStep: return "duplicate_step";
    case ReportIssue::kFlood: return "flood";
    case ReportIssue::kRequestTooLarge: return "request_too_large";
    case ReportIssue::kBadLatency: return "bad_latency";
    case ReportIssue::kBadNodeMetrics: return "bad_node_metrics";
    case ReportIssue::kClampedComm: return "clamped_comm_time";
    case ReportIssue::kClampedDataWait: return "clamped_data_wait_time";
    case ReportIssue::kClampedWall: return "clamped_wall_time";
    case ReportIssue::kCount: break;
  }
  return "invalid";
}

uint64_t RejectionCounts::TotalRejected() const {
  uint64_t total = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (IsRejection(static_cast<ReportIssue>(i))) total += counts_[i];
  }
  return total;
}

std::map<std::string, uint64_t> RejectionCounts::ToMap() const {
  std::map<std::string, uint64_t> out;
  for (size_t i = 1; i < counts_.size(); ++i) {
    if (counts_[i] > 0) out[ReportIssueName(static_cast<ReportIssue>(i))] = counts_[i];
  }
  return out;
}

StepSample StepSample::Of(const StepReport& r) {
  StepSample s;
  s.step = r.step();
  s.local_batch = r.local_batch();
  s.samples = r.samples();
  s.compute_s = r.compute_s();
  s.comm_s = r.comm_s();
  s.data_wait_s = r.data_wait_s();
  s.wall_s = r.wall_s();
  s.time_ms = r.time_ms();
  return s;
}

ReportIssue CheckStepReport(const MonitorOptions& o, int64_t now_ms, StepReport* r,
                            RejectionCounts* repairs) {
  if (ReportIssue id = CheckId(o, r->worker_id()); id != ReportIssue::kNone) return id;
  StepSample s = StepSample::Of(*r);
  const ReportIssue issue = CheckStepSample(o, now_ms, &s, repairs);
  if (issue != ReportIssue::kNone) return issue;
  r->set_comm_s(s.comm_s);
  r->set_data_wait_s(s.data_wait_s);
  r->set_wall_s(s.wall_s);
  return ReportIssue::kNone;
}

ReportIssue CheckStepSample(const MonitorOptions& o, int64_t now_ms, StepSample* r,
                            RejectionCounts* repairs) {
  if (r->local_batch == 0 || r->local_batch > o.max_local_batch) return ReportIssue::kBadBatch;
  // Gradient accumulation may run a batch several times, but not thousands of times.
  if (r->samples == 0 || r->samples > o.max_samples_per_step ||
      r->samples > uint64_t{r->local_batch} * 1024) {
    return ReportIssue::kBadSamples;
  }
  const double compute = r->compute_s;
  if (!std::isfinite(compute) || compute <= 0 || compute > o.max_step_s)
    return ReportIssue::kBadComputeTime;
  if (static_cast<double>(r->samples) / compute > o.max_speed) return ReportIssue::kImplausibleSpeed;
  if (ReportIssue t = CheckTime(o, now_ms, r->time_ms); t != ReportIssue::kNone) return t;

  auto repair = [&](ReportIssue issue) {
    if (repairs) repairs->Add(issue);
  };
  if (!FiniteNonNegative(r->comm_s) || r->comm_s > o.max_step_s) {
    r->comm_s = 0;
    repair(ReportIssue::kClampedComm);
  }
  if (!FiniteNonNegative(r->data_wait_s) || r->data_wait_s > o.max_step_s) {
    r->data_wait_s = 0;
    repair(ReportIssue::kClampedDataWait);
  }
  const double parts = compute + r->comm_s + r->data_wait_s;
  // Timers round; allow 1 % below the sum before calling the wall time wrong.
  if (!std::isfinite(r->wall_s) || r->wall_s < parts * 0.99 || r->wall_s > 4 * o.max_step_s) {
    r->wall_s = parts;
    repair(ReportIssue::kClampedWall);
  }
  return ReportIssue::kNone;
}

ReportIssue CheckServerLatency(const MonitorOptions& o, int64_t now_ms, const ServerLatency& s) {
  if (ReportIssue id = CheckId(o, s.server_id()); id != ReportIssue::kNone) return id;
  if (s.reporter().empty()) return ReportIssue::kMissingId;  // one vote per reporter: it must name one
  if (s.reporter().size() > o.max_id_length) return ReportIssue::kIdTooLong;
  const double max_ms = o.max_step_s * 1000;
  if (!FiniteNonNegative(s.mean_latency_ms()) || s.mean_latency_ms() > max_ms ||
      !FiniteNonNegative(s.p99_latency_ms()) || s.p99_latency_ms() > max_ms || s.requests() == 0) {
    return ReportIssue::kBadLatency;
  }
  return CheckTime(o, now_ms, s.time_ms());
}

ReportIssue CheckNodeMetrics(const MonitorOptions& o, int64_t now_ms, const NodeMetrics& m) {
  if (ReportIssue id = CheckId(o, m.node()); id != ReportIssue::kNone) return id;
  auto frac = [](double v) { return std::isfinite(v) && v >= 0 && v <= 1.0001; };
  if (!frac(m.cpu_busy_frac()) || !frac(m.cpu_steal_frac()) || !frac(m.other_cpu_frac()) ||
      !std::isfinite(m.interval_s()) || m.interval_s() < 0 || m.interval_s() > 3600 ||
      !FiniteNonNegative(m.cpu_throttled_s()) ||
      m.cpu_throttled_s() > m.interval_s() * std::max<uint32_t>(m.num_cpus(), 1) + 1e-6 ||
      !FiniteNonNegative(m.load1()) || m.load1() > 1e6 || m.num_cpus() > 1'000'000 ||
      m.gpu_util_size() > 1024) {
    return ReportIssue::kBadNodeMetrics;
  }
  for (double g : m.gpu_util()) {
    if (!frac(g)) return ReportIssue::kBadNodeMetrics;
  }
  return CheckTime(o, now_ms, m.time_ms());
}

}  // namespace pacer
