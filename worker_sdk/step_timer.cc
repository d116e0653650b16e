#include "worker_sdk/step_timer.h"

#include <algorithm>

#include "worker_sdk/client.h"

namespace pacer {

StepTimer::StepTimer(Client* client, const Clock* clock) : client_(client), clock_(clock) {}

void StepTimer::BeginStep(uint64_t step, uint64_t samples) {
  step_ = step;
  phase_ns_[0] = phase_ns_[1] = 0;
  begin_ns_ = clock_->MonotonicNs();
  if (client_ != nullptr) client_->NoteStepBegun(clock_, step, begin_ns_, samples);
}

void StepTimer::PhaseOpened(int64_t open_ns) {
  if (client_ != nullptr) client_->NoteStepPhase(phase_ns_[0] + phase_ns_[1], open_ns);
}

void StepTimer::PhaseClosed() {
  if (client_ != nullptr) client_->NoteStepPhase(phase_ns_[0] + phase_ns_[1], 0);
}

StepReport StepTimer::EndStep(uint32_t local_batch, uint64_t samples) {
  const int64_t wall_ns = clock_->MonotonicNs() - begin_ns_;
  const int64_t data_ns = phase_ns_[static_cast<int>(Phase::kDataWait)];
  const int64_t comm_ns = phase_ns_[static_cast<int>(Phase::kCommunication)];
  StepReport r;
  r.set_step(step_);
  r.set_local_batch(local_batch);
  r.set_samples(samples);
  r.set_wall_s(static_cast<double>(wall_ns) / 1e9);
  r.set_data_wait_s(static_cast<double>(data_ns) / 1e9);
  r.set_comm_s(static_cast<double>(comm_ns) / 1e9);
  r.set_compute_s(static_cast<double>(std::max<int64_t>(0, wall_ns - data_ns - comm_ns)) / 1e9);
  r.set_time_ms(clock_->NowMs());
  if (client_ != nullptr) {
    client_->EnqueueStep(r);
    client_->NoteStepEnded();
  }
  return r;
}

double StepTimer::ComputeSoFarS() const {
  const int64_t ns = clock_->MonotonicNs() - begin_ns_ - phase_ns_[0] - phase_ns_[1];
  return static_cast<double>(std::max<int64_t>(0, ns)) / 1e9;
}

void StepTimer::NoteProgress(uint64_t samples_done) {
  if (client_ == nullptr) return;
  const int64_t ns = clock_->MonotonicNs() - begin_ns_ - phase_ns_[0] - phase_ns_[1];
  client_->NoteStepProgress(samples_done, std::max<int64_t>(0, ns));
}

bool StepTimer::PastStepLine() const {
  if (client_ == nullptr) return false;
  const double line = client_->step_line_s();
  return line > 0 && ComputeSoFarS() > line;
}

}  // namespace pacer
