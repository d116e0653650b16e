// Sharding-state scripts with golden output (tests/sharding/testdata/*.txt): what the sharding
// core decides and holds, step by step, as a reader wants to see it. No clock, no I/O: each
// command becomes the update the service would make (checked first as the service checks a
// request: CheckWorker / CheckLease), committed through ShardingState::Commit (Validate, then
// Apply) at a time the script sets. (tests/controller's scripts are the controller's.)
//
// A file is a sequence of blocks, as the controller's scripts (tests/pacerd/testdata):
//
//   # comments and blank lines are kept
//   <command>
//   ----
//   <what the state answered>
//   <a blank line>
//
// (a command may be written without the "----" block: the rewrite below adds it.)
//
// Commands (W a worker id, L a lease id, D a dataset name):
//   dataset D records=N shard=S [epochs=E] [batch=B] [max-attempts=A] [barrier] [tail-backup]
//   worker W [node=N]            registers W (again: a new incarnation, its leases end)
//   fetch W D [inc=I]            FetchShard by W's incarnation I (default: the current one)
//   progress W L DONE [inc=I] [token=T]   records_done of lease L (default token: L's)
//   complete W L [inc=I] [token=T]
//   release W L DONE / fail W L DONE [inc=I] [token=T]   ends L with DONE records done
//   expire L / lost W            the service's housekeeping: a lease timed out / W missed heartbeats
//   save TAG / restore TAG / drop-checkpoint TAG
//   allocate W [weight=X] [shard=S] [max-leases=M]
//   tail-backup D on|off / delete D / reset D
//   update <Update in text format>   a raw update, committed as it is (seq and time stamped)
//   at SECONDS                   the time of the updates that follow
//   state                        every dataset, epoch, lease, worker and checkpoint
//   ledger                       per dataset and epoch, the records the workers reported done and
//                                the state accepted: how many once, twice or more, and not yet
//   replay                       replays every committed update on a fresh state and compares it
//
// Every update a command makes is committed; a refused one prints "refused: ..." and the runner
// checks that the state did not change ("(state unchanged)", or "STATE CHANGED" when it did).
// A lease whose holder is told it ended prints "cancelled: W lease L".
//
// The ledger follows the workers' reports: a restore brings back the ledger as it was at the
// checkpoint (the model goes back too), a reset or delete forgets the dataset's.
//
// A changed output fails the test with both texts. After an intended change, rewrite the goldens
// and review the diff:  PACER_REWRITE_GOLDENS=1 build/bin/sharding_script_test
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sharding_service/sharding_state.h"
#include "tests/testing/golden_scripts.h"

