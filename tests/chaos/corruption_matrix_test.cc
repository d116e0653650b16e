// Corruption matrix: a data dir written by two pacerd runs (the
// second one's recovery moved the first one's WAL into an SST) is damaged in each way below
// while pacerd is stopped, and pacerd (in process, the same Start() main.cc runs) is started on
// it. Each case must either refuse to start with DATA_LOSS (or FAILED_PRECONDITION) naming a
// file of the data dir, or start with exactly the state acknowledged before the damage (the
// sharding state compared field by field, and the controller's audit record still there) —
// never with older state and no error. Prints the table case -> outcome. Then an operator
// accepts one loss explicitly (--accept-data-loss) and that is recorded and audited. One
// PacerdHarness (tests/testing/pacerd_harness.h) gives the temp dir, port and clock; the test
// damages data dirs between starts, so it starts pacerd on each itself (TryStart) and reads
// the refusal.
#include <gtest/gtest.h>
#include <google/protobuf/util/message_differencer.h>
#include <rocksdb/db.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>

#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr auto Call = [](auto&&... a) { return CallAndWait(a...); };

constexpr char kMarker[] = "corruption-matrix marker";

testing::HarnessOptions Options() {
  testing::HarnessOptions o;
  o.start = false;
  o.adjust = [](PacerdOptions& p) {
    p.sharding.snapshot_every = 25;
    p.sharding.lease_timeout_ms = 3'600'000;
    p.sharding.worker_timeout_ms = 3'600'000;
  };
  return o;
}

// Stops the harness's pacerd and starts it on `data_dir`: why it did not start, if it did not.
absl::Status StartOn(testing::PacerdHarness& h, const std::string& data_dir, bool accept = false) {
  h.Stop();
  h.mutable_options().data_dir = data_dir;
  h.mutable_options().accept_data_loss = accept;
  return h.TryStart();
}

// Registers `worker` and completes `shards` shards.
void Consume(ShardingServiceImpl& svc, const std::string& worker, int shards) {
  RegisterWorkerRequest rw;
  rw.set_worker_id(worker);
  RegisterWorkerResponse rwr;
  ASSERT_TRUE(Call(svc, &ShardingServiceImpl::RegisterWorker, rw, &rwr).ok());
  for (int i = 0; i < shards; ++i) {
    FetchShardRequest f;
    f.set_worker_id(worker);
    f.set_incarnation(rwr.incarnation());
    f.set_dataset("train");
    FetchShardResponse fr;
    ASSERT_TRUE(Call(svc, &ShardingServiceImpl::FetchShard, f, &fr).ok());
    ASSERT_EQ(fr.outcome(), FetchShardResponse::LEASED);
    CompleteShardRequest c;
    c.set_worker_id(worker);
    c.set_incarnation(rwr.incarnation());
    c.set_lease_id(fr.lease().lease_id());
    c.set_fencing_token(fr.lease().fencing_token());
    CompleteShardResponse cr;
    ASSERT_TRUE(Call(svc, &ShardingServiceImpl::CompleteShard, c, &cr).ok());
  }
}

bool AuditHas(Pacerd& d, const std::string& text) {
  ListActionsRequest req;
  ListActionsResponse resp;
  d.reconciler()->ListActions(req, &resp);
  for (const auto& a : resp.actions()) {
    if (a.reason().find(text) != std::string::npos) return true;
  }
  return false;
}

// Files of the journal folder by kind.
std::vector<fs::path> Files(const std::string& dir, const std::string& suffix,
                            const std::string& prefix = "") {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        name.rfind(prefix, 0) == 0) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

fs::path LiveWal(const std::string& data_dir) { return testing::LiveWal(data_dir + "/journal"); }

void Flip(const fs::path& file, int percent) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = fs::file_size(file);
  const uint64_t at = std::min<uint64_t>(size * percent / 100, size > 16 ? size - 16 : 0);
  f.seekg(static_cast<std::streamoff>(at));
  char buf[16] = {};
  f.read(buf, 16);
  for (char& c : buf) c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(buf, 16);
}

void CorruptSnapshot(const std::string& data_dir) {
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), data_dir + "/journal", &db).ok());
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  std::string newest(9, '\xff');
  newest[0] = 's';
  it->SeekForPrev(newest);
  ASSERT_TRUE(it->Valid() && it->key()[0] == 's') << "no snapshot to corrupt";
  const std::string key = it->key().ToString();
  it.reset();
  rocksdb::WriteOptions wo;
  wo.sync = true;
  ASSERT_TRUE(db->Put(wo, key, "\x0a\xff\xff garbage, not a ShardingSnapshot").ok());
  delete db;
}

struct Case {
  std::string name;
  std::function<void(const std::string& data_dir)> damage;
};

