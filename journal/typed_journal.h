// TypedJournal<UpdateT, SnapshotT>: a state machine's view of the one journal (DurableLog,
// journal/durable_log.h) — its own protobuf update and snapshot types in, bytes stored.
//
// Both state machines use it: the sharding core (`ShardingJournal` = TypedJournal<Update,
// ShardingSnapshot>, sharding_service/journal.h) and the controller (ControllerJournal,
// controller/controller_store.h). It serializes on the caller's thread (outside the log's
// lock; a snapshot is serialized by the log's writer) and, on replay, parses each entry and
// checks that it carries the seq the log holds it at: an entry that does not parse or carries
// another seq is corrupt (DATA_LOSS naming it, see durable_log.h); the state machine's own
// refusal of an entry that parsed is reported as "does not apply".
//
// UpdateT and SnapshotT are protobuf messages with a `uint64 seq` field. JournalFormatOf<UpdateT>
// names the format the log is written in when the options do not (each state machine defines
// it beside its update type). Thread-safe as the log is.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "journal/durable_log.h"

namespace pacer {

// Specialised by each state machine: `static JournalFormat Get();`.
template <typename UpdateT>
struct JournalFormatOf;

template <typename UpdateT, typename SnapshotT>
class TypedJournal {
 public:
  using Done = DurableLog::Done;
  using SnapshotFn = std::function<absl::Status(const SnapshotT&)>;
  using UpdateFn = std::function<absl::Status(const UpdateT&)>;
  using PinnedFn = DurableLog::PinnedFn;

  // Opens (creates) the RocksDB log (journal/rocks_log.h), or the one options.open_log opens,
  // and replays it: `on_pinned` with each
  // pinned entry (if given), `on_snapshot` with the newest snapshot (if any), then `on_update`
  // for each later update in order.
  static absl::StatusOr<std::unique_ptr<TypedJournal>> Open(JournalOptions options,
                                                            const SnapshotFn& on_snapshot,
                                                            const UpdateFn& on_update,
                                                            const PinnedFn& on_pinned = nullptr) {
    if (options.format.written.empty()) options.format = JournalFormatOf<UpdateT>::Get();
    auto log = options.open_log ? options.open_log(options, Typed(on_snapshot, on_update, on_pinned))
                                : OpenRocksLog(options, Typed(on_snapshot, on_update, on_pinned));
    if (!log.ok()) return log.status();
    return std::make_unique<TypedJournal>(std::move(*log));
  }
  explicit TypedJournal(std::unique_ptr<DurableLog> log) : log_(std::move(log)) {}

  // Queues `update` (whose seq must be the previous append's + 1).
  void Append(const UpdateT& update) { log_->Append(update.seq(), update.SerializeAsString()); }
  // Queues consecutive updates at once, so that they are durable in one group: the updates of
  // one request (a completion and the next lease) cost one fsync, not two.
  void AppendAll(const std::vector<UpdateT>& updates) {
    std::vector<std::pair<uint64_t, std::string>> bytes;
    bytes.reserve(updates.size());
    for (const UpdateT& u : updates) bytes.emplace_back(u.seq(), u.SerializeAsString());
    log_->AppendAll(std::move(bytes));
  }
  // Queues a snapshot (serialized by the writer); see DurableLog::WriteSnapshot.
  void WriteSnapshot(SnapshotT snapshot, std::vector<PinnedEntry> pinned) {
    const uint64_t seq = snapshot.seq();
    log_->WriteSnapshot(seq, std::make_shared<const SnapshotT>(std::move(snapshot)), std::move(pinned));
  }
  // A snapshot that refers to no pinned entry.
  void WriteSnapshot(SnapshotT snapshot) { WriteSnapshot(std::move(snapshot), {}); }
  // The durable updates from `seq` on (DurableLog::ReadFrom), parsed and checked.
  absl::Status ReadFrom(uint64_t seq, const UpdateFn& on_update) const {
    return log_->ReadFrom(seq, TypedEntry(on_update));
  }
  void WhenDurable(uint64_t seq, Done done) { log_->WhenDurable(seq, std::move(done)); }
  absl::Status Flush() { return log_->Flush(); }
  absl::Status health() const { return log_->health(); }
  // After a failed write: see DurableLog::Recover.
  absl::Status Recover(const SnapshotFn& on_snapshot, const UpdateFn& on_update,
                       const PinnedFn& on_pinned = nullptr) {
    return log_->Recover(Typed(on_snapshot, on_update, on_pinned));
  }
  uint64_t last_seq() const { return log_->last_seq(); }
  JournalStats stats() const { return log_->stats(); }
  JournalRecovery recovery() const { return log_->recovery(); }

 private:
  template <typename M>
  static std::function<absl::Status(uint64_t, const std::string&)> Parsed(
      std::function<absl::Status(const M&)> fn) {
    return [fn = std::move(fn)](uint64_t seq, const std::string& bytes) -> absl::Status {
      M m;
      if (!m.ParseFromString(bytes)) return absl::DataLossError("it does not parse");
      if (m.seq() != seq) return absl::DataLossError(absl::StrCat("found seq ", m.seq()));
      return fn(m);
    };
  }
  static DurableLog::EntryFn TypedEntry(const UpdateFn& on_update) { return Parsed<UpdateT>(on_update); }
  static DurableLog::Replay Typed(const SnapshotFn& on_snapshot, const UpdateFn& on_update,
                                  const PinnedFn& on_pinned) {
    return {Parsed<SnapshotT>(on_snapshot), Parsed<UpdateT>(on_update), on_pinned};
  }

  std::unique_ptr<DurableLog> log_;
};

}  // namespace pacer