namespace pacer {
namespace {

constexpr int64_t kStartMs = 1'700'000'000'000;

// Per dataset and epoch: how many times each record was reported done (and accepted).
using Ledger = std::map<std::string, std::map<uint32_t, std::vector<uint32_t>>>;

class ScriptRun {
 public:
  std::string Do(const std::string& line) {
    std::vector<std::string> args = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (args.empty()) return "error: empty command";
    const std::string cmd = args[0];
    if (cmd == "update") {
      Update u;
      if (!google::protobuf::TextFormat::ParseFromString(line.substr(line.find("update") + 6), &u)) {
        return "error: not an Update in text format";
      }
      return Commit(std::move(u));
    }
    std::map<std::string, std::string> kv;
    std::vector<std::string> pos;
    for (size_t i = 1; i < args.size(); ++i) {
      const size_t eq = args[i].find('=');
      if (eq == std::string::npos) pos.push_back(args[i]);
      else kv[args[i].substr(0, eq)] = args[i].substr(eq + 1);
    }
    auto num = [&](const std::string& key, uint64_t def) {
      auto it = kv.find(key);
      return it == kv.end() ? def : std::stoull(it->second);
    };
    auto has = [&](const std::string& flag) {
      return std::find(pos.begin(), pos.end(), flag) != pos.end();
    };
    Update u;
    if (cmd == "dataset" && !pos.empty()) {
      DatasetSpec* s = u.mutable_register_dataset()->mutable_spec();
      s->set_name(pos[0]);
      s->set_num_records(num("records", 0));
      s->set_shard_size(num("shard", 0));
      s->set_num_epochs(static_cast<uint32_t>(num("epochs", 1)));
      s->set_batch_size(static_cast<uint32_t>(num("batch", 0)));
      s->set_max_attempts(static_cast<uint32_t>(num("max-attempts", 0)));
      s->set_epoch_barrier(has("barrier"));
      s->set_tail_backup(has("tail-backup"));
      return Commit(std::move(u));
    }
    if (cmd == "worker" && pos.size() == 1) {
      u.mutable_register_worker()->set_worker_id(pos[0]);
      u.mutable_register_worker()->set_node(kv.count("node") ? kv["node"] : "n0");
      std::string out = Commit(std::move(u));
      if (const auto* w = state_.FindWorker(pos[0]); w && out.rfind("ok", 0) == 0) {
        out = absl::StrCat("incarnation ", w->incarnation, out.substr(2));
      }
      return out;
    }
    if (cmd == "fetch" && pos.size() == 2) {
      const std::string& w = pos[0];
      const std::string before = state_.ToSnapshot().SerializeAsString();
      if (absl::Status s = state_.CheckWorker(w, num("inc", Incarnation(w))); !s.ok()) {
        return Refused(s) + Unchanged(before);
      }
      absl::StatusOr<FetchDecision> d = state_.DecideFetch(w, pos[1], ++request_id_);
      if (!d.ok()) return Refused(d.status()) + Unchanged(before);
      if (d->kind == FetchPlan::kWait) return "wait: " + d->reason;
      if (d->kind == FetchPlan::kEndOfData) return "end of data";
      std::string out = Commit(*std::move(d->update));
      if (out.rfind("ok", 0) != 0) return out;
      const ShardingState::LeaseRec& l = *state_.FindLease(state_.last_lease_id());
      return absl::StrCat(d->kind == FetchPlan::kBackup ? "backup " : "", "lease ", LeaseText(l),
                          out.substr(2));
    }
    if ((cmd == "progress" || cmd == "release" || cmd == "fail") && pos.size() == 3) {
      return Report(cmd, pos[0], std::stoull(pos[1]), std::stoull(pos[2]), kv);
    }
    if (cmd == "complete" && pos.size() == 2) {
      return Report(cmd, pos[0], std::stoull(pos[1]), 0, kv);
    }
    if (cmd == "expire" && pos.size() == 1) {
      u.mutable_end_lease()->set_lease_id(std::stoull(pos[0]));
      u.mutable_end_lease()->set_reason(LEASE_EXPIRED);
      if (const auto* l = state_.FindLease(std::stoull(pos[0]))) {
        u.mutable_end_lease()->set_records_done(l->done);
      }
      return Commit(std::move(u));
    }
    if (cmd == "lost" && pos.size() == 1) {
      u.mutable_worker_lost()->set_worker_id(pos[0]);
      return Commit(std::move(u));
    }
    if (cmd == "save" && pos.size() == 1) {
      u.mutable_save_checkpoint()->set_tag(pos[0]);
      std::string out = Commit(std::move(u));
      if (out.rfind("ok", 0) == 0) saved_ledgers_[pos[0]] = ledger_;
      return out;
    }
    if (cmd == "restore" && pos.size() == 1) {
      u.mutable_restore_checkpoint()->set_tag(pos[0]);
      std::string out = Commit(std::move(u));
      if (out.rfind("ok", 0) == 0) ledger_ = saved_ledgers_[pos[0]];
      return out;
    }
    if (cmd == "drop-checkpoint" && pos.size() == 1) {
      u.mutable_delete_checkpoint()->set_tag(pos[0]);
      return Commit(std::move(u));
    }
    if (cmd == "allocate" && pos.size() == 1) {
      SetAllocationUpdate* a = u.mutable_set_allocation();
      a->set_worker_id(pos[0]);
      a->set_weight(kv.count("weight") ? std::stod(kv["weight"]) : 0);
      a->set_shard_size(num("shard", 0));
      a->set_max_leases(static_cast<uint32_t>(num("max-leases", 0)));
      return Commit(std::move(u));
    }
    if (cmd == "tail-backup" && pos.size() == 2) {
      u.mutable_set_tail_backup()->set_dataset(pos[0]);
      u.mutable_set_tail_backup()->set_enabled(pos[1] == "on");
      return Commit(std::move(u));
    }
    if ((cmd == "delete" || cmd == "reset") && pos.size() == 1) {
      if (cmd == "delete") u.mutable_delete_dataset()->set_dataset(pos[0]);
      else u.mutable_reset_dataset()->set_dataset(pos[0]);
      std::string out = Commit(std::move(u));
      if (out.rfind("ok", 0) == 0) ledger_.erase(pos[0]);
      return out;
    }
    if (cmd == "at" && pos.size() == 1) {
      now_ms_ = kStartMs + static_cast<int64_t>(std::stod(pos[0]) * 1000);
      return "ok";
    }
    if (cmd == "state") return State();
    if (cmd == "ledger") return LedgerText();
    if (cmd == "replay") return Replay();
    return "error: unknown command or wrong arguments: '" + line + "'";
  }

 private:
  uint64_t Incarnation(const std::string& w) const {
    const auto* rec = state_.FindWorker(w);
    return rec ? rec->incarnation : 0;
  }

  static std::string Refused(const absl::Status& s) {
    return absl::StrCat("refused: ", absl::StatusCodeToString(s.code()), ": ", s.message());
  }

