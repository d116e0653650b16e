// ShardingState: every piece of the sharding service's durable state, as a pure state machine.
//
// Owns: datasets (spec, open epochs, pending position ranges, done/quarantined counters),
// leases, workers and checkpoints. Changed only by updates (proto/pacer/sharding.proto), under
// the contract both durable state machines share (controller/controller_durable_state.h is the
// other): Validate(update) makes every check and changes nothing; Apply(update) applies an
// update that passed Validate and cannot fail; ApplyChecked is the two together (replay), and
// Commit stamps the next seq and time and does the same (the live path). Apply does no I/O,
// reads no clock and draws no random numbers: ids and tokens come from counters in the state
// and time from the update, so replaying the journal rebuilds the exact state (docs/style.md §1).
//
// Invariants (checked by the tests after every update):
//  * Within an epoch, the positions of a partition are split into: done, quarantined, pending
//    (requeue ranges and [frontier, limit)), and the undone suffixes of active leases. A backup
//    pair shares one suffix. Hence no position is both done and handed out elsewhere, and
//    done + quarantined == size exactly when the epoch is finished.
//  * A lease's records_done only grows; counted done records of a backup pair are the max of
//    the two prefixes, so a record is counted once.
//  * Requeued ranges go to the front of their partition's queue.
//
// Memory is O(datasets + leases + workers + requeued ranges + checkpoints + ended leases kept for
// truthful retries), independent of the number of records: pending work is ranges, never one
// object per shard. Ended leases (EndedLease records, ~190 bytes each with their map node) are
// kept per worker whichever of the worker's incarnations held them (a registration forgets
// none: the process that registered may die before it resolves what the incarnation before it
// left open), and:
//  * each worker keeps its newest EndedFloor(w) = max(kMinEndedPerWorker, 2 x its max_leases)
//    (16 by default) whatever else the job holds and whatever their epoch: the leases its
//    retries and its next registration can still be about — a client retries only calls in
//    flight, on leases it held, and holds at most max_leases; a worker killed with a report in
//    flight may register again only after the rest of the job closed that epoch and the next;
//  * beyond those floors only leases of the dataset's open epochs and the epoch just before
//    them are kept (an epoch's close forgets older ones), and the whole job keeps at most
//    kMaxEndedBeyondFloor (16 384) of them; when an ending lease would exceed that, the ending
//    worker's own oldest beyond its floor go;
//  * and no worker keeps more than kMaxEndedPerWorker (4 096).
// So ended records <= sum over workers of EndedFloor(w) + kMaxEndedBeyondFloor, i.e. at most
// 16 x W + 16 384 with default allocations (81 920 records, ~15 MiB, at 4 096 workers; a lone
// worker keeps its last 4 096). A retry about a forgotten lease is answered "outcome unknown"
// (FAILED_PRECONDITION), never falsely OK. The rule depends only on the updates applied, so a
// replay forgets exactly the same records. (Builds before this rule also forgot, at each
// registration, the leases of the incarnations before the replaced one, and at an epoch's close
// a worker's floor too; their journals and snapshots replay here unchanged, only remembering
// more where they still can: every record kept is true, so answers stay truthful.)
//
// Journal formats (what an Update means):
//  * v5 (this code): as v3, plus DeleteDatasetUpdate and ResetDatasetUpdate (an operator
//    deletes a dataset or starts it over); a v4 build refuses a v5 dir at start.
//  * v3/v4: CreateLeaseUpdate carries the decided outcome (`decided`: ids, range,
//    attempts, backup partner). The service decides with DecideLease() before the journal;
//    Validate checks it fits the state and Apply only records it.
//  * v2: CreateLeaseUpdate held only worker and dataset and Apply re-ran the planner. Such an
//    update is still replayed, through PlanFetch() as it was when v2 was written; the golden
//    journal in tests/sharding/golden/ pins that. Whoever changes PlanFetch so that the golden
//    replay changes must keep a frozen copy of the v2 planner for `decided == false` updates.
//
// Thread-compatible: the service layer guards it with its mutex. Fetch planning (PlanFetch,
// DecideFetch) is const but fills a cache of the consumers' sums (see EvenEndSize), so even
// those reads must not run concurrently on one state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/pacer/sharding.pb.h"
#include "sharding_service/fetch_rates.h"

