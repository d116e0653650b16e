// Robustness: garbage and hostile updates (as a corrupt journal or a buggy caller would send)
// are refused by ShardingState::Apply with an error and never crash it or break its
// invariants; the state keeps serving afterwards. Raw random bytes and structured random
// updates with ids near the live ones, bounded and seeded.
#include <gtest/gtest.h>

#include <random>

#include "tests/sharding/state_driver.h"

namespace pacer {
namespace {

using testing::StateDriver;

Update RandomUpdate(std::mt19937_64& rng, const ShardingState& st) {
  Update u;
  auto pick_worker = [&] { return "w" + std::to_string(rng() % 6); };
  auto pick_lease = [&] { return st.last_lease_id() + 3 - rng() % 8; };
  auto big = [&]() -> uint64_t {
    switch (rng() % 4) {
      case 0: return rng();
      case 1: return rng() % 50;
      case 2: return ~uint64_t{0} - rng() % 3;
      default: return 0;
    }
  };
  switch (rng() % 13) {
    case 0: {
      auto* s = u.mutable_register_dataset()->mutable_spec();
      s->set_name(rng() % 5 ? "d" + std::to_string(rng() % 4) : std::string(rng() % 300, 'x'));
      switch (rng() % 4) {
        case 0: s->set_num_records(big()); break;
        case 1: for (int i = 0; i < static_cast<int>(rng() % 4); ++i) {
                  auto* f = s->mutable_files()->add_files();
                  f->set_path(rng() % 3 ? "f" : "");
                  f->set_num_records(big());
                }
                break;
        case 2: for (int i = 0; i < static_cast<int>(rng() % 4); ++i) {
                  auto* p = s->mutable_stream()->add_partitions();
                  p->set_id(rng() % 3);
                  p->set_start_offset(big());
                }
                break;
        default: break;
      }
      s->set_shard_size(big());
      s->set_batch_size(big());
      s->set_num_epochs(static_cast<uint32_t>(rng() % 4));
      s->set_shuffle(static_cast<ShuffleMode>(rng() % 5));
      s->set_max_attempts(static_cast<uint32_t>(rng() % 5));
      s->set_on_poison(static_cast<PoisonAction>(rng() % 3));
      s->set_epoch_barrier(rng() % 2);
      s->set_tail_backup(rng() % 2);
      break;
    }
    case 1: u.mutable_register_worker()->set_worker_id(rng() % 9 ? pick_worker() : ""); break;
    case 2:
      // A v2 update (decided again by the planner on apply).
      u.mutable_create_lease()->set_worker_id(pick_worker());
      u.mutable_create_lease()->set_dataset("d" + std::to_string(rng() % 4));
      break;
    case 3: {
      // A v3 update: the live decision, or one with an outcome mangled as a corrupt or foreign
      // journal would carry it (refused, changes nothing).
      const std::string worker = pick_worker(), dataset = "d" + std::to_string(rng() % 4);
      auto plan = st.PlanFetch(worker, dataset);
      if (plan.ok() && (plan->kind == FetchPlan::kLease || plan->kind == FetchPlan::kBackup)) {
        *u.mutable_create_lease() = st.DecideLease(*plan, worker, dataset, rng() % 3);
      } else {
        u.mutable_create_lease()->set_worker_id(worker);
        u.mutable_create_lease()->set_dataset(dataset);
        u.mutable_create_lease()->set_decided(true);
      }
      if (rng() % 3 == 0) {
        auto* c = u.mutable_create_lease();
        switch (rng() % 6) {
          case 0: c->set_lease_id(c->lease_id() + 1 + rng() % 3); break;
          case 1: c->set_begin(big()); break;
          case 2: c->set_end(big()); break;
          case 3: c->set_epoch(c->epoch() + 1); break;
          case 4: c->set_backup_of(pick_lease()); break;
          default: c->set_opens_epoch(!c->opens_epoch()); break;
        }
      }
      break;
    }
    case 4:
      u.mutable_progress()->set_lease_id(pick_lease());
      u.mutable_progress()->set_records_done(big());
      break;
    case 5:
      u.mutable_end_lease()->set_lease_id(pick_lease());
      u.mutable_end_lease()->set_reason(static_cast<LeaseEndReason>(rng() % 9));
      u.mutable_end_lease()->set_records_done(big());
      break;
    case 6: u.mutable_worker_lost()->set_worker_id(pick_worker()); break;
    case 7: u.mutable_save_checkpoint()->set_tag(rng() % 4 ? "c" + std::to_string(rng() % 3) : "bad tag"); break;
    case 8: u.mutable_restore_checkpoint()->set_tag("c" + std::to_string(rng() % 4)); break;
    case 9: {
      auto* a = u.mutable_set_allocation();
      a->set_worker_id(pick_worker());
      const double weights[] = {0, 1, -1, 1e9, 0.001, std::nan("")};
      a->set_weight(weights[rng() % 6]);
      a->set_shard_size(big());
      a->set_max_leases(static_cast<uint32_t>(big()));
      break;
    }
    case 10: u.mutable_delete_dataset()->set_dataset("d" + std::to_string(rng() % 5)); break;
    case 11: u.mutable_reset_dataset()->set_dataset("d" + std::to_string(rng() % 5)); break;
    default:
      u.mutable_set_tail_backup()->set_dataset("d" + std::to_string(rng() % 5));
      u.mutable_set_tail_backup()->set_enabled(rng() % 2);
  }
  return u;
}

TEST(ShardingFuzzTest, RandomUpdatesNeverCrashAndRefusalsChangeNothing) {
  std::mt19937_64 rng(20261130);
  int applied = 0, refused = 0;
  for (int run = 0; run < 40; ++run) {
    StateDriver d;
    for (int i = 0; i < 500; ++i) {
      Update u = RandomUpdate(rng, d.state());
      const std::string before = d.state().ToSnapshot().SerializeAsString();
      absl::Status s = d.Apply(u);
      if (s.ok()) {
        ++applied;
      } else {
        ++refused;
        ASSERT_EQ(d.state().ToSnapshot().SerializeAsString(), before)
            << "a refused update changed the state: " << u.ShortDebugString() << " -> " << s;
      }
      d.TakeCancelled();
    }
  }
  // Raw garbage as journal bytes: either it does not parse, or it applies or is refused.
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 64, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    Update u;
    if (!u.ParseFromString(bytes)) continue;
    StateDriver d;
    u.set_seq(d.state().last_seq() + 1);  // past the seq check, to the kind's own checks
    (void)d.state().ApplyChecked(u);
  }
  EXPECT_GT(applied, 2000);
  EXPECT_GT(refused, 2000);
}

}  // namespace
}  // namespace pacer