  // A report by a worker on lease `id`, checked as the service checks it, then committed.
  std::string Report(const std::string& cmd, const std::string& w, uint64_t id, uint64_t done,
                     std::map<std::string, std::string>& kv) {
    const ShardingState::LeaseRec* l = state_.FindLease(id);
    const uint64_t inc = kv.count("inc") ? std::stoull(kv["inc"]) : Incarnation(w);
    const uint64_t token = kv.count("token") ? std::stoull(kv["token"]) : (l ? l->token : 0);
    const std::string before = state_.ToSnapshot().SerializeAsString();
    if (absl::Status s = state_.CheckLease(w, inc, id, token); !s.ok()) {
      return Refused(s) + Unchanged(before);
    }
    Update u;
    if (cmd == "progress") {
      u.mutable_progress()->set_lease_id(id);
      u.mutable_progress()->set_records_done(done);
    } else {
      EndLeaseUpdate* e = u.mutable_end_lease();
      e->set_lease_id(id);
      e->set_reason(cmd == "complete" ? LEASE_COMPLETED
                    : cmd == "release" ? LEASE_RELEASED
                                       : LEASE_FAILED);
      e->set_records_done(cmd == "complete" ? l->end - l->begin : done);
    }
    return Commit(std::move(u));
  }

  std::string Unchanged(const std::string& before) const {
    return state_.ToSnapshot().SerializeAsString() == before ? "\n(state unchanged)"
                                                             : "\nSTATE CHANGED";
  }

  // Commits `u`; "ok" plus what its effects were, or "refused: ..." and whether the state stayed.
  std::string Commit(Update u) {
    const std::string before = state_.ToSnapshot().SerializeAsString();
    // The done prefixes before, for the ledger (a backup pair counts once in the state; the
    // ledger counts what each worker reported).
    std::map<uint64_t, ShardingState::LeaseRec> leases_before(state_.leases().begin(),
                                                             state_.leases().end());
    absl::StatusOr<ApplyEffects> effects = state_.Commit(&u, now_ms_);
    if (!effects.ok()) return Refused(effects.status()) + Unchanged(before);
    log_.push_back(u);
    if (u.has_progress() || u.has_end_lease()) {
      const uint64_t id = u.has_progress() ? u.progress().lease_id() : u.end_lease().lease_id();
      const ShardingState::LeaseRec& was = leases_before.at(id);
      uint64_t done = was.done;
      if (const auto* now = state_.FindLease(id)) {
        done = now->done;
      } else if (const EndedLease* e = state_.FindEnded(was.worker, id)) {
        done = e->records_done();
      }
      auto& counts = ledger_[was.dataset][was.epoch];
      const uint64_t size = state_.FindDataset(was.dataset)->records_per_epoch;
      if (counts.size() < size) counts.resize(size);
      for (uint64_t p = was.done_pos(); p < was.begin + done; ++p) counts[p]++;
    }
    std::string out = "ok";
    for (const auto& [w, id] : effects->cancelled_leases) {
      absl::StrAppend(&out, "\ncancelled: ", w, " lease ", id);
    }
    return out;
  }

  static std::string LeaseText(const ShardingState::LeaseRec& l) {
    return absl::StrFormat("%d: %s %s epoch %d [%d,%d) done %d token %d%s", l.id, l.worker,
                           l.dataset, l.epoch, l.begin, l.end, l.done, l.token,
                           l.partner ? absl::StrCat(l.backup ? " backup of " : " backed up by ",
                                                    l.partner)
                                     : "");
  }

