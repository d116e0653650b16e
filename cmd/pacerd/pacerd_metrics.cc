#include "cmd/pacerd/pacerd_metrics.h"

#include <algorithm>
#include <array>

#include "common/version.h"

namespace pacer {
namespace {

constexpr std::array<const char*, 7> kWorkerStates = {"unknown", "running", "backoff", "exited",
                                                      "failed",  "stopped", "stopping"};

}  // namespace

PacerdMetrics::PacerdMetrics(MetricsRegistry* r, double unix_s)
    : own_(r), agents_(r), controller_(r) {
  own_.start_time.Get().Set(unix_s);
  own_.build_info.With({PacerVersion()}).Set(1);
  for (const char* outcome : {"queued", "done", "refused"}) agents_.commands.With({outcome});
  for (const char* state : {"connected", "leaving", "lost"}) agents_.agents.With({state}).Set(0);
  for (const char* state : kWorkerStates) agents_.workers.With({state}).Set(0);
}

void PacerdMetrics::Publish(const AgentRegistry& agents, const Reconciler& reconciler,
                            SpeedSource& speeds, int64_t now_ms) {
  double connected = 0, leaving = 0, lost = 0, oldest_s = 0;
  std::array<double, kWorkerStates.size()> workers{};
  for (const AgentView& a : agents.Agents()) {
    // An agent that said it was leaving and then went quiet left cleanly: not lost.
    if (a.leaving) {
      leaving += 1;
      continue;
    }
    if (a.lost) {
      lost += 1;
      continue;
    }
    connected += 1;
    oldest_s = std::max(oldest_s, std::max<int64_t>(0, now_ms - a.last_heartbeat_ms) / 1000.0);
    for (const WorkerProcess& w : a.workers) {
      const int s = w.state();
      workers[s >= 0 && static_cast<size_t>(s) < workers.size() ? s : 0] += 1;
    }
  }
  agents_.agents.With({"connected"}).Set(connected);
  agents_.agents.With({"leaving"}).Set(leaving);
  agents_.agents.With({"lost"}).Set(lost);
  for (size_t i = 0; i < workers.size(); ++i) agents_.workers.With({kWorkerStates[i]}).Set(workers[i]);
  agents_.heartbeat_age.Get().Set(oldest_s);
  controller_.Publish(reconciler, speeds);
}

}  // namespace pacer
