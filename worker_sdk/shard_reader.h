// ShardReader: the records of a dataset, read through leases of the sharding service
// (docs/design.md §2, §6).
//
// Keeps up to `prefetch_leases` leases ready beyond the one being read, so the next shard is
// leased before the current one ends and training never waits on the control plane (it waits
// only when the service has nothing to hand out). Leases list their record ids as ranges in
// delivery order; Next() hands them out in that order, across lease boundaries.
//
// Leasing (one durable call per shard): the reader aims to hold 1 + prefetch_leases leases
// (open, ready, or being leased). When MarkConsumed() completes a lease and the reader wants
// another, the completion itself leases the next shard (Client::EnqueueCompletionAndFetch:
// CompleteShard with next_dataset, one group commit on pacerd instead of two) and the answer
// lands in the ready queue (OnNextLease). A lease read to its end counts toward the target
// until MarkConsumed() completes it, so the reader does not fetch for it on its own. Its prefetch
// thread fetches alone (FetchShard) only to fill the target otherwise (at the start, after WAIT,
// when a combined completion leased nothing), and when Next() finds nothing to return while no
// lease is on its way (a trainer reading ahead without marking consumed: waiting for those
// completions would never end).
//
// Progress protocol (exactly once, with the service's guarantees):
//   1. Next(n) hands out record ids; they are *in training*, not done.
//   2. MarkConsumed() declares every record handed out so far trained: for each lease touched
//      it queues the absolute done prefix on the Client (or the completion, when the lease is
//      exhausted). The Client's reporter sends them batched with the heartbeat.
//   3. pacerd acknowledges; only then are those records counted. A worker killed before the
//      acknowledgement is resolved at restart from the registration's previous_leases.
// A lease cancelled by pacerd (expired, fenced by a backup partner, a checkpoint restore) is
// dropped at the next Next(): its unconsumed suffix belongs to another worker now.
//
// Checkpoints: SaveCheckpoint(tag) flushes this worker's reports and pins the job's data
// position on pacerd (call it on the chief after every worker has flushed, e.g. after a
// barrier); RestoreCheckpoint(tag) moves the job back to it and drops local leases.
//
// Leases the reader drops without reading them to the end (a restore, its destruction, a next
// lease that arrives during a restore) are forgotten on the ShardingClient, so the heartbeat no
// longer lists them and pacerd releases them at their done prefix for other workers.
//
// Thread-safety: Next, MarkConsumed, Save/RestoreCheckpoint from one training thread. The
// prefetch thread and the Client's reporter thread synchronise through q_mu_ and cancel_mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/pacer/sharding.pb.h"
#include "worker_sdk/client.h"

namespace pacer {

struct ShardReaderOptions {
  std::string dataset = "train";
  int prefetch_leases = 1;  // leases kept ready beyond the current one (the service allows 4)
  // Hooks for an exactly-once ledger (examples/consumer/ledger.h); run on the training thread.
  std::function<void(const Lease&)> on_lease;                  // a lease is first read from
  std::function<void(uint64_t lease, uint64_t prefix)> on_report;  // before a report is queued
};

class ShardReader : public ReportListener {
 public:
  enum class Outcome { kRecords, kWait, kEndOfData };
  // How long Next() may block when no record is ready:
  //   kNever:           return at once (kWait when nothing is ready);
  //   kUntilPrefetched: wait for a fetch in flight (or a completion leasing the next shard),
  //                     but not when the service's newest answer is WAIT and nothing is on its
  //                     way (the other workers hold the rest of the epoch). Synchronous all-reduce
  //                     trainers use this and contribute weight 0 on kWait, so that nobody
  //                     blocks a collective waiting for data a peer holds;
  //   kUntilData:       wait until records come or the data ends (independent workers) — but
  //                     never on the reader itself: when every record it handed out is still
  //                     unconsumed and the service answers WAIT (the rest of the data is in
  //                     those leases, or they fill the worker's lease quota), it returns kWait:
  //                     MarkConsumed() and call again.
  // Between ReleaseAll() and Resume() it returns kWait at once (nothing is leased).
  enum class Blocking { kNever, kUntilPrefetched, kUntilData };

