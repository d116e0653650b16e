// HeartbeatReplyBuilder: assembles the commands of every heartbeat reply pacerd sends.
//
// The sharding service answers a worker's Heartbeat with its lease part (cancelled leases,
// released unknown leases, the lease deadline) and then asks this builder for the commands
// (ShardingServiceImpl::SetHeartbeatCommands). In order:
//   1. the reconciler notes the worker's step (a new run begins here: the old plan is withdrawn
//      before any command is assembled) and says whether the worker's process is known to be
//      of the current run (controller/run_tracker.h: a new process is not until the run goes on
//      around it);
//   2. the controller's commands, from the worker's session (controller/worker_sessions.h): the
//      batch plan (held back from a process not known to be of the run) and the exclusion the
//      worker does not hold yet, each with its reason;
//   3. the rendezvous store's regroup command, when the collective group re-formed under a
//      generation the worker does not hold (rendezvous/rendezvous_service.h).
// Every command is re-sent until the worker's heartbeat says it holds its version, so a lost
// reply only delays it.
#pragma once

#include "controller/reconciler.h"
#include "controller/worker_sessions.h"
#include "rendezvous/rendezvous_service.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

class HeartbeatReplyBuilder : public HeartbeatCommandSource {
 public:
  HeartbeatReplyBuilder(Reconciler* reconciler, WorkerSessions* sessions,
                        RendezvousServiceImpl* rendezvous)
      : reconciler_(reconciler), sessions_(sessions), rendezvous_(rendezvous) {}

  void AddCommands(const HeartbeatRequest& req, HeartbeatResponse* resp) override {
    const bool in_run = reconciler_->OnHeartbeat(req);
    sessions_->OnHeartbeat(req, resp, reconciler_->NowMs(), /*hold_plan=*/!in_run);
    rendezvous_->OnHeartbeat(req, resp);
  }

 private:
  Reconciler* reconciler_;
  WorkerSessions* sessions_;
  RendezvousServiceImpl* rendezvous_;
};

}  // namespace pacer