namespace pacer {

// Limits on what a request may ask for (validated before any update is made).
inline constexpr uint64_t kMaxRecordsPerDataset = uint64_t{1} << 50;
inline constexpr uint64_t kMaxShardSize = uint64_t{1} << 32;
inline constexpr uint64_t kMaxRecordsShuffleShardSize = 65536;  // leases list record ids
inline constexpr int kMaxFiles = 1'000'000;
inline constexpr int kMaxPartitions = 65'536;
inline constexpr size_t kMaxNameLength = 128;
inline constexpr size_t kMaxWorkerIdLength = 256;
inline constexpr uint32_t kDefaultMaxAttempts = 3;
inline constexpr uint32_t kDefaultMaxLeasesPerWorker = 4;  // per worker and dataset
inline constexpr size_t kMaxOpenEpochs = 2;                // without a barrier
// Ended leases kept for truthful retries (see "Memory" above): per worker at most, per worker at
// least (the floor, raised to 2 x max_leases), and over the job beyond every worker's floor.
inline constexpr size_t kMaxEndedPerWorker = 4096;
inline constexpr size_t kMinEndedPerWorker = 16;
inline constexpr size_t kMaxEndedBeyondFloor = 16'384;
inline constexpr size_t kMaxCheckpoints = 64;
// The memory the checkpoints kept hold, over every tag (CheckpointHeldBytes): a checkpoint
// holds each partition's position, so 64 of a state at its dataset-bytes quota would be far
// larger than the state.
inline constexpr uint64_t kMaxCheckpointBytes = uint64_t{32} << 20;
// What a partition's position costs in a checkpoint besides its serialized bytes (a message).
inline constexpr uint64_t kCheckpointPartitionBytes = 96;
inline constexpr uint64_t kDefaultShardSize = 1024;
// Quotas a client can reach (RESOURCE_EXHAUSTED), so no client can make the state unbounded.
inline constexpr size_t kMaxDatasets = 1024;
inline constexpr uint64_t kMaxFilesTotal = 2'000'000;  // over every dataset
// The memory every dataset's spec and per-partition state may hold, over every dataset
// (ShardingState::HeldBytes; pacerd --max-dataset-bytes).
inline constexpr uint64_t kDefaultMaxDatasetBytes = uint64_t{256} << 20;
// What one partition costs besides the spec: its state (position and requeue, 64 bytes, ~140
// with the allocator's share; an empty std::deque made it ~880 before PendingQueue), its
// position in the checkpoint kept, and the copies a journal snapshot or a checkpoint makes.
inline constexpr uint64_t kPartitionHeldBytes = 512;
inline constexpr size_t kMaxWorkers = 65'536;
// Live leases over the job (a lease holds ~500 bytes): far above 4 096 workers x 4 leases x a few
// datasets, far below what the job token could open for 65 536 workers x 1 024 datasets.
inline constexpr size_t kMaxLiveLeases = 131'072;

// True for 1..max_len characters of [A-Za-z0-9._:/-] (dataset names, worker ids, tags).
bool IsValidName(const std::string& s, size_t max_len);

// The fields in which two normalised specs of one dataset differ, for people:
// "num_records 200000 (registered) vs 400000 (requested), shard_size 640 vs 1280". Empty when
// they are equal.
std::string DescribeSpecDifference(const DatasetSpec& registered, const DatasetSpec& requested);
// The AlreadyExists error for a registration whose spec differs from the registered one: names
// the differing fields and how to get rid of the old dataset.
absl::Status SpecMismatchError(const DatasetSpec& registered, const DatasetSpec& requested);

// What a FetchShard by `worker` on `dataset` would get now.
struct FetchPlan {
  enum Kind { kLease, kBackup, kWait, kEndOfData };
  Kind kind = kWait;
  std::string reason;  // for kWait
  // kLease: where the range comes from.
  size_t epoch_index = 0;  // index into the dataset's open epochs; == size() opens a new epoch
  uint32_t partition = 0;
  bool from_requeue = false;
  uint64_t begin = 0, end = 0;
  uint32_t attempts = 0;
  // kBackup: the lease whose suffix is leased again.
  uint64_t backup_of = 0;
};

// What a FetchShard decides: wait, end of data, or the update that grants a lease -- the one
// the service journals and applies, as any update (ShardingState::Commit).
struct FetchDecision {
  FetchPlan::Kind kind = FetchPlan::kWait;
  std::string reason;            // kWait
  std::optional<Update> update;  // kLease, kBackup: the CreateLeaseUpdate with its outcome
};

// What applying one update did besides changing the state: the leases it ended whose holders
// must hear of it in their next heartbeat (a backup pair's loser, a lost worker's leases, an
// epoch or dataset reset or deleted).
struct ApplyEffects {
  std::vector<std::pair<std::string, uint64_t>> cancelled_leases;  // (worker, lease id)
};

class ShardingState {
 public:
  struct Pending {
    uint64_t begin, end;
    uint32_t attempts;
  };
  // A partition's requeued ranges, front first: taken from and put back at the front only. A
  // vector kept back to front, because an empty std::deque allocates ~600 bytes, and a stream
  // has up to 65 536 partitions that mostly never requeue anything.
  class PendingQueue {
   public:
    bool empty() const { return back_to_front_.empty(); }
    size_t size() const { return back_to_front_.size(); }
    Pending& front() { return back_to_front_.back(); }
    const Pending& front() const { return back_to_front_.back(); }
    void push_front(const Pending& p) { back_to_front_.push_back(p); }
    void pop_front() { back_to_front_.pop_back(); }
    // Front to back.
    auto begin() const { return back_to_front_.rbegin(); }
    auto end() const { return back_to_front_.rend(); }

