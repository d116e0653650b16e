#include "worker_sdk/batch_plan.h"

namespace pacer {

LocalBatchPlan::LocalBatchPlan(LocalBatch initial) : current_(initial) {
  newest_version_.store(initial.version, std::memory_order_release);
}

bool LocalBatchPlan::Offer(const BatchPlanCommand& c) {
  if (c.micro_batch() == 0 || c.accumulation_steps() == 0) return false;
  absl::MutexLock l(&mu_);
  if (c.version() <= newest_version_.load(std::memory_order_relaxed)) return false;
  LocalBatch b;
  b.version = c.version();
  b.effective_step = c.effective_step();
  b.micro_batch = c.micro_batch();
  b.accumulation_steps = c.accumulation_steps();
  b.global_batch = c.global_batch();
  pending_.push_back(b);
  newest_version_.store(c.version(), std::memory_order_release);
  has_pending_.store(true, std::memory_order_release);
  return true;
}

const LocalBatch& LocalBatchPlan::ForStep(uint64_t step) {
  if (!has_pending_.load(std::memory_order_acquire)) return current_;
  absl::MutexLock l(&mu_);
  // Newest plan whose effective step has come wins; older ones it supersedes are dropped.
  size_t apply = pending_.size();
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].effective_step <= step) apply = i;
  }
  if (apply != pending_.size()) {
    current_ = pending_[apply];
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(apply) + 1);
  }
  has_pending_.store(!pending_.empty(), std::memory_order_release);
  return current_;
}

}  // namespace pacer
