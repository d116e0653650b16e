// Disk full: pacerd (in process) runs on a small tmpfs data dir; a
// ballast file fills it; updates then fail cleanly — UNAVAILABLE saying the disk is full, the
// process stays up (no abort), the journal-health metric says 0 — and once the tmpfs is grown
// (mount -o remount,size=...) the housekeeping step reopens the journal and consumption resumes.
// Every acknowledged completion is counted exactly once at the end (the service agrees with
// the ledger). Needs root (mount); skips with a message where mounting is not permitted.
// pacerd runs in the harness (tests/testing/pacerd_harness.h) on its simulated clock; the test
// runs production's housekeeping step (Housekeep) where the thread would.
#include <sys/mount.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::WaitFor;

constexpr auto Call = [](auto&&... a) { return CallAndWait(a...); };

// A tmpfs mounted for the test, unmounted (lazily) at the end.
class Tmpfs {
 public:
  explicit Tmpfs(std::string dir) : dir_(std::move(dir)) { fs::create_directories(dir_); }
  ~Tmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  // "" or why it could not mount.
  std::string Mount(int mb) {
    const std::string opts = "size=" + std::to_string(mb) + "m";
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, opts.c_str()) != 0) return std::strerror(errno);
    mounted_ = true;
    return "";
  }
  bool Resize(int mb) {
    const std::string opts = "size=" + std::to_string(mb) + "m";
    return ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) == 0;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// Writes zeros to `path` until the file system is full.
void FillUp(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::vector<char> chunk(64 << 10, 0);
  while (std::fwrite(chunk.data(), 1, chunk.size(), f) == chunk.size()) {
  }
  std::fclose(f);
}

double Metric(Pacerd& d, const std::string& name) {
  const std::string text = d.metrics()->RenderText();
  const auto pos = text.find("\n" + name + " ");
  return pos == std::string::npos ? -1 : std::stod(text.substr(pos + name.size() + 2));
}

