// WorkerSessions: the controller's side of every worker's heartbeat session in pacerd.
//
// A heartbeat reply carries two kinds of content. The lease part (cancelled leases, leases
// released because their fetch reply was lost, the lease deadline) is the sharding service's
// (sharding_service.h). The commands are the control plane's, and they are assembled here and
// only here (pacerd's WorkerSessionService adds the rendezvous' regroup command after these):
//
//   command      sent while                                   WorkerCommand.reason
//   batch_plan   the worker holds an older plan version      the deciding action's reason
//                (HeartbeatRequest.plan_version)
//   exclusion    the worker honours exclusion and holds an   the deciding action's reason
//                older exclusion version
//
// It also records what each worker says about itself in its heartbeats (whether its trainer
// honours exclusion, its memory cap), which the view builder needs (WorkerFacts).
//
// A command is idempotent: it is re-sent in every reply until the worker reports holding its
// version, so a lost reply only delays it. Versions only grow (plans: above every version
// issued in any run; exclusions: the deciding audit id).
//
// Thread-safe (one mutex); the reply path takes it briefly and never calls out.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/batch_plan.h"
#include "proto/pacer/sharding.pb.h"

namespace pacer {

class WorkerSessions {
 public:
  // Every worker in `plan` gets its BatchPlanCommand from now on (replacing the one before).
  void SetPlan(const BatchPlan& plan, const std::string& reason);
  // A new run began: no plan command of the old run is sent again.
  void WithdrawPlans();
  // The exclusion in force from now on: `version` (the deciding audit id) and who is excluded.
  void SetExclusion(uint64_t version, std::set<std::string> excluded, const std::string& reason);

  // Records what the worker said and adds the commands it does not hold yet to `resp`.
  // `now_ms` is when the reply leaves (ProbeStep). `hold_plan`: no batch plan command in this
  // reply (the worker's process is not known to be of the run the plan was made for).
  void OnHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp, int64_t now_ms = 0,
                   bool hold_plan = false);

  struct Reported {
    bool honors_exclusion = false;
    int64_t max_local_batch = 0;
  };
  // What each worker last said about itself (by worker id).
  std::map<std::string, Reported> Reports() const;

  // Whether the worker is excluded as it knows it: the last exclusion command a reply carried
  // to it, once a heartbeat shows it holds that version (false before any, and for a process
  // that holds none).
  bool HoldsExclusion(const std::string& worker) const;
  // Whether the worker's step that started at `start_ms` was an excluded worker's probe: it
  // started after a reply carried it an exclusion (the newest exclusion command sent at or
  // before then says); a step that began before the command reached it trains. Without a
  // start (0) or a command sent in this pacerd's life (a restart): HoldsExclusion.
  bool ProbeStep(const std::string& worker, int64_t start_ms) const;

  // The samples a step of each worker the plans in force name (by worker id): what pacerd's
  // sharding service shares an epoch's end by (cmd/pacerd/reconciler_sources.h,
  // PlannedFetchRates). Empty before any plan and after WithdrawPlans. A new map each time the
  // plans change, so a reader can tell a change by the pointer.
  std::shared_ptr<const std::map<std::string, double>> PlannedSamples() const;

  // The plan command a worker would get now; the exclusion in force (tests, pacerctl).
  std::optional<BatchPlanCommand> PlanFor(const std::string& worker) const;
  std::pair<uint64_t, std::vector<std::string>> Exclusion() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, BatchPlanCommand> plans_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::map<std::string, double>> planned_samples_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const std::map<std::string, double>>();
  std::string plan_reason_ ABSL_GUARDED_BY(mu_);
  std::string exclusion_reason_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> excluded_ ABSL_GUARDED_BY(mu_);
  uint64_t exclusion_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Reported> reported_ ABSL_GUARDED_BY(mu_);
  // Per worker: the exclusion commands replies carried to it, newest last (at most
  // kSentKept), and whether it holds an exclusion (HoldsExclusion).
  struct SentExclusion {
    uint64_t version = 0;
    bool excluded = false;
    int64_t sent_ms = 0;
  };
  static constexpr size_t kSentKept = 4;
  std::map<std::string, std::vector<SentExclusion>> exclusion_sent_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> holds_exclusion_ ABSL_GUARDED_BY(mu_);
};

// The command one worker gets for its part of `plan`.
BatchPlanCommand PlanCommandFor(const BatchPlan& plan, const WorkerBatch& worker);

}  // namespace pacer
