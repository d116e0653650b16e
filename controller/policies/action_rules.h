// The rules policies are assembled from. Each is a pure function of (view, history, config)
// returning zero or more proposed actions; see policy.h. Thread-safe.
#pragma once

#include <optional>
#include <vector>

#include "controller/action.h"
#include "controller/cluster_view.h"
#include "controller/history.h"
#include "controller/policy_config.h"

namespace pacer {

// ADJUST_BS from the BatchPlanner against the plan in force (history.plan()); nullopt when
// hysteresis keeps the current plan or no plan is possible. With `detection`, a worker whose
// slowdown (or speed-up) is transient or less confident than min_confidence is planned at the
// median speed: AntDT acts on persistent stragglers only. Without it (LB-BSP), raw speeds.
// With step statistics (adjust_batch.speed_significance > 0), a worker whose steps do not show
// its difference from the median worker is planned at the median moved by the shrunk difference.
// A difference is "shown" when a worker's steps put its speed relative to the median away from
// the one the plan in force was built on by more than speed_significance standard errors, and
// lasting: the steps behind its statistics span at least persistent_windows × window_s. When
// some difference is shown, every shown one is within the monitor's thresholds and the monitor
// flags no persistent straggler or leader, a plan that moves only the shown workers is proposed
// however small the shift — past hysteresis and min_replan_gain — if its gain with per-step
// noise (the expected slowest of the noisy workers) exceeds what the steps resolve and pays over
// the rest of the job (PayoffOf: saved_s > cost_s, both set on the action; the safety gate then
// admits it below min_gain). A plan equivalent to one rolled back (EquivalentUndonePlan) is
// predicted to gain what that one measured.
std::optional<Action> ProposeBatchPlan(const ClusterView& view, const History& history,
                                       const AdjustBatchConfig& cfg,
                                       const DetectionConfig* detection);

// What a batch plan is worth over the rest of the job (ProposeBatchPlan's test for a difference
// that the workers' steps show but the hysteresis would ignore). saved_s: the remaining time
// (remaining_samples / throughput) × gain / (1 + gain). cost_s: kPlanSwitchSteps steps at the
// job's step time for the switch itself (new shapes, the step at which batches change) plus the
// gain forgone during the lead (effective step − current step, in steps: the plan waits for
// lead_heartbeats). nullopt when the work left, the throughput or the step time is unknown, or
// the gain is not positive.
inline constexpr double kPlanSwitchSteps = 1;
struct PlanPayoff {
  double remaining_s = 0;
  double saved_s = 0;
  double cost_s = 0;
};
std::optional<PlanPayoff> PayoffOf(const ClusterView& view, double gain, int64_t effective_step);

// EXCLUDE_WORKERS for sync jobs: do not wait for a worker in a short burst. A worker whose
// step, at the batch it has now and its last window's speed (the freshest measure), would
// take more than 1 / straggler_threshold times the median worker's step holds every step back;
// a batch plan reaches it only after detection, persistence and the plan's lead time, usually
// when a burst is over, and then needs a second plan to undo. Dropping its gradient while it
// is slow costs its share of the global batch and nothing else (no relaunch, no lost work).
// Workers are chosen slowest first, each only if it raises the predicted throughput
// (1 − dropped share) / (slowest counted step), at most burst_exclusion.max_workers (0 turns
// the rule off); the safety gate then asks the usual min_gain of the whole set. A worker is
// waited for again once its step is back within 1 / (straggler_threshold +
// kBurstRejoinMargin) of the median — or once a batch plan has given it a share its speed can
// carry (a persistent straggler), which the same test sees. Returns up to two actions:
// re-including recovered workers (mandatory: it restores the default, waiting for everyone)
// and excluding new ones (subject to the gate). Targets name the workers, so the gate's
// per-target cooldown stops one worker flapping.
inline constexpr double kBurstRejoinMargin = 0.05;
std::vector<Action> ProposeBurstExclusions(const ClusterView& view, const History& history,
                                           const PolicyConfig& cfg);

// The EXCLUDE_WORKERS action that waits for everyone again (mandatory), when workers are
// excluded but `rule` may not exclude any more: the policy turned it off, or a live worker
// cannot carry an exclusion out (view.job.can_exclude_workers). nullopt when nobody is.
std::optional<Action> EndExclusions(const ClusterView& view, const History& history,
                                    const std::string& rule);

// REALLOCATE (async): per-worker weights ∝ speed (mean 1) and shard_scale = min(1, relative
// speed), when some weight drifted more than the hysteresis from the allocation in force;
// tail backups turned on near an epoch's end while a straggler is present, off otherwise.
std::optional<Action> ProposeReallocation(const ClusterView& view, const History& history,
                                          const ReallocateConfig& cfg);

// RESTART / MIGRATE of persistent, confident stragglers that the cost model says pay.
// Workers on a remembered bad node are migrated, never restarted in place.
std::vector<Action> ProposeRelaunches(const ClusterView& view, const History& history,
                                      const PolicyConfig& cfg);

// Restart (or relieve, when restart is off) persistent hot parameter servers.
std::vector<Action> ProposeServerActions(const ClusterView& view, const History& history,
                                         const PolicyConfig& cfg);

// Whether speed-proportional batches are in force (a plan exists and covers every live worker).
bool BatchesBalanced(const ClusterView& view, const History& history);

}  // namespace pacer