   private:
    std::vector<Pending> back_to_front_;
  };
  struct Partition {
    uint64_t start = 0, frontier = 0, limit = 0;
    PendingQueue requeue;
    uint64_t done = 0, quarantined = 0;
    bool HasPending() const { return !requeue.empty() || frontier < limit; }
  };
  struct Epoch {
    uint32_t epoch = 0;
    std::vector<Partition> partitions;
    uint32_t active_leases = 0;
    // Records the epoch's active leases hold past their done prefix, backups left out (a
    // backup's records are its primary's): kept by every update that creates, advances or
    // ends a lease, so that a fetch near the epoch's end need not visit every lease.
    uint64_t unconsumed_held = 0;
  };
  struct Dataset {
    // Normalised (defaults filled in) and immutable once registered: shared, never copied — by
    // copies of the state, by snapshots (ToJournalSnapshot) and by the journal's pinned entry.
    std::shared_ptr<const DatasetSpec> spec;
    uint64_t records_per_epoch = 0;  // 0 for a stream
    std::deque<Epoch> open;          // ascending epoch numbers
    uint32_t next_epoch = 0;
    uint32_t completed_epochs = 0;
    bool tail_backup = false;
    std::vector<QuarantinedRange> quarantined;
    bool failed = false;
    std::string failure;
    uint64_t records_done_total = 0;
    uint64_t requeues_total = 0;
    uint64_t records_quarantined_total = 0;  // sum over `quarantined`
    uint64_t held_bytes = 0;  // HeldBytes(*spec), counted against kDefaultMaxDatasetBytes
    bool is_stream() const { return spec->source_case() == DatasetSpec::kStream; }
    bool Finished() const;
  };
  struct LeaseRec {
    uint64_t id = 0, token = 0;
    std::string worker, dataset;
    uint32_t epoch = 0, partition = 0;
    uint64_t begin = 0, end = 0, done = 0;
    uint32_t attempts = 0;
    uint64_t partner = 0;
    bool backup = false;
    int64_t created_ms = 0, progress_ms = 0;
    uint64_t incarnation = 0;  // of the holder, when granted
    uint64_t request_id = 0;   // the FetchShard request that created it (0: none)
    uint64_t done_pos() const { return begin + done; }
    // What it holds past its done prefix (Epoch::unconsumed_held sums it).
    uint64_t unconsumed() const { return end - std::min(end, done_pos()); }
  };
  struct WorkerRec {
    std::string id, node;
    uint64_t incarnation = 0;
    double weight = 1.0;
    uint64_t shard_size = 0;
    uint32_t max_leases = 0;
    bool lost = false;
    std::set<uint64_t> leases;
    // By lease id; see "Memory" above. Changed only through AddEnded / EraseEnded, which keep
    // the state's ended-lease counters.
    std::map<uint64_t, EndedLease> ended;
  };
  // How many of `w`'s newest ended leases are kept whatever the rest of the job holds.
  static size_t EndedFloor(const WorkerRec& w);
  // The memory a registered dataset holds for its (normalised) spec: the spec as protobuf holds
  // it plus kPartitionHeldBytes a partition (a stream's partitions; one for other datasets).
  static uint64_t HeldBytes(const DatasetSpec& spec);
  // The memory a checkpoint holds, counted the same on every replay: its serialized size plus
  // kCheckpointPartitionBytes a partition position.
  static uint64_t CheckpointHeldBytes(const Checkpoint& cp);

