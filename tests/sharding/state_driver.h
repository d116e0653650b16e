// StateDriver: builds Update messages and applies them to a ShardingState the way the service
// does (seq and time stamped, validation first), keeping the log for replay tests.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "sharding_service/sharding_state.h"

namespace pacer::testing {

class StateDriver {
 public:
  ShardingState& state() { return state_; }
  const std::vector<Update>& log() const { return log_; }
  int64_t now_ms = 1'000'000;

  absl::Status Apply(Update u) {
    absl::StatusOr<ApplyEffects> effects = state_.Commit(&u, now_ms);
    if (!effects.ok()) return effects.status();
    log_.push_back(u);
    for (auto& c : effects->cancelled_leases) cancelled_.push_back(std::move(c));
    return absl::OkStatus();
  }
  // The leases cancelled since the last call (what the service tells their holders).
  std::vector<std::pair<std::string, uint64_t>> TakeCancelled() {
    std::vector<std::pair<std::string, uint64_t>> out;
    out.swap(cancelled_);
    return out;
  }

  absl::Status AddDataset(const DatasetSpec& spec) {
    Update u;
    *u.mutable_register_dataset()->mutable_spec() = spec;
    return Apply(u);
  }
  static DatasetSpec Records(const std::string& name, uint64_t n, uint64_t shard_size,
                             uint32_t epochs = 1) {
    DatasetSpec s;
    s.set_name(name);
    s.set_num_records(n);
    s.set_shard_size(shard_size);
    s.set_num_epochs(epochs);
    return s;
  }
  uint64_t AddWorker(const std::string& id, const std::string& node = "n0") {
    Update u;
    u.mutable_register_worker()->set_worker_id(id);
    u.mutable_register_worker()->set_node(node);
    EXPECT_TRUE(Apply(u).ok());
    return state_.FindWorker(id)->incarnation;
  }
  // Decides like the service, then leases. nullopt when the decision is WAIT / END_OF_DATA.
  std::optional<ShardingState::LeaseRec> Fetch(const std::string& worker, const std::string& ds,
                                               FetchPlan::Kind* kind = nullptr,
                                               const FetchRates* rates = nullptr) {
    auto decision = state_.DecideFetch(worker, ds, /*request_id=*/0, rates);
    EXPECT_TRUE(decision.ok()) << decision.status();
    if (!decision.ok()) return std::nullopt;
    if (kind) *kind = decision->kind;
    if (!decision->update) return std::nullopt;
    EXPECT_TRUE(Apply(std::move(*decision->update)).ok());
    return *state_.FindLease(state_.last_lease_id());
  }
  absl::Status Progress(uint64_t lease, uint64_t done) {
    Update u;
    u.mutable_progress()->set_lease_id(lease);
    u.mutable_progress()->set_records_done(done);
    return Apply(u);
  }
  absl::Status End(uint64_t lease, LeaseEndReason reason, uint64_t done = 0,
                   const std::string& detail = "") {
    Update u;
    u.mutable_end_lease()->set_lease_id(lease);
    u.mutable_end_lease()->set_reason(reason);
    u.mutable_end_lease()->set_records_done(done);
    u.mutable_end_lease()->set_detail(detail);
    return Apply(u);
  }
  absl::Status Complete(uint64_t lease) { return End(lease, LEASE_COMPLETED); }
  absl::Status WorkerLost(const std::string& worker) {
    Update u;
    u.mutable_worker_lost()->set_worker_id(worker);
    return Apply(u);
  }
  absl::Status Save(const std::string& tag) {
    Update u;
    u.mutable_save_checkpoint()->set_tag(tag);
    return Apply(u);
  }
  absl::Status Restore(const std::string& tag) {
    Update u;
    u.mutable_restore_checkpoint()->set_tag(tag);
    return Apply(u);
  }
  absl::Status SetAllocation(const std::string& worker, double weight, uint64_t shard_size,
                             uint32_t max_leases = 0) {
    Update u;
    auto* a = u.mutable_set_allocation();
    a->set_worker_id(worker);
    a->set_weight(weight);
    a->set_shard_size(shard_size);
    a->set_max_leases(max_leases);
    return Apply(u);
  }
  absl::Status SetTailBackup(const std::string& ds, bool on) {
    Update u;
    u.mutable_set_tail_backup()->set_dataset(ds);
    u.mutable_set_tail_backup()->set_enabled(on);
    return Apply(u);
  }
  absl::Status DeleteDataset(const std::string& ds) {
    Update u;
    u.mutable_delete_dataset()->set_dataset(ds);
    return Apply(u);
  }
  absl::Status ResetDataset(const std::string& ds) {
    Update u;
    u.mutable_reset_dataset()->set_dataset(ds);
    return Apply(u);
  }

 private:
  ShardingState state_;
  std::vector<std::pair<std::string, uint64_t>> cancelled_;
  std::vector<Update> log_;
};

}  // namespace pacer::testing