TEST(CorruptionMatrixTest, DamageIsRefusedNamingTheFileOrEveryAcknowledgedUpdateIsKept) {
  testing::PacerdHarness h(Options());
  const TempDir& dir = h.dir();
  const std::string base = dir.Sub("base");
  ShardingSnapshot expected;
  {
    const absl::Status d = StartOn(h, base);
    ASSERT_TRUE(d.ok()) << d;
    RegisterDatasetRequest rd;
    rd.mutable_spec()->set_name("train");
    rd.mutable_spec()->set_num_records(2000);
    rd.mutable_spec()->set_shard_size(10);
    RegisterDatasetResponse rdr;
    ASSERT_TRUE(Call(*h->sharding(), &ShardingServiceImpl::RegisterDataset, rd, &rdr).ok());
    Consume(*h->sharding(), "w", 30);
    h->reconciler()->RecordOperatorEvent(kMarker);
    h.Stop();
  }
  {
    const absl::Status d = StartOn(h, base);  // its recovery flushed run 1's WAL into an SST
    ASSERT_TRUE(d.ok()) << d;
    Consume(*h->sharding(), "w", 30);
    expected = h->sharding()->SnapshotForTest();
    h.Stop();
  }
  ASSERT_FALSE(LiveWal(base).empty());
  ASSERT_FALSE(Files(base + "/journal", ".sst").empty()) << "no SST: the matrix would miss a case";

  const std::vector<Case> cases = {
      {"WAL truncated to half", [](const std::string& d) { fs::resize_file(LiveWal(d), fs::file_size(LiveWal(d)) / 2); }},
      {"WAL: last 100 bytes cut", [](const std::string& d) { fs::resize_file(LiveWal(d), fs::file_size(LiveWal(d)) - 100); }},
      {"WAL truncated to zero", [](const std::string& d) { fs::resize_file(LiveWal(d), 0); }},
      {"WAL: 16 bytes flipped at 10%", [](const std::string& d) { Flip(LiveWal(d), 10); }},
      {"WAL: 16 bytes flipped at 50%", [](const std::string& d) { Flip(LiveWal(d), 50); }},
      {"WAL: 16 bytes flipped at 90%", [](const std::string& d) { Flip(LiveWal(d), 90); }},
      {"WAL deleted", [](const std::string& d) { fs::remove(LiveWal(d)); }},
      {"journal folder deleted", [](const std::string& d) { fs::remove_all(d + "/journal"); }},
      {"journal folder emptied", [](const std::string& d) {
         for (const auto& e : fs::directory_iterator(d + "/journal")) fs::remove_all(e.path());
       }},
      {"controller folder deleted", [](const std::string& d) { fs::remove_all(d + "/controller"); }},
      {"CURRENT deleted", [](const std::string& d) { fs::remove(d + "/journal/CURRENT"); }},
      {"MANIFEST deleted", [](const std::string& d) {
         for (const auto& m : Files(d + "/journal", "", "MANIFEST-")) fs::remove(m);
       }},
      {"snapshot corrupted (garbage value)", [](const std::string& d) { CorruptSnapshot(d); }},
      {"SST: 16 bytes flipped at 50%", [](const std::string& d) { Flip(Files(d + "/journal", ".sst").back(), 50); }},
      {"high-water mark deleted", [](const std::string& d) { fs::remove(d + "/journal.hwm"); }},
      {"IDENTITY deleted (adopted again)", [](const std::string& d) { fs::remove(d + "/IDENTITY"); }},
  };

  std::vector<std::pair<std::string, std::string>> table;
  int index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string data_dir = dir.Sub("case" + std::to_string(index++));
    fs::copy(base, data_dir, fs::copy_options::recursive);
    c.damage(data_dir);
    if (HasFatalFailure()) return;
    const absl::Status d = StartOn(h, data_dir);
    std::string outcome;
    if (!d.ok()) {
      const auto code = d.code();
      EXPECT_TRUE(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kFailedPrecondition)
          << d;
      EXPECT_NE(d.message().find(data_dir), std::string::npos)
          << "the refusal does not name a file of the data dir: " << d;
      EXPECT_EQ(std::string(d.message()).find('\n'), std::string::npos) << "not one line";
      outcome = "refused: " + d.ToString();
      for (size_t at; (at = outcome.find(data_dir)) != std::string::npos;) {
        outcome.replace(at, data_dir.size(), "DATA");
      }
    } else {
      const ShardingSnapshot got = h->sharding()->SnapshotForTest();
      const bool same = google::protobuf::util::MessageDifferencer::Equals(got, expected);
      const bool audit = AuditHas(h.pacerd(), kMarker);
      EXPECT_TRUE(same) << "started with other state: seq " << got.seq() << " instead of "
                        << expected.seq();
      EXPECT_TRUE(audit) << "started without the controller's audit record";
      outcome = same && audit ? "started with every acknowledged update (seq " +
                                    std::to_string(got.seq()) + ", audit kept)"
                              : "FAILED: started with older state (seq " + std::to_string(got.seq()) + ")";
    }
    if (outcome.size() > 230) outcome = outcome.substr(0, 227) + "...";
    table.push_back({c.name, outcome});
  }
  std::cout << "\ncorruption matrix (acknowledged: seq " << expected.seq() << ")\n";
  for (const auto& [name, outcome] : table) {
    std::cout << "  " << std::left << std::setw(36) << name << " " << outcome << "\n";
  }
  std::cout << std::endl;

  // An operator accepts the loss of a deleted journal folder, explicitly: started empty, the
  // loss logged, recorded in the data dir, audited and counted; the next start needs no flag.
  const std::string lost = dir.Sub("accepted");
  fs::copy(base, lost, fs::copy_options::recursive);
  fs::remove_all(lost + "/journal");
  ASSERT_FALSE(StartOn(h, lost).ok());
  {
    const absl::Status d = StartOn(h, lost, /*accept=*/true);
    ASSERT_TRUE(d.ok()) << d;
    EXPECT_EQ(h->sharding()->SnapshotForTest().seq(), 0u);
    EXPECT_TRUE(AuditHas(h.pacerd(), "--accept-data-loss")) << "the accepted loss is not audited";
    EXPECT_TRUE(AuditHas(h.pacerd(), kMarker)) << "the controller store was intact";
    EXPECT_NE(h->metrics()->RenderText().find("pacer_data_loss_accepted_total 1"), std::string::npos);
  }
  const std::string record = testing::ReadFileOrEmpty(lost + "/DATA-LOSS-ACCEPTED");
  EXPECT_NE(record.find("acknowledged updates are missing"), std::string::npos) << record;
  const absl::Status again = StartOn(h, lost);
  EXPECT_TRUE(again.ok()) << again;
}

}  // namespace
}  // namespace pacer