  ShardingState() = default;

  // OK if `update` fits the state: the next seq (last_seq() + 1), a known kind, and what it
  // names exists and allows it. INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION / ALREADY_EXISTS
  // (a registration with another spec) otherwise. Changes nothing. The service checks requests
  // before it makes an update, so on the live path this never fails; on replay a refusal means
  // a corrupt or foreign journal.
  absl::Status Validate(const Update& update) const;
  // Applies an update that passed Validate(). Deterministic; never fails. Returns what it did
  // besides changing the state (the leases whose holders must hear they ended).
  ApplyEffects Apply(const Update& update);
  // Validate + Apply (replay: the effects are history then).
  absl::Status ApplyChecked(const Update& update);
  // The one request -> update path's last step, for the service, the simulator's in-process
  // control plane and the tests alike: `update` becomes the next update (seq) at `now_ms`,
  // is validated and applied; its effects are returned. On an error nothing changed but
  // `update`'s stamp.
  absl::StatusOr<ApplyEffects> Commit(Update* update, int64_t now_ms);

  // ---- Validation helpers for the service (pure reads) ----
  // Checks a dataset spec and returns it with defaults filled in.
  static absl::StatusOr<DatasetSpec> NormalizeSpec(const DatasetSpec& spec);
  static absl::Status ValidateCheckpointTag(const std::string& tag);
  static absl::Status ValidateAllocation(const SetAllocationUpdate& allocation);
  // What a FetchShard by `worker` decides now, with the update to journal when it leases.
  // FAILED_PRECONDITION if the dataset failed (poison), NOT_FOUND if the dataset or worker is
  // unknown.
  // `rates`: the records each worker trains a step under the batch plan in force (nullptr or
  // incomplete: shares by weight); see EvenEndSize.
  absl::StatusOr<FetchDecision> DecideFetch(const std::string& worker, const std::string& dataset,
                                            uint64_t request_id,
                                            const FetchRates* rates = nullptr) const;
  // Its two halves: what a fetch would get, and the CreateLeaseUpdate that grants a plan (the
  // v2 replay re-runs the planner alone, as v2 wrote it: `v2_planner` leaves out the leases
  // that shrink near an epoch's end, so an old journal keeps its meaning).
  absl::StatusOr<FetchPlan> PlanFetch(const std::string& worker, const std::string& dataset,
                                      bool v2_planner = false,
                                      const FetchRates* rates = nullptr) const;
  // The CreateLeaseUpdate (v3, with its outcome) that grants `plan` (kLease or kBackup).
  CreateLeaseUpdate DecideLease(const FetchPlan& plan, const std::string& worker,
                                const std::string& dataset, uint64_t request_id) const;
  // The active lease `worker` got from FetchShard request `request_id`, if any.
  const LeaseRec* FindLeaseByRequest(const std::string& worker, uint64_t request_id) const;
  // OK if `worker`'s `incarnation` holds lease `lease_id` with `token`; FAILED_PRECONDITION
  // (stale token, ended lease, old incarnation) otherwise.
  absl::Status CheckLease(const std::string& worker, uint64_t incarnation, uint64_t lease_id,
                          uint64_t token) const;
  absl::Status CheckWorker(const std::string& worker, uint64_t incarnation) const;

