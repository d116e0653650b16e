// ControllerStore: the controller's durable state in pacerd (RocksDB under
// <data-dir>/controller), so that a restart keeps what the controller knew.
//
// What it keeps and why:
//  * the audit trail (`pacerctl actions` after a restart shows the decisions made before it);
//  * the plan in force with its version (versions only grow: a worker holding plan v3 never
//    gets a new "v1"), the allocations, tail backups and exclusions;
//  * executed actions' times (cooldowns, rate limits and min-live checks hold across a
//    restart: a crash loop of pacerd cannot become a restart storm of workers), pending gain
//    measurements and what a rollback would restore;
//  * the nodes that kept producing stragglers;
//  * the policy last applied with `pacerctl policy apply`, with the digest of the --policy
//    file it replaced: a pacerd started again with the same --policy file keeps the applied
//    policy; started with another (or an edited) file, it uses that file.
//
// Layout: "audit/<20-digit id>" -> AuditState, "state" -> ControllerState, "policy" ->
// AppliedPolicy; every Save is one synced WriteBatch, so a crash leaves the state before or
// after it. Records the History dropped (max_records) are deleted by range.
// Thread-compatible: the Reconciler serialises access.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "controller/history.h"
#include "proto/pacer/controller.pb.h"

namespace rocksdb {
class DB;
}

namespace pacer {

// Conversions (exposed for tests).
PlanState PlanToProto(const BatchPlan& plan);
BatchPlan PlanFromProto(const PlanState& proto);
AuditState AuditToProto(const AuditRecord& record);
// INVALID_ARGUMENT for an unknown kind or outcome (a store written by a newer pacerd).
absl::StatusOr<AuditRecord> AuditFromProto(const AuditState& proto);

class ControllerStore {
 public:
  // Opens (creates) the store in `dir`. DATA_LOSS when a record does not parse, when RocksDB
  // finds damage (its WAL is replayed with absolute consistency: never rolled back silently),
  // or, with `must_exist` (the data dir's IDENTITY lists the store), when it is missing.
  static absl::StatusOr<std::unique_ptr<ControllerStore>> Open(const std::string& dir,
                                                               bool must_exist = false);
  ~ControllerStore();

  struct Loaded {
    bool empty = true;  // nothing stored yet (a fresh data dir)
    std::deque<AuditRecord> audit;
    std::map<uint64_t, std::string> dispatch;  // audit id -> what pacerd did with it
    ControllerState state;
    std::optional<AppliedPolicy> policy;
  };
  absl::StatusOr<Loaded> Load() const;

  // Writes the records `changes` names (their dispatch notes from `dispatch`), the state when
  // it changed, and deletes records older than the oldest one `history` keeps.
  absl::Status Save(const History& history, const History::Changes& changes,
                    const std::map<uint64_t, std::string>& dispatch);
  absl::Status SavePolicy(const AppliedPolicy& policy);

 private:
  explicit ControllerStore(std::unique_ptr<rocksdb::DB> db);
  std::unique_ptr<rocksdb::DB> db_;
};

// Restores `loaded` into `history` (audit, plan, allocations, nodes).
void RestoreHistory(const ControllerStore::Loaded& loaded, History* history);

}  // namespace pacer
