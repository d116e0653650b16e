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
    u.set_seq(state_.last_seq() + 1);
    u.set_time_ms(now_ms);
    absl::Status s = state_.Apply(u);
    if (s.ok()) log_.push_back(u);
    return s;
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
  // Validates like the service, then leases. nullopt when the plan is WAIT / END_OF_DATA.
  std::optional<ShardingState::LeaseRec> Fetch(const std::string& worker, const std::string& ds,
                                               FetchPlan::Kind* kind = nullptr) {
    auto plan = state_.PlanFetch(worker, ds);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return std::nullopt;
    if (kind) *kind = plan->kind;
    if (plan->kind == FetchPlan::kWait || plan->kind == FetchPlan::kEndOfData) return std::nullopt;
    Update u;
    *u.mutable_create_lease() = state_.DecideLease(*plan, worker, ds, /*request_id=*/0);
    EXPECT_TRUE(Apply(u).ok());
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
  std::vector<Update> log_;
};

}  // namespace pacer::testing