  // ---- Reads ----
  const Dataset* FindDataset(const std::string& name) const;
  const LeaseRec* FindLease(uint64_t id) const;
  const WorkerRec* FindWorker(const std::string& id) const;
  // An ended lease of `worker` (its final done prefix and why it ended), if remembered.
  const EndedLease* FindEnded(const std::string& worker, uint64_t lease_id) const;
  // Why a lease id that is neither active nor remembered for `worker` is unknown (for errors).
  std::string ExplainUnknownLease(const std::string& worker, uint64_t lease_id) const;
  const std::map<uint64_t, LeaseRec>& leases() const { return leases_; }
  const std::map<std::string, Dataset>& datasets() const { return datasets_; }
  const std::map<std::string, WorkerRec>& workers() const { return workers_; }
  bool HasCheckpoint(const std::string& tag) const { return checkpoints_.count(tag) > 0; }
  uint64_t last_seq() const { return last_seq_; }
  // Ended-lease records held over every worker, and how many of them lie beyond each worker's
  // EndedFloor (<= kMaxEndedBeyondFloor: the memory bound of "Memory" above).
  size_t ended_records() const { return ended_total_; }
  size_t ended_beyond_floor() const { return ended_beyond_floor_; }
  uint64_t last_lease_id() const { return next_lease_id_ - 1; }

  // Fills a Lease message for an active lease (record ids included).
  Lease DescribeLease(const LeaseRec& lease) const;
  // Without `include_files` a file dataset's spec comes without its file list (never copied).
  DatasetInfo DescribeDataset(const Dataset& ds, bool include_files = true) const;

  // ---- Snapshots ----
  // Formats (ShardingSnapshot.format): 0 — every spec inline (what v2/v3 journals hold; still
  // read); 4 — "specs apart": a dataset names its spec by key (DatasetState.spec_key) and the
  // journal keeps the spec as a pinned entry, written once.
  static constexpr uint32_t kSnapshotFormatSpecsApart = 4;
  using SpecsByKey = std::map<std::string, std::shared_ptr<const DatasetSpec>>;
  struct JournalSnapshot {
    ShardingSnapshot snapshot;  // format 4: only the dynamic state, small
    SpecsByKey specs;           // every spec it names, shared with this state (not copied)
  };
  // What the service journals: copies no file list, whatever the datasets' size.
  JournalSnapshot ToJournalSnapshot() const;
  // The whole state in one message, specs inline (format 0): for comparing states (tests,
  // SnapshotForTest) and for tools; copies every file list, so not for a hot path.
  ShardingSnapshot ToSnapshot() const;
  // Loads either format; format 4 finds each spec in `specs` (the journal's pinned entries).
  static absl::StatusOr<ShardingState> FromSnapshot(const ShardingSnapshot& snapshot,
                                                    const SpecsByKey& specs = {});
  // The pinned entry key of a dataset's spec, and reading one back (a pinned entry that is
  // not a spec is left alone: OK).
  static std::string SpecKey(const std::string& dataset);
  static absl::Status AddPinnedSpec(const std::string& key, const std::string& bytes,
                                    SpecsByKey* specs);

