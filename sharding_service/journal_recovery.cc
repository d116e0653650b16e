// ShardingServiceImpl::RecoverJournal: resuming after a failed journal write (a full disk).
// Kept apart from sharding_service.cc (the request handlers): it is the one place that swaps
// the whole state.
#include <algorithm>

#include "common/log.h"
#include "common/status.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

absl::Status ShardingServiceImpl::RecoverJournal() {
  absl::MutexLock l(&mu_);
  if (journal_->health().ok()) return absl::OkStatus();
  // Under mu_ nothing is appended, so the journal can drop its queue and reopen. What the
  // memory holds beyond the durable seq was applied but never acknowledged: rebuilt by replay,
  // exactly as at a restart.
  StateReplay replay;
  absl::Status s = journal_->Recover(replay.OnSnapshot(), replay.OnUpdate(), replay.OnPinned());
  if (!s.ok()) return s;
  ShardingState& state = replay.state;
  const uint64_t replayed = replay.replayed;
  const uint64_t dropped = state_.last_seq() - std::min(state_.last_seq(), state.last_seq());
  state_ = std::move(state);
  state_.TakeCancelledLeases();  // history: nobody to notify
  last_snapshot_seq_ = state_.last_seq() - replayed;
  cancelled_.clear();  // may name leases whose ending was never written
  pending_.clear();    // (empty: every request appends before it lets go of mu_)
  const int64_t now = clock_->NowMs();
  for (const auto& [id, w] : state_.workers()) last_seen_ms_[id] = now;  // a grace, as at a restart
  UpdateGauges();
  PACER_LOG(WARNING) << "sharding: journal recovered at seq " << state_.last_seq() << "; "
                     << dropped << " unacknowledged update(s) applied in memory were discarded";
  return absl::OkStatus();
}

}  // namespace pacer
