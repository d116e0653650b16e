// ActionSink: how the controller's executed actions are carried out.
//
// Controller::Reconcile decides; a driver carries out what it decided through an ActionSink:
//   pacerd     PacerdActionSink (cmd/pacerd/pacerd_action_sink.h): batch plans and exclusions
//              to the workers' heartbeat sessions (controller/worker_sessions.h), REALLOCATE to
//              the sharding service, RESTART / MIGRATE / server actions to the node agents;
//   simulator  the job model (sim/job_simulation.cc).
// The Reconciler (pacerd) and the simulation call Carry once per executed action, in the order
// the controller returned them; each returns the note the audit trail keeps ("plan sent in
// heartbeat replies", "no agent connected", ...). An error is a bug in the driver's glue (a
// component refused what it was built to accept), never a refusal of the action itself: those
// are notes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/action.h"

namespace pacer {

struct CarryContext {
  // The allocation in force before this action (REALLOCATE replaces it whole: a worker it
  // leaves out goes back to the default allocation).
  std::vector<WorkerAllocation> allocation_before;
};

class ActionSink {
 public:
  virtual ~ActionSink() = default;
  virtual absl::StatusOr<std::string> Carry(const Action& action, const CarryContext& context) = 0;
};

}  // namespace pacer
