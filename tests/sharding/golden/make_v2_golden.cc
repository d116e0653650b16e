// Writes tests/sharding/golden/v2-journal/ (a journal data dir in format v2) and
// v2-state.txtpb (the state it holds), with the v2 code: this file was compiled and run once
// against commit 09aaf17 (the last v2 commit) and is kept to show how the golden data was made;
// it is not built (the v2 APIs it calls have changed). The scenario covers every kind of update
// v2 had: three datasets (records shuffled over 2 epochs, files, a 2-partition stream), progress,
// completion, release, failure and poison quarantine, tail backups, allocations, a checkpoint
// saved and restored, a worker lost and one re-registered, and a snapshot with a tail after it.
//   g++ -std=c++20 -I. -Ibuild make_v2_golden.cc build/sharding_service/libpacer_sharding.a \
//     build/common/libpacer_common.a build/proto/libpacer_proto.a -lrocksdb -lprotobuf ...
#include <google/protobuf/text_format.h>

#include <fstream>
#include <iostream>
#include <random>

#include "sharding_service/sharding_service.h"
#include "sharding_service/sharding_state.h"

using namespace pacer;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: make_v2_golden JOURNAL_DIR STATE_TXTPB\n";
    return 2;
  }
  ShardingState state;
  JournalOptions jo;
  jo.dir = argv[1];
  auto journal = ShardingJournal::Open(
      jo, [](const ShardingSnapshot&) { return absl::OkStatus(); },
      [](const Update&) { return absl::OkStatus(); });
  if (!journal.ok()) {
    std::cerr << journal.status() << "\n";
    return 1;
  }
  uint64_t seq = 0;
  int64_t t = 1'700'000'000'000;
  auto apply = [&](Update u) -> bool {
    u.set_seq(seq + 1);
    u.set_time_ms(t += 7);
    if (!state.ApplyChecked(u).ok()) return false;
    ++seq;
    (*journal)->Append(u);
    return true;
  };
  auto dataset = [&](DatasetSpec spec) {
    Update u;
    *u.mutable_register_dataset()->mutable_spec() = spec;
    if (!apply(u)) std::abort();
  };
  DatasetSpec a;
  a.set_name("train");
  a.set_num_records(2'000);
  a.set_shard_size(50);
  a.set_batch_size(5);
  a.set_num_epochs(2);
  a.set_shuffle(SHUFFLE_RECORDS);
  a.set_seed(42);
  a.set_max_attempts(2);
  dataset(a);
  DatasetSpec f;
  f.set_name("files");
  for (int i = 0; i < 7; ++i) {
    auto* file = f.mutable_files()->add_files();
    file->set_path("/data/part-" + std::to_string(i));
    file->set_num_records(30 + 11 * i);
  }
  f.set_shard_size(25);
  f.set_num_epochs(1);
  f.set_shuffle(SHUFFLE_SHARDS);
  f.set_tail_backup(true);
  dataset(f);
  DatasetSpec s;
  s.set_name("clicks");
  auto* p0 = s.mutable_stream()->add_partitions();
  p0->set_id(0);
  auto* p1 = s.mutable_stream()->add_partitions();
  p1->set_id(1);
  p1->set_start_offset(1'000);
  s.set_shard_size(40);
  dataset(s);
  const std::vector<std::string> workers = {"w0", "w1", "w2", "w3"};
  for (const auto& w : workers) {
    Update u;
    u.mutable_register_worker()->set_worker_id(w);
    u.mutable_register_worker()->set_node(w == "w3" ? "n1" : "n0");
    apply(u);
  }
  const std::vector<std::string> names = {"train", "files", "clicks"};
  std::mt19937_64 rng(7);
  for (int step = 0; step < 900; ++step) {
    if (step == 120) {
      Update u;
      u.mutable_set_allocation()->set_worker_id("w1");
      u.mutable_set_allocation()->set_weight(0.5);
      u.mutable_set_allocation()->set_max_leases(2);
      apply(u);
    }
    if (step == 300) {
      Update u;
      u.mutable_save_checkpoint()->set_tag("ckpt-300");
      apply(u);
    }
    if (step == 420) {
      Update u;
      u.mutable_register_worker()->set_worker_id("w2");
      u.mutable_register_worker()->set_node("n0");
      apply(u);
    }
    if (step == 480) {
      Update u;
      u.mutable_restore_checkpoint()->set_tag("ckpt-300");
      apply(u);
    }
    if (step == 560) {
      Update u;
      u.mutable_worker_lost()->set_worker_id("w3");
      apply(u);
    }
    if (step == 600) {
      Update u;
      u.mutable_set_tail_backup()->set_dataset("train");
      u.mutable_set_tail_backup()->set_enabled(true);
      apply(u);
      (*journal)->WriteSnapshot(state.ToSnapshot());  // a snapshot, then a tail after it
    }
    const std::string& w = workers[rng() % (step < 560 ? 4 : 3)];
    const auto* rec = state.FindWorker(w);
    const int op = static_cast<int>(rng() % 10);
    if (op < 4 || rec->leases.empty()) {
      Update u;
      u.mutable_create_lease()->set_worker_id(w);
      u.mutable_create_lease()->set_dataset(names[rng() % names.size()]);
      apply(u);  // refused (nothing to lease, quota) is fine: nothing is journaled
      continue;
    }
    const uint64_t id = *std::next(rec->leases.begin(), rng() % rec->leases.size());
    const auto* l = state.FindLease(id);
    const uint64_t len = l->end - l->begin;
    Update u;
    if (op < 6) {
      u.mutable_progress()->set_lease_id(id);
      u.mutable_progress()->set_records_done(std::min(len, l->done + 1 + rng() % len));
    } else if (op < 8) {
      u.mutable_end_lease()->set_lease_id(id);
      u.mutable_end_lease()->set_reason(LEASE_COMPLETED);
      u.mutable_end_lease()->set_records_done(len);
    } else {
      u.mutable_end_lease()->set_lease_id(id);
      u.mutable_end_lease()->set_reason(op == 8 ? LEASE_RELEASED : LEASE_FAILED);
      u.mutable_end_lease()->set_records_done(l->done);
      u.mutable_end_lease()->set_detail(op == 8 ? "" : "decode error");
    }
    apply(u);
  }
  if (auto st = (*journal)->Flush(); !st.ok()) {
    std::cerr << st << "\n";
    return 1;
  }
  journal->reset();
  std::string text;
  google::protobuf::TextFormat::PrintToString(state.ToSnapshot(), &text);
  std::ofstream(argv[2]) << text;
  std::cerr << "wrote " << seq << " updates\n";
  return 0;
}
