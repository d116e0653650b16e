// ShardingServiceImpl: the service layer of the sharding service (docs/design.md §2).
//
// Between the thin gRPC adapter (grpc_sharding_service.h) and the pure ShardingState. For each
// request it: authenticates nothing (the adapter did), validates against the state under mu_,
// turns the request into an Update, applies it and queues it in the journal (still under mu_,
// so journal order == apply order), releases mu_, and replies once the update is durable
// (ShardingJournal::WhenDurable). Requests that change nothing still wait for the latest update to be
// durable, so no reply reveals state a crash could take back.
//
// Soft state kept here, not journaled: when each worker was last heard from. A worker silent
// for lease_timeout loses its leases (EXPIRED, unconsumed suffix requeued); silent for
// worker_timeout it is declared lost. After a restart every worker gets a fresh grace period.
//
// Thread-safe; every method may be called concurrently. Callbacks (`done`) run on the journal's
// thread that acknowledges a group (journal/rocks_log.h) or inline, never under mu_.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/identity_rules.h"
#include "common/lease_facts.h"
#include "common/metrics.h"
#include "common/recent_durations.h"
#include "sharding_service/sharding_api.h"
#include "sharding_service/sharding_metrics.h"
#include "proto/pacer/sharding.pb.h"
#include "journal/typed_journal.h"
#include "sharding_service/sharding_state.h"

namespace pacer {

// The sharding core's journal: its updates (Update) and snapshots (ShardingSnapshot) through
// the one generic journal of pacerd's state machines (journal/durable_log.h: the interface, its
// group-commit protocol and recovery guarantees; journal/typed_journal.h: the typed view;
// journal/rocks_log.h: the RocksDB implementation). The controller journals through the same
// classes (controller/controller_store.h).
// Formats ("m:format"; the layout: journal/rocks_log.h):
//   v2, v3: the journal before pinned entries (a v3 binary must not read a v4 dir, whose
//           snapshots name specs it cannot find);
//   v4:     pinned dataset specs ("specs apart");
//   v5:     as v4, with DeleteDatasetUpdate / ResetDatasetUpdate (a v4 build would not know them).
// v2..v4 dirs are read and upgraded to v5 with the first group this binary writes.
inline constexpr char kJournalFormatV2[] = "pacer-journal-v2";
inline constexpr char kJournalFormatV3[] = "pacer-journal-v3";
inline constexpr char kJournalFormatV4[] = "pacer-journal-v4";
inline constexpr char kJournalFormatV5[] = "pacer-journal-v5";  // written

inline JournalFormat ShardingJournalFormat() {
  return {kJournalFormatV5, {kJournalFormatV2, kJournalFormatV3, kJournalFormatV4}};
}

template <>
struct JournalFormatOf<Update> {
  static JournalFormat Get() { return ShardingJournalFormat(); }
};

using ShardingJournal = TypedJournal<Update, ShardingSnapshot>;

struct ShardingServiceOptions {
  std::string data_dir;                 // RocksDB journal lives here
  int64_t lease_timeout_ms = 30'000;    // silent worker -> its leases expire
  int64_t worker_timeout_ms = 60'000;   // silent worker -> declared lost
  int64_t heartbeat_interval_ms = 1'000;
  uint64_t snapshot_every = 10'000;     // updates between snapshots
  bool sync = true;                     // fsync the journal (always, outside benchmarks)
  // Quotas (RESOURCE_EXHAUSTED past them; docs/security.md): datasets registered, files over
  // every dataset, workers registered. The defaults are the hard limits of sharding_state.h;
  // lower them for a smaller pacerd.
  size_t max_datasets = kMaxDatasets;
  uint64_t max_files_total = kMaxFilesTotal;
  size_t max_workers = kMaxWorkers;
  // Bytes every dataset's spec and partitions hold (ShardingState::HeldBytes), over every dataset.
  uint64_t max_dataset_bytes = kDefaultMaxDatasetBytes;
  // The journal's other settings (high-water mark, must_exist, accept_data_loss, an injected
  // file system); its dir and sync are data_dir and sync above.
  JournalOptions journal;
};

struct ShardingServiceStats {
  uint64_t updates = 0;
  double recovery_seconds = 0;
  uint64_t recovered_updates = 0;  // replayed from the journal tail
  JournalStats journal;
};

class ShardingServiceImpl final : public ShardingApi {
 public:

  static absl::StatusOr<std::unique_ptr<ShardingServiceImpl>> Open(
      const ShardingServiceOptions& options, const Clock* clock, MetricsRegistry* metrics);
  ~ShardingServiceImpl();

