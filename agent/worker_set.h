// WorkerSet: the worker processes a NodeAgent reports on and acts on, whoever started them.
//
// Two implementations:
//   WorkerSupervisor  (worker_supervisor.h)  the agent forks the workers (`pacer-agent -- CMD`,
//                     the torchrun pattern; also a trainer container's entrypoint on Kubernetes)
//   ProcessAttacher   (process_attacher.h)   the agent finds a process it did NOT start, by its
//                     command line (`pacer-agent --attach PATTERN`: a sidecar sharing the pod's
//                     process namespace), and acts on it by signal
// NodeAgent talks only to this interface, so heartbeats, commands and metrics are the same
// code in both forms.
//
// Thread-safety: none; every method runs on the agent's event-loop thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/pacer/agent.pb.h"

namespace pacer {

class WorkerSet {
 public:
  using Done = std::function<void(absl::Status)>;
  virtual ~WorkerSet() = default;

  // Starts (or starts looking for) every worker.
  virtual void StartAll() = 0;
  // Returns true when `pid` was one of the workers (and handles its exit). Only children of
  // the agent are reaped; an attached process never comes through here.
  virtual bool OnChildExit(pid_t pid, int wait_status) = 0;
  // Restart / stop one worker, or stop all; `done` runs once on the loop when it is over
  // (with an error when it could not be done). NOT_FOUND for an unknown worker.
  virtual absl::Status Restart(const std::string& worker_id, Done done) = 0;
  virtual absl::Status Stop(const std::string& worker_id, Done done) = 0;
  virtual void StopAll(Done done) = 0;

  virtual bool Has(const std::string& worker_id) const = 0;
  virtual pid_t Pid(const std::string& worker_id) const = 0;  // 0 when none runs
  virtual std::vector<std::string> WorkerIds() const = 0;
  // True when no worker runs or will run again and the agent should leave (see each class).
  virtual bool AllFinished() const = 0;
  virtual bool AnyFailed() const = 0;
  virtual const std::string& FailureReason() const = 0;

  virtual void SetCpuCores(const std::string& worker_id, double cores) = 0;
  virtual void SetContentionFactor(const std::string& worker_id, double factor) = 0;
  virtual std::vector<WorkerProcess> Snapshot() const = 0;
};

}  // namespace pacer
