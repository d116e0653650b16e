// StepTimer: per-step time split into data wait, communication and compute (docs/design.md §3).
//
// The monitor needs compute time, not wall time: in synchronous all-reduce every worker's wall
// step equals the slowest one's. The trainer brackets input waits and collective / PS calls
// with Time(Phase::kDataWait) / Time(Phase::kCommunication) (RAII scopes); compute is the rest
// of the step (wall - communication - data wait). EndStep() builds the StepReport and queues it
// on the Client (a lock and a vector push; the Client's reporter thread sends it batched).
//
// Thread-compatible: one StepTimer per training thread. Reads time through an injected Clock.
#pragma once

#include <cstdint>

#include "common/clock.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

class Client;

class StepTimer {
 public:
  enum class Phase { kDataWait = 0, kCommunication = 1 };

  class Scope {
   public:
    Scope(StepTimer* timer, Phase phase)
        : timer_(timer), phase_(phase), start_ns_(timer->clock_->MonotonicNs()) {
      timer_->PhaseOpened(start_ns_);
    }
    ~Scope() {
      timer_->phase_ns_[static_cast<int>(phase_)] += timer_->clock_->MonotonicNs() - start_ns_;
      timer_->PhaseClosed();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepTimer* timer_;
    Phase phase_;
    int64_t start_ns_;
  };

  // `client` may be null (reports are then only returned). `clock` must outlive the timer.
  explicit StepTimer(Client* client, const Clock* clock = RealClock::Get());

  // Begins `step`. `samples` > 0: what it will compute; the heartbeats sent while it runs then
  // say how long it has computed so far (Client::NoteStepBegun; pacerd's burst rule sees a
  // worker in a burst before its slow step ends). Pass it only when the step's data waits and
  // collective calls are timed with Time() scopes as they happen: a phase added afterwards
  // (Add) would count the wait for other workers as this worker's compute. 0: only finished
  // steps are reported.
  void BeginStep(uint64_t step, uint64_t samples = 0);
  [[nodiscard]] Scope Time(Phase phase) { return Scope(this, phase); }
  void Add(Phase phase, int64_t ns) {
    phase_ns_[static_cast<int>(phase)] += ns;
    PhaseClosed();
  }
  // Ends the step begun last; `local_batch` is the planned micro batch, `samples` the samples
  // actually processed (micro batches x accumulation). Queues the report on the client.
  StepReport EndStep(uint32_t local_batch, uint64_t samples);

  // Compute seconds of the running step so far: its wall time since BeginStep less its timed
  // phases. Call it between phases, not inside a Time() scope.
  double ComputeSoFarS() const;
  // The running step (begun with `samples` > 0) has computed `samples_done` of them so far:
  // the heartbeats sent until the next call carry them with the compute time taken until now
  // (HeartbeatStepTiming.samples_done / done_compute_s), so pacerd's monitor measures a slowed
  // worker's speed within its slow step instead of only bounding it. A trainer calls it between
  // micro-batches, or between slices of one (cheap: one clock read and an uncontended lock).
  // Call it between phases, not inside a Time() scope.
  void NoteProgress(uint64_t samples_done);
  // Whether the running step has computed past the step line pacerd handed this worker
  // (Client::step_line_s; false without a client or a line): the step is a burst's. Cheap (one
  // clock read and an atomic): a trainer asks between micro-batches, or between slices of one,
  // and on true calls Client::ReportStepPastLine once for the step (worker_sdk/README.md, "The
  // step line").
  bool PastStepLine() const;

 private:
  // The running step's phases, for the client's heartbeat (no-ops without a client).
  void PhaseOpened(int64_t open_ns);
  void PhaseClosed();

  Client* client_;
  const Clock* clock_;
  uint64_t step_ = 0;
  int64_t begin_ns_ = 0;
  int64_t phase_ns_[2] = {0, 0};
};

}  // namespace pacer