  void RegisterDataset(const RegisterDatasetRequest& req, RegisterDatasetResponse* resp, Done done) override;
  void RegisterWorker(const RegisterWorkerRequest& req, RegisterWorkerResponse* resp, Done done) override;
  void FetchShard(const FetchShardRequest& req, FetchShardResponse* resp, Done done) override;
  void ReportProgress(const ProgressRequest& req, ProgressResponse* resp, Done done) override;
  void CompleteShard(const CompleteShardRequest& req, CompleteShardResponse* resp, Done done) override;
  void ReleaseShard(const ReleaseShardRequest& req, ReleaseShardResponse* resp, Done done) override;
  void Heartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp, Done done) override;
  void SaveCheckpoint(const CheckpointRequest& req, CheckpointResponse* resp, Done done) override;
  void RestoreCheckpoint(const CheckpointRequest& req, CheckpointResponse* resp, Done done) override;
  void ListDatasets(const ListDatasetsRequest& req, ListDatasetsResponse* resp, Done done) override;
  void SetAllocation(const SetAllocationRequest& req, SetAllocationResponse* resp, Done done) override;
  void SetTailBackup(const SetTailBackupRequest& req, SetTailBackupResponse* resp, Done done) override;
  // Operator acts (admin role): delete a dataset, or start it over at epoch 0 (same spec).
  // NOT_FOUND naming the dataset when it is unknown. Holders of its leases see them cancelled
  // in their next heartbeat; their reports are refused, a fetch of a deleted dataset is
  // NOT_FOUND. pacerd audits each success (cmd/pacerd/worker_session_service.h).
  void DeleteDataset(const DeleteDatasetRequest& req, DeleteDatasetResponse* resp, Done done) override;
  void ResetDataset(const ResetDatasetRequest& req, ResetDatasetResponse* resp, Done done) override;