  std::string State() const {
    std::vector<std::string> out;
    out.push_back(absl::StrCat("seq ", state_.last_seq()));
    for (const auto& [name, ds] : state_.datasets()) {
      std::string line = absl::StrFormat(
          "dataset %s: next epoch %d, completed %d, done %d, requeues %d, quarantined %d", name,
          ds.next_epoch, ds.completed_epochs, ds.records_done_total, ds.requeues_total,
          ds.records_quarantined_total);
      if (ds.tail_backup) absl::StrAppend(&line, ", tail backup");
      if (ds.failed) absl::StrAppend(&line, ", FAILED: ", ds.failure);
      if (ds.Finished()) absl::StrAppend(&line, ", finished");
      out.push_back(line);
      for (const auto& ep : ds.open) {
        for (const auto& p : ep.partitions) {
          std::vector<std::string> requeue;
          for (const auto& r : p.requeue) {
            requeue.push_back(absl::StrFormat("[%d,%d)x%d", r.begin, r.end, r.attempts));
          }
          out.push_back(absl::StrFormat(
              "  epoch %d: done %d/%d, quarantined %d, frontier %d, requeue %s, active leases %d",
              ep.epoch, p.done, p.limit - p.start, p.quarantined, p.frontier,
              requeue.empty() ? "-" : absl::StrJoin(requeue, " "), ep.active_leases));
        }
      }
      for (const auto& q : ds.quarantined) {
        out.push_back(absl::StrFormat("  quarantined epoch %d [%d,%d) after %d attempts: %s",
                                      q.epoch(), q.begin(), q.end(), q.attempts(), q.detail()));
      }
    }
    for (const auto& [id, l] : state_.leases()) out.push_back("lease " + LeaseText(l));
    for (const auto& [id, w] : state_.workers()) {
      std::string line = absl::StrFormat("worker %s: incarnation %d", id, w.incarnation);
      if (w.lost) absl::StrAppend(&line, ", lost");
      if (w.weight != 1.0 || w.shard_size || w.max_leases) {
        absl::StrAppendFormat(&line, ", weight %g shard %d max-leases %d", w.weight, w.shard_size,
                              w.max_leases);
      }
      if (!w.leases.empty()) absl::StrAppend(&line, ", leases ", absl::StrJoin(w.leases, " "));
      std::vector<std::string> ended;
      for (const auto& [lid, e] : w.ended) {
        ended.push_back(absl::StrCat(lid, " (", LeaseEndReasonName(e.reason()), " ",
                                     e.records_done(), ")"));
      }
      if (!ended.empty()) absl::StrAppend(&line, ", ended ", absl::StrJoin(ended, ", "));
      out.push_back(line);
    }
    const ShardingSnapshot snap = state_.ToSnapshot();
    for (const auto& cp : snap.checkpoints()) {
      std::vector<std::string> at;
      for (const auto& d : cp.datasets()) {
        uint64_t done = 0;
        for (const auto& e : d.epochs())
          for (const auto& p : e.partitions()) done += p.done();
        at.push_back(absl::StrFormat("%s next epoch %d, done %d in open epochs", d.dataset(), d.next_epoch(), done));
      }
      out.push_back(absl::StrCat("checkpoint ", cp.tag(), ": ",
                                 at.empty() ? "-" : absl::StrJoin(at, ", ")));
    }
    return absl::StrJoin(out, "\n");
  }

  std::string LedgerText() const {
    std::vector<std::string> out;
    for (const auto& [name, epochs] : ledger_) {
      const auto* ds = state_.FindDataset(name);
      for (const auto& [epoch, counts] : epochs) {
        uint64_t once = 0, more = 0, none = 0;
        const uint64_t size = ds ? ds->records_per_epoch : counts.size();
        for (uint64_t p = 0; p < size; ++p) {
          const uint32_t c = p < counts.size() ? counts[p] : 0;
          (c == 0 ? none : c == 1 ? once : more)++;
        }
        out.push_back(absl::StrFormat("%s epoch %d: %d once, %d more than once, %d not yet", name,
                                      epoch, once, more, none));
      }
    }
    return out.empty() ? "nothing reported" : absl::StrJoin(out, "\n");
  }

  std::string Replay() const {
    ShardingState fresh;
    for (const Update& u : log_) {
      if (absl::Status s = fresh.ApplyChecked(u); !s.ok()) {
        return absl::StrCat("replay refused update ", u.seq(), ": ", s.ToString());
      }
    }
    const bool same = fresh.ToSnapshot().SerializeAsString() ==
                      state_.ToSnapshot().SerializeAsString();
    return absl::StrCat("replay of ", log_.size(), " updates: ",
                        same ? "the same state" : "A DIFFERENT STATE");
  }

  ShardingState state_;
  std::vector<Update> log_;
  int64_t now_ms_ = kStartMs;
  uint64_t request_id_ = 0;
  Ledger ledger_;
  std::map<std::string, Ledger> saved_ledgers_;
};

// Runs a script; returns the file as it should read with the actual outputs.
std::string RunScript(const std::string& text) {
  ScriptRun run;
  return testing_golden::RewriteScript(text, [&run](const std::string& line) { return run.Do(line); });
}

class ShardingScriptTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardingScriptTest, OutputMatchesTheGolden) {
  const std::string path = std::string(PACER_SHARDING_TESTDATA_DIR) + "/" + GetParam();
  const std::string want = testing_golden::ReadScript(path);
  const std::string got = RunScript(want);
  if (testing_golden::RewriteIfAsked(path, got)) GTEST_SKIP() << "rewrote " << path;
  EXPECT_EQ(got, want) << "the sharding state's answers differ from " << path << testing_golden::kRewriteHint;
}

INSTANTIATE_TEST_SUITE_P(Scripts, ShardingScriptTest,
                         ::testing::ValuesIn(testing_golden::ScriptNames(PACER_SHARDING_TESTDATA_DIR)),
                         testing_golden::TestNameOf);

}  // namespace
}  // namespace pacer