 private:
  // Validate(), by kind (each returns what Validate returns for that kind).
  absl::Status ValidateRegisterDataset(const RegisterDatasetUpdate& u) const;
  absl::Status ValidateRegisterWorker(const RegisterWorkerUpdate& u) const;
  absl::Status ValidateCreateLease(const CreateLeaseUpdate& u) const;
  absl::Status ValidateProgress(const ProgressUpdate& u) const;
  absl::Status ValidateEndLease(const EndLeaseUpdate& u) const;
  // Apply(), by kind: each applies a validated update and cannot fail.
  void ApplyRegisterDataset(const RegisterDatasetUpdate& u);
  void ApplyRegisterWorker(const RegisterWorkerUpdate& u, int64_t time_ms);
  void ApplyCreateLease(const CreateLeaseUpdate& u, int64_t time_ms);
  // A v2 CreateLeaseUpdate (`decided` false) decided now, with the planner v2 wrote it by (see
  // "Journal formats" above); FAILED_PRECONDITION when that planner would lease nothing.
  absl::StatusOr<CreateLeaseUpdate> DecideV2Lease(const CreateLeaseUpdate& u) const;
  // Checks that a decided lease fits the state (a corrupt or foreign journal otherwise).
  absl::Status CheckDecidedLease(const CreateLeaseUpdate& u) const;
  void ApplyProgress(const ProgressUpdate& u, int64_t time_ms);
  void ApplyEndLease(const EndLeaseUpdate& u, int64_t time_ms);
  void ApplyWorkerLost(const WorkerLostUpdate& u, int64_t time_ms);
  void ApplySaveCheckpoint(const SaveCheckpointUpdate& u, int64_t time_ms);
  void ApplyRestoreCheckpoint(const RestoreCheckpointUpdate& u, int64_t time_ms);
  void ApplySetAllocation(const SetAllocationUpdate& u);
  void ApplyDeleteDataset(const DeleteDatasetUpdate& u);
  void ApplyResetDataset(const ResetDatasetUpdate& u);
  // Ends every active lease of `dataset` as LEASE_CANCELLED (remembered for truthful retries,
  // holders notified), requeueing nothing, and drops its position from every checkpoint: what
  // delete and reset share. Returns how many leases ended.
  uint64_t DropDatasetProgress(const std::string& dataset);