  // Heartbeat, RegisterWorker and the two operator acts in two halves, for a caller that acts
  // between them (pacerd's worker-session service: the control plane's commands, a new run, the
  // audit trail).
  // Apply* validates the request and applies it under the lock, filling the sharding part of the
  // reply -- for a heartbeat the lease part: cancelled leases, leases released because their
  // fetch reply was lost, the lease deadline -- and hands its updates to the journal. It returns
  // the update to wait for, or the refusal; AnswerWhenDurable answers `done` once that update
  // is durable (at once with a refusal). Heartbeat() and the others are the two in a row.
  using Applied = absl::StatusOr<uint64_t>;
  Applied ApplyHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp);
  Applied ApplyRegisterWorker(const RegisterWorkerRequest& req, RegisterWorkerResponse* resp);
  Applied ApplyDeleteDataset(const DeleteDatasetRequest& req, DeleteDatasetResponse* resp);
  Applied ApplyResetDataset(const ResetDatasetRequest& req, ResetDatasetResponse* resp);
  void AnswerWhenDurable(Applied applied, Done done);

  // Where the batch plan in force comes from (pacerd: its WorkerSessions): near an epoch's end
  // a fetch shares the records left by each worker's planned records a step when the plan
  // names every consumer (ShardingState::EvenEndSize), by weight otherwise. Called under the
  // service's lock, so it must not call back into the service. Soft state, never journaled:
  // each lease's decided range is. nullptr (the default): shares by weight.
  using FetchRatesSource = std::function<std::shared_ptr<const FetchRates>()>;
  void SetFetchRatesSource(FetchRatesSource source);

  // Expires leases and workers past their deadlines (call periodically). Returns how many
  // leases expired.
  int ExpireOverdue();
  // The worker's process is gone and nothing will restart it (its agent gave up on it, past
  // its restart limit): the worker is lost now rather than at worker_timeout_ms, and its
  // leases end now rather than at lease_timeout_ms — their unconsumed records go back to the
  // queue, through the same journaled WorkerLostUpdate as for a silent worker. Only once the
  // worker was silent for two heartbeat intervals: a process of it heard from since (started
  // elsewhere) is alive, and nullopt says to ask again later. Returns how many leases ended (0:
  // unknown, lost already, or holding none — a worker that finished is not declared lost).
  std::optional<int> LoseGoneWorker(const std::string& worker, const std::string& why);
  // Blocks until every update so far is durable.
  absl::Status Flush();
  // After a failed journal write (a full disk, EIO; health() non-OK): reopens the journal and
  // rebuilds the state from what is durable, discarding updates applied in memory but never
  // written (never acknowledged). OK at once when healthy; the journal's error while it cannot
  // recover yet (pacerd's housekeeping calls it periodically). In journal_recovery.cc.
  absl::Status RecoverJournal();
  // OK, or why updates are refused (the journal failed and has not recovered yet).
  absl::Status journal_health() const { return journal_->health(); }
  // What the journal found when it opened (pacerd audits an accepted loss).
  JournalRecovery journal_recovery() const { return journal_->recovery(); }

  ShardingServiceStats stats() const;
  LeaseFacts WorkerLeaseFacts() const;
  // The worker's current registration (incarnation, node); nullopt when it never registered.
  // What pacerd's identity rules read (common/identity_rules.h).
  std::optional<WorkerDirectory::Registration> Registration(const std::string& worker) const;
  // A copy of the state (tests compare it with a replay).
  ShardingSnapshot SnapshotForTest() const;

 private:
  ShardingServiceImpl(const ShardingServiceOptions& options, const Clock* clock,
                      MetricsRegistry* metrics);
  // Rebuilds a state from what a journal replays (pinned specs, the snapshot, the updates
  // after it): at Open and at RecoverJournal.
  struct StateReplay {
    ShardingState state;
    ShardingState::SpecsByKey specs;
    uint64_t replayed = 0;
    ShardingJournal::SnapshotFn OnSnapshot();
    ShardingJournal::UpdateFn OnUpdate();
    ShardingJournal::PinnedFn OnPinned();
  };
  // Applies `update` (stamped with seq and time) and queues it. Returns the seq to wait for.
  absl::StatusOr<uint64_t> Commit(Update update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the updates Commit() applied during this request to the journal, in one append.
  void AppendPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(const std::string& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues each cancelled lease for its holder's next heartbeat reply.
  void Notify(const std::vector<std::pair<std::string, uint64_t>>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shape of every request: runs `body` under mu_ (validate, Commit) and hands what it
  // applied to the journal. Returns the seq to wait for (AnswerWhenDurable) or the refusal.
  Applied Run(const std::function<Applied()>& body);
  // Run, then AnswerWhenDurable.
  void Serve(Done done, const std::function<Applied()>& body);
  absl::StatusOr<uint64_t> DoProgress(const ProgressRequest& req, ProgressResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leases `worker` (or returns the lease its request `request_id` already got).
  absl::StatusOr<uint64_t> DoFetch(const std::string& worker, uint64_t incarnation,
                                   const std::string& dataset, uint64_t request_id,
                                   FetchShardResponse* resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next-lease part of a combined call: DoFetch, whose failure becomes WAIT with the
  // reason (the report it rides on was counted). Returns the seq to wait for.
  uint64_t FetchNext(uint64_t reported_seq, const std::string& worker, uint64_t incarnation,
                     const std::string& dataset, uint64_t request_id, FetchShardResponse* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The truthful answer to a report on a lease that is no longer active (see the .cc).
  absl::StatusOr<uint64_t> AnswerEnded(const std::string& worker, uint64_t lease_id,
                                       uint64_t records_done, bool completing,
                                       const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the worker's leases whose fetch reply it never received (the heartbeat's list).
  absl::StatusOr<uint64_t> ReleaseUnknownLeases(const HeartbeatRequest& req,
                                                HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardingServiceOptions options_;
  const Clock* clock_;
  std::unique_ptr<MetricsRegistry> own_metrics_;
  ShardingMetrics metrics_;
  std::unique_ptr<ShardingJournal> journal_;

  mutable absl::Mutex mu_;
  ShardingState state_ ABSL_GUARDED_BY(mu_);
  std::vector<Update> pending_ ABSL_GUARDED_BY(mu_);  // applied, not yet handed to the journal
  uint64_t last_snapshot_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> last_seen_ms_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<uint64_t>> cancelled_ ABSL_GUARDED_BY(mu_);
  // What the per-dataset counters already hold, by dataset (also every dataset ever exported).
  std::map<std::string, uint64_t> counted_done_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> counted_requeues_ ABSL_GUARDED_BY(mu_);
  ShardingServiceStats stats_ ABSL_GUARDED_BY(mu_);
  RecentDurations shard_times_ ABSL_GUARDED_BY(mu_);  // completed leases, seconds
  FetchRatesSource fetch_rates_ ABSL_GUARDED_BY(mu_);
};

// Runs one service method and waits for its reply: for in-process callers (tests, benchmarks)
// that want the synchronous form of the callback API.
template <typename Service, typename Req, typename Resp>
absl::Status CallAndWait(Service& svc, void (Service::*method)(const Req&, Resp*, ShardingApi::Done),
                         const Req& req, Resp* resp) {
  std::promise<absl::Status> replied;
  (svc.*method)(req, resp, [&](absl::Status s) { replied.set_value(std::move(s)); });
  return replied.get_future().get();
}

}  // namespace pacer
