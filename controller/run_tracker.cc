#include "controller/run_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pacer {

void RunTracker::Begin(const std::string& run_id, int64_t now_ms) {
  ++generation_;
  run_id_ = run_id;
  started_ms_ = now_ms;
  last_step_ = 0;
  workers_.clear();
  unconfirmed_ = 0;
  newest_heard_ms_.reset();
}

void RunTracker::Heard(Worker& w, int64_t now_ms) {
  w.last_heard_ms = now_ms;
  newest_heard_ms_ = std::max(newest_heard_ms_.value_or(now_ms), now_ms);
}

void RunTracker::SetUnconfirmed(Worker& w, bool unconfirmed) {
  if (w.unconfirmed == unconfirmed) return;
  w.unconfirmed = unconfirmed;
  if (unconfirmed) {
    ++unconfirmed_;
  } else {
    --unconfirmed_;
  }
}

std::optional<std::string> RunTracker::OnRegister(const std::string& worker,
                                                  const std::string& run_id, int64_t now_ms) {
  std::optional<std::string> why;
  if (generation_ == 0) {
    Begin(run_id, now_ms);
    why = "the first worker registered";
  } else if (!run_id.empty() && !run_id_.empty()) {
    if (run_id != run_id_) {
      why = absl::StrCat("worker '", worker, "' registered with run id '", run_id,
                         "' (the current run is '", run_id_, "')");
      Begin(run_id, now_ms);
    }
  } else {
    // Its own previous process counts: heard a moment ago, it is a restart within the run. Some
    // worker is present exactly when the one heard last is (O(1): a flood of registrations
    // must not cost a pass over every worker each).
    const bool present = newest_heard_ms_ && now_ms - *newest_heard_ms_ <= gone_after_ms_;
    if (!present) {
      why = absl::StrCat("worker '", worker, "' registered and no worker was heard from in ",
                         gone_after_ms_, " ms");
      Begin(run_id.empty() ? run_id_ : run_id, now_ms);
    }
  }
  if (run_id_.empty() && !run_id.empty()) run_id_ = run_id;
  Worker& w = workers_[worker];
  // A new process of this worker: its predecessor's step is what "going back" is judged by.
  if (w.step) w.previous_step = w.step;
  w.step.reset();
  w.went_back = false;
  // Within a run that goes on, a process replacing one that reported steps is confirmed only
  // when the run goes on around it (InRun).
  SetUnconfirmed(w, !why && w.previous_step.has_value());
  w.registered_ms = now_ms;
  Heard(w, now_ms);
  return why;
}

std::optional<std::string> RunTracker::OnStep(const std::string& worker, int64_t step,
                                              int64_t now_ms) {
  if (generation_ == 0) Begin("", now_ms);  // pacerd restarted under a running job: adopt it
  Worker& w = workers_[worker];
  Heard(w, now_ms);
  w.step = std::max(w.step.value_or(step), step);
  if (w.previous_step && step < *w.previous_step) w.went_back = true;
  if (!w.went_back) SetUnconfirmed(w, false);  // it goes on from its predecessor's step
  if (unconfirmed_ > 0 && !w.unconfirmed && !w.went_back) {
    // A process of the run stepping: the run goes on around the processes that registered
    // before this report.
    for (auto& [id, other] : workers_) {
      if (other.unconfirmed && other.registered_ms < now_ms) SetUnconfirmed(other, false);
    }
  }
  last_step_ = std::max(last_step_, *w.step);
  if (!run_id_.empty() || !w.went_back) return std::nullopt;
  for (const auto& [id, other] : workers_) {
    if (Present(other, now_ms) && !other.went_back) return std::nullopt;
  }
  const std::string why = absl::StrCat("every worker restarted and its steps went back (worker '",
                                       worker, "' at step ", step, " after ", *w.previous_step, ")");
  // The new run keeps these processes and their steps; only what came before is forgotten.
  std::map<std::string, Worker> present;
  for (auto& [id, other] : workers_) {
    if (!Present(other, now_ms)) continue;
    Worker kept;
    kept.last_heard_ms = other.last_heard_ms;
    kept.step = other.step;
    present.emplace(id, kept);
  }
  Begin("", now_ms);
  workers_ = std::move(present);
  for (auto& [id, kept] : workers_) {
    last_step_ = std::max(last_step_, kept.step.value_or(0));
    Heard(kept, kept.last_heard_ms);
  }
  return why;
}

bool RunTracker::InRun(const std::string& worker) const {
  auto it = workers_.find(worker);
  return it == workers_.end() || !it->second.unconfirmed;
}

int64_t RunTracker::CurrentStep(int64_t now_ms) const {
  std::optional<int64_t> newest;
  for (const auto& [id, w] : workers_) {
    if (w.step && Present(w, now_ms)) newest = std::max(newest.value_or(*w.step), *w.step);
  }
  return newest.value_or(last_step_);
}

}  // namespace pacer