  // `client` must outlive the reader. Destroy the reader after Client::Close() (which cancels
  // the client's retries); otherwise a fetch retrying an unreachable pacerd delays it.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Create(Client* client,
                                                             ShardReaderOptions options);
  ~ShardReader() override;

  // Appends up to `n` record ids to `ids` and returns kRecords when it appended any, else kWait
  // or kEndOfData. kUntilData waits only while it has nothing to return (a batch is short when
  // the leased records in hand run out: the next lease may need these consumed first);
  // kUntilPrefetched waits for the prefetcher until the service says WAIT. Errors: the service refused permanently (unknown dataset, failed dataset,
  // lost worker). With `epochs`, appends the epoch of each id appended to `ids` (the epoch of
  // its lease: without an epoch barrier one call may cross from one epoch into the next, so an
  // id can come twice, once per epoch).
  absl::StatusOr<Outcome> Next(size_t n, std::vector<uint64_t>* ids,
                               Blocking blocking = Blocking::kUntilData,
                               std::vector<uint32_t>* epochs = nullptr);
  // Queues progress for every record handed out so far (see the protocol above).
  void MarkConsumed();
  // Queues progress for the records handed out at positions below `position`, where the n-th
  // record Next() ever handed out has position n - 1 (records_read() after a Next() is the
  // position just past its batch). For trainers that read ahead (a loader prefetching batches):
  // only what was trained is declared. Records of a lease dropped meanwhile (cancelled by pacerd)
  // keep their positions, so the later leases' positions do not shift.
  void MarkConsumedThrough(uint64_t position);
  absl::Status SaveCheckpoint(const std::string& tag, int64_t flush_timeout_ms = 30'000);
  absl::Status RestoreCheckpoint(const std::string& tag);

  // Hands every lease this reader holds back to the service and stops leasing until Resume():
  // what an excluded worker does (Client::excluded()), so that a long exclusion does not hold
  // an epoch's end. Call it only when every record handed out so far is trained: it marks them
  // consumed, waits until pacerd acknowledged every queued report (Client::Flush), then
  // releases the current and the prefetched leases at their done prefix (the rest goes back to
  // the front of the queue for other workers). Idempotent; returns how many leases it released.
  // On an error (pacerd unreachable past `timeout_ms`) the leases not yet released stay held
  // and leasing stays stopped: call it again at the next step.
  // `trained_through`: only the records handed out at positions below it were trained (as
  // MarkConsumedThrough); those handed out from there on -- a step abandoned at the step line
  // (Client::ReportStepPastLine), a loader's read-ahead -- go back uncounted with the rest.
  // The default: every record handed out so far.
  static constexpr uint64_t kAllHandedOut = ~uint64_t{0};
  absl::StatusOr<int> ReleaseAll(int64_t timeout_ms = 10'000, uint64_t trained_through = kAllHandedOut);
  // Leasing goes on (after ReleaseAll).
  void Resume();
  // After the service said WAIT: the next Next() asks it again at once instead of after the
  // WAIT's retry delay (a trainer that has just sent its completions, or that learnt that
  // the other ranks' data ended, finds the end of the data one round trip later). No-op
  // otherwise.
  void RetryNow();
  bool holding_off() const;

  uint64_t records_read() const { return records_read_; }
  // Records this reader holds leased but has not handed out yet (the rest of the open leases
  // and the prefetched ones): what ReleaseAll() would give back. Training thread.
  uint64_t records_held() const;
  uint64_t leases_read() const { return leases_read_; }
  // After kEndOfData: records of the dataset quarantined as poison (on_poison: continue) and so
  // never trained on; 0 when the data ended without a hole.
  uint64_t records_quarantined() const;

  // ReportListener (reporter thread).
  void OnLeaseCancelled(uint64_t lease_id) override;
  void OnNextLease(uint64_t completed_lease_id,
                   const absl::StatusOr<FetchShardResponse>& next) override;

 private:
  struct OpenLease {
    Lease lease;
    uint64_t total = 0;     // records in the lease
    uint64_t handed = 0;    // prefix handed out by Next
    uint64_t reported = 0;  // prefix queued as done
    uint64_t first_handed = 0;    // done prefix when the lease was taken (skipped)
    uint64_t first_position = 0;  // records_read_ when it was taken: position of record first_handed
    size_t range = 0;       // cursor: index into lease.records and offset within it
    uint64_t offset = 0;
    bool cancelled = false;
  };

  ShardReader(Client* client, ShardReaderOptions options);
  void PrefetchLoop();
  // Moves a ready lease into open_ (training thread). Returns false when none is ready.
  bool TakeReady();
  void DropCancelled();
  // Leases held toward the target of 1 + prefetch_leases: ready, being leased, and open ones.
  size_t Held() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_);
  bool LeasingOn() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_);  // not stopped, paused, holding off, ended, failed
  // A completion should lease the next shard: leasing is on and Held() is under the target.
  bool WantLease() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_);
  // The prefetch thread should fetch alone: WantLease(), or Next() starves and nothing is on
  // its way (the open leases wait for a MarkConsumed the trainer may call only later).
  bool WantFetch() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_);
  // A fetch or a completion that leases the next shard is in flight: its answer is newer than
  // the last WAIT.
  bool LeaseOnItsWay() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_);
  // Takes in what leasing answered (a fetch or a combined completion).
  void Accept(const FetchShardResponse& resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_mu_);
  void SyncOpenCount();  // training thread: open_count_ = open_.size()

  Client* const client_;
  const ShardReaderOptions options_;

  // Training thread only.
  std::deque<OpenLease> open_;  // front: being read; earlier ones await MarkConsumed
  uint64_t records_read_ = 0;
  uint64_t leases_read_ = 0;
  uint64_t seen_cancel_generation_ = 0;

  mutable absl::Mutex q_mu_;
  absl::CondVar q_cv_;
  std::deque<Lease> ready_ ABSL_GUARDED_BY(q_mu_);
  bool end_of_data_ ABSL_GUARDED_BY(q_mu_) = false;
  bool service_waiting_ ABSL_GUARDED_BY(q_mu_) = false;  // the last fetch said WAIT
  uint64_t wait_answers_ ABSL_GUARDED_BY(q_mu_) = 0;  // WAIT answers so far (fetches, completions)
  bool stopping_ ABSL_GUARDED_BY(q_mu_) = false;
  bool paused_ ABSL_GUARDED_BY(q_mu_) = false;  // during a checkpoint restore
  bool holding_off_ ABSL_GUARDED_BY(q_mu_) = false;  // between ReleaseAll and Resume
  bool fetching_ ABSL_GUARDED_BY(q_mu_) = false;  // a Fetch is in flight
  bool starving_ ABSL_GUARDED_BY(q_mu_) = false;  // Next() found nothing to return
  bool no_combined_ ABSL_GUARDED_BY(q_mu_) = false;  // pacerd does not lease in CompleteShard
  size_t open_count_ ABSL_GUARDED_BY(q_mu_) = 0;  // open_.size(), as the prefetcher sees it
  int next_pending_ ABSL_GUARDED_BY(q_mu_) = 0;  // completions queued to lease the next shard
  uint64_t records_quarantined_ ABSL_GUARDED_BY(q_mu_) = 0;  // from END_OF_DATA
  std::chrono::steady_clock::time_point not_before_ ABSL_GUARDED_BY(q_mu_);  // no fetch before (WAIT)
  absl::Status error_ ABSL_GUARDED_BY(q_mu_);

  absl::Mutex cancel_mu_;
  std::set<uint64_t> cancelled_ ABSL_GUARDED_BY(cancel_mu_);
  std::atomic<uint64_t> cancel_generation_{0};

  std::thread prefetch_;
};

}  // namespace pacer