// grpc.health.v1.Health/Check for the whole server, by hand (the project has no stubs for it):
// the reply is HealthCheckResponse{status = 1 SERVING | 2 NOT_SERVING}, i.e. bytes 08 0s.
int HealthStatus(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::ByteBuffer request, response;  // an empty HealthCheckRequest: service ""
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  if (!done.get_future().get().ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

TEST(DiskFullTest, UpdatesAreRefusedCleanlyThenResumeWhenSpaceReturnsNothingAcknowledgedLost) {
  testing::HarnessOptions ho;
  ho.start = false;  // once the tmpfs is mounted
  ho.adjust = [](PacerdOptions& o) {
    o.journal_retry_ms = 0;
    o.sharding.snapshot_every = 200;
    o.sharding.lease_timeout_ms = 3'600'000;
    o.sharding.worker_timeout_ms = 3'600'000;
  };
  testing::PacerdHarness h(ho);
  Tmpfs tmpfs(h.dir().Sub("mnt"));
  if (std::string why = tmpfs.Mount(24); !why.empty()) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << why << "): run as root to test a full disk";
  }
  h.mutable_options().data_dir = tmpfs.dir() + "/data";
  const absl::Status started = h.TryStart();
  ASSERT_TRUE(started.ok()) << started;
  ShardingServiceImpl& svc = *h->sharding();
  constexpr uint64_t kRecords = 200'000, kShard = 10;
  RegisterDatasetRequest rd;
  rd.mutable_spec()->set_name("train");
  rd.mutable_spec()->set_num_records(kRecords);
  rd.mutable_spec()->set_shard_size(kShard);
  RegisterDatasetResponse rdr;
  ASSERT_TRUE(Call(svc, &ShardingServiceImpl::RegisterDataset, rd, &rdr).ok());
  RegisterWorkerRequest rw;
  rw.set_worker_id("w");
  RegisterWorkerResponse rwr;
  ASSERT_TRUE(Call(svc, &ShardingServiceImpl::RegisterWorker, rw, &rwr).ok());

  uint64_t acknowledged = 0;  // records whose completion was acknowledged
  std::optional<Lease> pending;  // a completion sent but not acknowledged: retried until it is
  uint64_t request = 1;
  // One step of the consumer: complete the pending lease, or fetch and complete a new one.
  auto step = [&]() -> absl::Status {
    if (!pending) {
      FetchShardRequest f;
      f.set_worker_id("w");
      f.set_incarnation(rwr.incarnation());
      f.set_dataset("train");
      f.set_request_id(request);
      FetchShardResponse fr;
      if (absl::Status s = Call(svc, &ShardingServiceImpl::FetchShard, f, &fr); !s.ok()) return s;
      ++request;
      if (fr.outcome() != FetchShardResponse::LEASED) return absl::OutOfRangeError("no more data");
      pending = fr.lease();
    }
    CompleteShardRequest c;
    c.set_worker_id("w");
    c.set_incarnation(rwr.incarnation());
    c.set_lease_id(pending->lease_id());
    c.set_fencing_token(pending->fencing_token());
    CompleteShardResponse cr;
    if (absl::Status s = Call(svc, &ShardingServiceImpl::CompleteShard, c, &cr); !s.ok()) return s;
    acknowledged += pending->end() - pending->begin();
    pending.reset();
    return absl::OkStatus();
  };
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(step().ok());
  EXPECT_EQ(HealthStatus(h->address()), 1) << "SERVING";

  // The disk fills up: the next updates fail, cleanly.
  FillUp(tmpfs.dir() + "/ballast");
  absl::Status failed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (failed.ok() && std::chrono::steady_clock::now() < deadline) failed = step();
  ASSERT_FALSE(failed.ok()) << "the disk never filled up";
  std::cout << "first refusal: " << failed << std::endl;
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_NE(failed.message().find("disk full"), std::string::npos) << failed;
  // The housekeeping step reopens the journal; closing the failed database frees its WAL's
  // preallocated tail, so the first reopens may succeed on what that freed. The journal's own
  // footprint is bounded (snapshots delete what they cover, flushes recycle the WAL), so it can
  // go on for ever in what was freed: take the space again as it is freed, until reopening
  // fails too.
  int reopened = 0;
  for (int round = 0; round < 20; ++round) {
    const std::string ballast = tmpfs.dir() + "/ballast" + std::to_string(round);
    FillUp(ballast);
    h.Housekeep();
    if (!h->sharding()->journal_health().ok()) break;
    ++reopened;
    absl::Status s;
    for (int n = 1; s.ok() && std::chrono::steady_clock::now() < deadline; ++n) {
      s = step();
      if (n % 100 == 0) FillUp(ballast + "-" + std::to_string(n));
    }
    ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  }
  ASSERT_FALSE(h->sharding()->journal_health().ok()) << "the disk never stayed full";
  std::cout << "reopened " << reopened << " time(s) on space freed by the failed database" << std::endl;
  EXPECT_EQ(Metric(h.pacerd(), "pacer_journal_healthy{journal=\"sharding\"}"), 0);
  EXPECT_EQ(HealthStatus(h->address()), 2) << "NOT_SERVING";
  absl::Status refused = step();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("No space"), std::string::npos) << refused;

  // Space returns: the housekeeping step reopens the journal, the pending completion goes through.
  ASSERT_TRUE(tmpfs.Resize(64)) << std::strerror(errno);
  ASSERT_TRUE(WaitFor([&] {
    h.Housekeep();
    return h->sharding()->journal_health().ok();
  }, std::chrono::seconds(20))) << h->sharding()->journal_health();
  EXPECT_EQ(Metric(h.pacerd(), "pacer_journal_healthy{journal=\"sharding\"}"), 1);
  EXPECT_EQ(HealthStatus(h->address()), 1) << "SERVING again";
  EXPECT_EQ(Metric(h.pacerd(), "pacer_journal_recoveries_total{journal=\"sharding\"}"), reopened + 1);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(step().ok());

  ListDatasetsRequest lr;
  ListDatasetsResponse list;
  ASSERT_TRUE(Call(svc, &ShardingServiceImpl::ListDatasets, lr, &list).ok());
  EXPECT_EQ(list.datasets(0).records_done_total(), acknowledged) << "lost or counted twice";
  // And after a restart from the disk, the same.
  h.Restart();
  ASSERT_TRUE(h.ok());
  ListDatasetsResponse list2;
  ASSERT_TRUE(Call(*h->sharding(), &ShardingServiceImpl::ListDatasets, lr, &list2).ok());
  EXPECT_EQ(list2.datasets(0).records_done_total(), acknowledged);
}

}  // namespace
}  // namespace pacer