  // Adds done records of `lease` up to prefix `new_done`, counting only what neither it nor its
  // backup partner had counted.
  void AdvanceDone(LeaseRec& lease, uint64_t new_done, int64_t time_ms);
  // Ends a lease: requeues the unconsumed suffix (unless a partner lives on or `requeue` is
  // false), counts failures toward quarantine, and closes finished epochs.
  void EndLease(uint64_t lease_id, LeaseEndReason reason, const std::string& detail,
                int64_t time_ms, bool requeue);
  void CloseFinishedEpochs(Dataset& ds);
  // Moves an ending lease into its worker's `ended` and out of its lease set.
  void RememberEnded(const LeaseRec& lease, LeaseEndReason reason);
  // Forgets ended leases of `ds` older than the epoch before its oldest open one.
  void ForgetOldEnded(const Dataset& ds);
  // Every change to a worker's `ended` goes through these, which keep ended_total_ and
  // ended_beyond_floor_.
  void AddEnded(WorkerRec& w, EndedLease e);
  std::map<uint64_t, EndedLease>::iterator EraseEnded(
      WorkerRec& w, std::map<uint64_t, EndedLease>::iterator it);
  // Drops `w`'s oldest ended leases past kMaxEndedPerWorker and, while the job holds more than
  // kMaxEndedBeyondFloor beyond the floors, past w's floor.
  void TrimEnded(WorkerRec& w);
  static Partition PartitionFromProto(const PartitionState& d, bool keep_attempts);
  Epoch* FindEpoch(Dataset& ds, uint32_t epoch);
  Epoch MakeEpoch(const Dataset& ds, uint32_t epoch) const;
  uint64_t ShardSizeFor(const WorkerRec& w, const Dataset& ds) const;
  // `size` shrunk near an epoch's end to `w`'s share of the records epoch `epoch` has left --
  // the `unleased` ones and those its consumers hold unconsumed -- less what `w` holds itself;
  // shares by `rates` when every consumer has one (a batch plan), else by weight, over the
  // dataset's consumers (`w` and the live workers that hold a lease of it or last ended one of
  // it); never below one batch (see PlanFetch).
  uint64_t EvenEndSize(const WorkerRec& w, const Dataset& ds, uint32_t epoch, uint64_t unleased,
                       uint64_t size, const FetchRates* rates) const;
  // What EvenEndSize shares by, over a dataset's consumers in worker-id order: how many, their
  // weights' sum, their planned rates' sum and whether each has a rate (the sums are of
  // doubles, so always added in that order: any other gives other leases).
  struct ConsumerSums {
    int consumers = 0;
    double weight = 0, rate = 0;
    bool all_rated = true;
    uint64_t rates_stamp = 0;  // FetchRates::stamp() of the rates summed
  };
  // Whether `o` is live and reads `dataset`: holds a lease of it, or its newest ended lease
  // was of it.
  bool Consumes(const WorkerRec& o, const std::string& dataset) const;
  // The sums over every worker that Consumes(`dataset`), and `extra` too when it is live
  // (nullptr: none); visits every worker.
  ConsumerSums SumConsumers(const std::string& dataset, const WorkerRec* extra,
                            const FetchRates* rates) const;
  // The sums over `dataset`'s consumers and the live fetcher `w` (one of them or not): the
  // cached ones while no consumer came, went or changed weight and the rates are the same,
  // else summed again (and kept, when `w` is one of them).
  ConsumerSums ConsumerSumsFor(const WorkerRec& w, const std::string& dataset,
                               const FetchRates* rates) const;
  // Drops the cached consumer sums: called by every update that may add a consumer to a
  // dataset, take one away or change one's weight (before or after it, as each needs).
  void ForgetConsumerSums() { consumer_sums_.clear(); }
  Checkpoint CapturePosition(const std::string& tag, int64_t time_ms) const;

  std::map<std::string, Dataset> datasets_;
  std::map<uint64_t, LeaseRec> leases_;
  std::map<std::string, WorkerRec> workers_;
  std::map<std::string, Checkpoint> checkpoints_;
  uint64_t next_lease_id_ = 1;
  uint64_t next_token_ = 1;
  uint64_t next_incarnation_ = 1;
  uint64_t last_seq_ = 0;
  size_t ended_total_ = 0;         // sum of every worker's ended.size()
  size_t ended_beyond_floor_ = 0;  // sum of max(0, ended.size() - EndedFloor(w))
  // Not part of the state: the leases the update being applied cancels (Apply returns them).
  std::vector<std::pair<std::string, uint64_t>> cancelled_;
  // Not part of the state either: each dataset's ConsumerSums, by dataset name, as long as
  // they hold (ForgetConsumerSums). Filled by the const fetch planner; copied with the state,
  // which is right, since a copy has the same consumers until it changes.
  mutable std::map<std::string, ConsumerSums> consumer_sums_;
};

const char* LeaseEndReasonName(LeaseEndReason reason);

// The age in seconds of the oldest active lease each worker holds, at `now_ms` (the
// controller's WorkerFacts::shard_elapsed_s, in pacerd and in the simulator).
std::map<std::string, double> OldestLeaseAges(const ShardingState& state, int64_t now_ms);

}  // namespace pacer
