// What the Reconciler reads from the rest of pacerd, as three small interfaces.
//
// The controller stands beside the services it steers, not above them: it includes none of
// them. pacerd adapts its monitor, sharding service and agent registry to these
// (cmd/pacerd/reconciler_sources.h); a test or another embedder can give its own.
//
//   SpeedSource    the monitor: every worker's, node's and server's status over the window
//   LeaseSource    the sharding service: datasets' progress and the leases workers hold
//   RestartSource  the node agents: which workers' processes are being relaunched now
//
// Each is called outside the Reconciler's lock and must be thread-safe.
#pragma once

#include <set>
#include <string>

#include "absl/status/status.h"
#include "common/lease_facts.h"
#include "proto/pacer/monitor.pb.h"
#include "proto/pacer/sharding.pb.h"

namespace pacer {

class SpeedSource {
 public:
  virtual ~SpeedSource() = default;
  // The monitor's view now (ListWorkers): workers, nodes, servers and the window.
  virtual absl::Status ListWorkers(ListWorkersResponse* out) = 0;
  // A new run of the job began: the last run's step history no longer describes the workers.
  virtual void ForgetWorkerHistories() = 0;
};

class LeaseSource {
 public:
  virtual ~LeaseSource() = default;
  // Every dataset with its progress (ListDatasets).
  virtual absl::Status ListDatasets(ListDatasetsResponse* out) = 0;
  virtual LeaseFacts WorkerLeaseFacts() = 0;
};

class RestartSource {
 public:
  virtual ~RestartSource() = default;
  // Workers whose process a live agent is relaunching now (backing off or stopping).
  virtual std::set<std::string> RestartingWorkers() = 0;
};

}  // namespace pacer
