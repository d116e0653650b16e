// ha_bench: pacerd with its journals in etcd (--journal etcd://...), measured in one run on this
// machine, against a 3-member etcd cluster on loopback that it starts itself (Debian's etcd).
//
//   1. Durable fetch+complete pairs/s over gRPC on loopback at 1, 16 and 256 concurrent clients:
//      an in-process pacerd with its journal in etcd beside one with the RocksDB journal (fsync
//      on) in a temp data dir, and the ratio etcd / RocksDB (target at 256 clients: >= 0.5).
//      Each client drives the new path, as the SDK's ShardReader does: one CompleteShard that
//      completes its lease and leases the next shard (next_dataset), one durable call a pair.
//      Beside each figure: journal batches (RocksDB: WAL fsyncs; etcd: transactions) per 1000
//      updates and the mean time to write one. Each figure is the median of R windows; in a
//      round the RocksDB and the etcd window run one after the other.
//   2. Failover time over N failovers: two pacerd processes (the built pacerd binary, both
//      --journal etcd://..., --election-ttl-s 2), one client (the C++ SDK, ShardingClient, with
//      both addresses) leasing continuously. The leader is kill -9'ed and started again at once
//      (a standby now); the time from the kill to the first lease the client is granted by the
//      new leader. p50 / p99 (nearest rank) / max; target p99 < 5 s.
//
// Usage: ha_bench [--json] [--seconds S] [--rounds R] [--failovers N] [--keep-logs DIR]
//   --seconds: each throughput window (default 2); --rounds: windows per figure (default 3;
//   0 skips part 1); --failovers: how many (default 20; 0 skips part 2); --keep-logs: where
//   part 2's pacerd logs are copied.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/durable_loops.h"
#include "cmd/pacerd/pacerd.h"
#include "journal/etcd_client.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/sharding_client.h"

namespace pacer::bench {
namespace {

using testing::EtcdCluster;
using testing::Subprocess;
using testing::TempDir;

const std::string kJobToken(64, 'j');
const std::string kAdminToken(64, 'k');

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// ---- 1. Pairs/s, etcd beside RocksDB ----
struct Throughput {
  std::map<int, Window> rocks, etcd;  // by clients: medians of the rounds
};

Window MedianWindow(const std::vector<Window>& ws) {
  auto median_of = [&](double Window::*field) {
    std::vector<double> v;
    for (const Window& w : ws) v.push_back(w.*field);
    return Median(v);
  };
  Window out;
  out.shards_per_s = median_of(&Window::shards_per_s);
  out.batches_per_1000 = median_of(&Window::batches_per_1000);
  out.marks_per_1000 = median_of(&Window::marks_per_1000);
  out.write_ms = median_of(&Window::write_ms);
  return out;
}

// The in-process pacerd's leadership in etcd ended (its lease lapsed under load, or a write was
// fenced): its figures would be refusals, so the run stops with the reason.
std::atomic<bool> g_leadership_lost{false};
std::mutex g_lost_mu;
std::string g_lost_why;

Throughput MeasureThroughput(const EtcdCluster& cluster, double seconds, int rounds) {
  PacerdOptions etcd_options;
  etcd_options.journal = "etcd://" + cluster.endpoints_csv() + "/bench/1";
  etcd_options.job_token = kJobToken;
  etcd_options.admin_token = kAdminToken;
  etcd_options.on_leadership_lost = [](const std::string& why) {
    std::lock_guard<std::mutex> l(g_lost_mu);
    g_lost_why = why;
    g_leadership_lost = true;
  };
  DurablePacerd rocks;  // RocksDB, sync=true
  DurablePacerd etcd(etcd_options);
  Throughput out;
  for (int clients : {1, 16, 256}) {
    std::vector<Window> r, e;
    for (int round = 0; round < rounds; ++round) {
      r.push_back(rocks.RunWindow(clients, /*combined=*/true, seconds));
      e.push_back(etcd.RunWindow(clients, /*combined=*/true, seconds));
      if (g_leadership_lost) {
        std::lock_guard<std::mutex> l(g_lost_mu);
        std::cerr << "ha_bench: the in-process pacerd lost its leadership in etcd (" << g_lost_why
                  << "); no figure\n";
        std::exit(1);
      }
    }
    out.rocks[clients] = MedianWindow(r);
    out.etcd[clients] = MedianWindow(e);
    std::cerr << "  " << clients << " clients done (load " << LoadAverage() << ")\n";
  }
  return out;
}

// ---- 2. Failover ----
bool Accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

void WriteToken(const std::string& path, const std::string& token) {
  std::ofstream(path) << token << "\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

// One SDK client leasing continuously on its own thread: Fetch once, then CompleteAndFetch
// (complete the lease, lease the next shard) again and again. After Arm(t), it notes when the
// first lease arrives from a call that ended after t and either began after t or had to retry
// (an attempt failed: the leader it reached died). With the old leader killed and reaped by t
// (a standby does not listen), that lease was granted by the new leader.
class LeasingClient {
 public:
  explicit LeasingClient(std::unique_ptr<ShardingClient> client)
      : client_(std::move(client)), thread_([this] { Run(); }) {}
  ~LeasingClient() {
    stop_ = true;
    client_->Cancel();
    thread_.join();
  }

  void Arm(Clock::time_point dead) {
    std::lock_guard<std::mutex> l(mu_);
    armed_after_ = dead;
    granted_.reset();
  }
  // The end of the first such call, once there is one; nullopt past `timeout`.
  std::optional<Clock::time_point> WaitGranted(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return granted_.has_value(); });
    return granted_;
  }
  // Waits until the client holds `n` more leases than when `since` was read.
  bool WaitLeases(uint64_t since, uint64_t n, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return leases_ >= since + n; });
  }
  uint64_t leases() {
    std::lock_guard<std::mutex> l(mu_);
    return leases_;
  }
  uint64_t errors() const { return errors_; }

 private:
  void Run() {
    std::optional<Lease> lease;
    while (!stop_) {
      const auto start = Clock::now();
      const uint64_t retried_before = client_->leasing_stats().retried_attempts;
      std::optional<Lease> next;
      absl::Status status;
      if (!lease) {
        auto f = client_->Fetch("train");
        status = f.status();
        if (f.ok() && f->outcome() == FetchShardResponse::LEASED) next = f->lease();
      } else {
        auto c = client_->CompleteAndFetch(*lease, "train");
        status = c.status();
        if (c.ok() && c->has_next() && c->next().outcome() == FetchShardResponse::LEASED) {
          next = c->next().lease();
        }
      }
      if (!status.ok()) {
        if (stop_) return;
        ++errors_;
        if (ShardingClient::IsIncarnationGone(status)) (void)client_->Reregister();
      }
      lease = next;
      if (!next) continue;
      const auto end = Clock::now();
      const bool retried = client_->leasing_stats().retried_attempts > retried_before;
      {
        std::lock_guard<std::mutex> l(mu_);
        ++leases_;
        if (armed_after_ && !granted_ && end > *armed_after_ && (start > *armed_after_ || retried)) {
          granted_ = end;
        }
      }
      cv_.notify_all();
    }
  }

  std::unique_ptr<ShardingClient> client_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> errors_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t leases_ = 0;                           // guarded by mu_
  std::optional<Clock::time_point> armed_after_;  // guarded by mu_
  std::optional<Clock::time_point> granted_;      // guarded by mu_
  std::thread thread_;  // last: starts once the members above exist
};

struct FailoverFigures {
  std::vector<double> seconds;  // sorted
  uint64_t client_errors = 0;
  double Rank(double q) const {  // nearest rank
    if (seconds.empty()) return 0;
    const size_t r = static_cast<size_t>(std::ceil(q * static_cast<double>(seconds.size())));
    return seconds[std::min(seconds.size() - 1, r == 0 ? 0 : r - 1)];
  }
};

constexpr char kHaPrefix[] = "bench-ha";

// `keep_logs` (non-empty): where the pacerds' logs are copied at the end.
absl::StatusOr<FailoverFigures> MeasureFailovers(const TempDir& dir, const EtcdCluster& cluster,
                                                 int failovers, const std::string& keep_logs) {
  WriteToken(dir.Sub("job.token"), kJobToken);
  WriteToken(dir.Sub("admin.token"), kAdminToken);
  auto ports = testing::FreePorts(2);
  if (!ports.ok()) return ports.status();
  const std::string pacerd_bin = SelfDir() + "/pacerd";
  std::vector<Subprocess> pacerds(2);
  auto log_of = [&](int i) { return dir.Sub("pacerd-" + std::to_string(i) + ".log"); };
  struct KeepLogs {
    std::function<void()> fn;
    ~KeepLogs() { fn(); }
  } keep{[&] {
    if (keep_logs.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(keep_logs, ec);
    for (int i = 0; i < 2; ++i) {
      std::filesystem::copy_file(log_of(i), keep_logs + "/pacerd-" + std::to_string(i) + ".log",
                                 std::filesystem::copy_options::overwrite_existing, ec);
    }
  }};
  auto start_pacerd = [&](int i) {
    // A fresh data dir each time (a replacement machine): in etcd mode it holds nothing needed.
    const std::string data = dir.Sub("pacerd-" + std::to_string(i));
    std::filesystem::remove_all(data);
    pacerds[i] = Subprocess::Start(
        {pacerd_bin, "--data-dir", data, "--listen", absl::StrCat("127.0.0.1:", (*ports)[i]),
         "--metrics-listen", "", "--journal", absl::StrCat("etcd://", cluster.endpoints_csv(), "/", kHaPrefix),
         "--job-token-file", dir.Sub("job.token"), "--admin-token-file", dir.Sub("admin.token"),
         "--election-ttl-s", "2", "--lease-timeout-ms", "60000", "--worker-timeout-ms", "120000"},
        {{"PACER_LOG_LEVEL", "INFO"}}, log_of(i));
  };
  // An error saying whether each pacerd still runs (a signal from elsewhere ends one too), with
  // the tail of both pacerds' logs.
  auto failure = [&](const std::string& what) {
    std::string s = what;
    for (int i = 0; i < 2; ++i) {
      if (pacerds[i].running()) {
        absl::StrAppend(&s, "\npacerd-", i, " runs");
      } else {
        const int st = pacerds[i].exit_status();
        absl::StrAppend(&s, "\npacerd-", i, " ended: ",
                        WIFSIGNALED(st) ? absl::StrCat("signal ", WTERMSIG(st)) : absl::StrCat("exit ", WEXITSTATUS(st)));
      }
    }
    for (int i = 0; i < 2; ++i) {
      std::string t = testing::ReadFileOrEmpty(log_of(i));
      if (t.size() > 3000) t = t.substr(t.size() - 3000);
      absl::StrAppend(&s, "\n--- pacerd-", i, ".log (tail) ---\n", t);
    }
    return absl::InternalError(s);
  };
  EtcdClientOptions eo;
  eo.endpoints = cluster.endpoints();
  auto etcd = EtcdClient::Connect(eo);
  if (!etcd.ok()) return etcd.status();
  const std::string election = std::string(kHaPrefix) + "/leader";
  // The pacerd that leads and serves now (-1: none yet).
  auto serving_leader = [&]() -> int {
    auto kv = (*etcd)->Leader(election);
    if (!kv.ok()) return -1;
    for (int i = 0; i < 2; ++i) {
      if (kv->value() == absl::StrCat("127.0.0.1:", (*ports)[i]) && Accepts((*ports)[i])) return i;
    }
    return -1;
  };
  // Candidates in the election (the leader and the standbys campaigning).
  auto candidates = [&]() -> int64_t {
    etcdserverpb::RangeRequest req;
    req.set_key(election + "/");
    req.set_range_end(EtcdPrefixEnd(election + "/"));
    req.set_count_only(true);
    auto r = (*etcd)->Range(req);
    return r.ok() ? r->count() : -1;
  };

  start_pacerd(0);
  if (!testing::WaitFor([&] { return serving_leader() == 0; }, std::chrono::seconds(30))) {
    return failure("the first pacerd did not lead within 30 s");
  }
  start_pacerd(1);

  ShardingClientOptions co;
  co.address = absl::StrCat("127.0.0.1:", (*ports)[0], ",127.0.0.1:", (*ports)[1]);
  co.token = kJobToken;
  co.worker_id = "ha-bench";
  auto client = ShardingClient::Connect(co);
  if (!client.ok()) return client.status();
  DatasetSpec spec;
  spec.set_name("train");
  spec.set_num_records(uint64_t{1} << 40);
  spec.set_shard_size(64);
  if (auto created = (*client)->RegisterDataset(spec); !created.ok()) return created.status();
  LeasingClient leasing(std::move(*client));

  FailoverFigures out;
  for (int n = 0; n < failovers; ++n) {
    // Before each kill: the standby campaigns, and the leader has served 100 leases since the
    // last failover.
    if (!testing::WaitFor([&] { return candidates() == 2; }, std::chrono::seconds(30))) {
      return failure(absl::StrCat("failover ", n, ": the standby did not campaign within 30 s"));
    }
    if (!leasing.WaitLeases(leasing.leases(), 100, std::chrono::seconds(30))) {
      return failure(absl::StrCat("failover ", n, ": the client got no 100 leases within 30 s"));
    }
    int leader = -1;
    if (!testing::WaitFor([&] { return (leader = serving_leader()) >= 0; }, std::chrono::seconds(30))) {
      return failure(absl::StrCat("failover ", n, ": no pacerd leads"));
    }
    const auto killed = Clock::now();
    pacerds[leader].Kill();  // SIGKILL and reaped: dead from here on
    leasing.Arm(Clock::now());
    start_pacerd(leader);  // a standby now
    auto granted = leasing.WaitGranted(std::chrono::seconds(60));
    if (!granted) {
      return failure(absl::StrCat("failover ", n, ": no lease from the new leader within 60 s"));
    }
    out.seconds.push_back(Seconds(killed, *granted));
    if (serving_leader() != 1 - leader) {
      return failure(absl::StrCat("failover ", n, ": the lease did not come from the other pacerd"));
    }
    std::cerr << "  failover " << n + 1 << ": " << std::fixed << std::setprecision(2)
              << out.seconds.back() << " s (load " << LoadAverage() << ")\n";
  }
  out.client_errors = leasing.errors();
  std::sort(out.seconds.begin(), out.seconds.end());
  return out;
}

}  // namespace
}  // namespace pacer::bench

int main(int argc, char** argv) {
  using namespace pacer::bench;
  bool json = false;
  double seconds = 2.0;
  int rounds = 3, failovers = 20;
  std::string keep_logs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = std::stod(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::max(0, std::stoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--failovers") && i + 1 < argc) failovers = std::max(0, std::stoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--keep-logs") && i + 1 < argc) keep_logs = argv[++i];
    else if (!std::strcmp(argv[i], "--help")) {
      std::cout << "Usage: ha_bench [--json] [--seconds S] [--rounds R] [--failovers N]\n"
                   "  --seconds: each throughput window (default 2); --rounds: windows per\n"
                   "  figure, the median is printed (default 3; 0: no throughput); --failovers:\n"
                   "  leader kills to time (default 20; 0: none); --keep-logs DIR: the pacerds'\n"
                   "  logs of part 2 are copied there\n";
      return 0;
    } else {
      std::cerr << "ha_bench: unknown argument '" << argv[i] << "'\n";
      return 2;
    }
  }
  if (!pacer::testing::EtcdAvailable()) {
    std::cerr << "ha_bench: " << pacer::testing::kEtcdMissing << "\n";
    return 1;
  }
  setenv("PACER_LOG_LEVEL", "ERROR", 0);  // unless the caller chose
  const auto t0 = Clock::now();
  const std::string load_start = LoadAverage();
  TempDir dir;
  auto cluster = EtcdCluster::Start(dir);
  if (!cluster.ok()) {
    std::cerr << "ha_bench: etcd: " << cluster.status() << "\n";
    return 1;
  }
  if (!json) std::cerr << "etcd: 3 members at " << (*cluster)->endpoints_csv() << "\n";
  Throughput tp;
  if (rounds > 0) {
    tp = MeasureThroughput(**cluster, seconds, rounds);
    if (!json) std::cerr << "[1/2] pairs/s done\n";
  }
  const std::string load_mid = LoadAverage();
  FailoverFigures fo;
  if (failovers > 0) {
    auto f = MeasureFailovers(dir, **cluster, failovers, keep_logs);
    if (!f.ok()) {
      std::cerr << "ha_bench: " << f.status() << "\n";
      return 1;
    }
    fo = *f;
    if (!json) std::cerr << "[2/2] failovers done\n";
  }
  const std::string load_end = LoadAverage();
  const double wall = Seconds(t0, Clock::now());

  if (json) {
    std::cout << std::fixed << std::setprecision(4) << "{";
    const char* sep = "";
    if (rounds > 0) {
      for (int c : {1, 16, 256}) {
        const Window& r = tp.rocks.at(c);
        const Window& e = tp.etcd.at(c);
        std::cout << sep << "\"rocksdb_pairs_per_s_" << c << "\": " << r.shards_per_s
                  << ", \"etcd_pairs_per_s_" << c << "\": " << e.shards_per_s
                  << ", \"etcd_vs_rocksdb_" << c << "\": " << e.shards_per_s / r.shards_per_s
                  << ", \"rocksdb_batches_per_1000_updates_" << c << "\": " << r.batches_per_1000
                  << ", \"etcd_txns_per_1000_updates_" << c << "\": " << e.batches_per_1000
                  << ", \"rocksdb_batch_ms_" << c << "\": " << r.write_ms
                  << ", \"etcd_txn_ms_" << c << "\": " << e.write_ms;
        sep = ", ";
      }
    }
    if (failovers > 0) {
      std::cout << sep << "\"failovers\": " << fo.seconds.size() << ", \"failover_p50_s\": " << fo.Rank(0.5)
                << ", \"failover_p99_s\": " << fo.Rank(0.99) << ", \"failover_max_s\": " << fo.seconds.back()
                << ", \"failover_client_errors\": " << fo.client_errors;
      sep = ", ";
    }
    std::cout << sep << "\"load_start\": \"" << load_start << "\", \"load_end\": \"" << load_end
              << "\", \"wall_s\": " << wall << "}" << std::endl;
    return 0;
  }
  std::cout << "load average (1, 5, 15 min): " << load_start << " at the start, " << load_mid
            << " after part 1, " << load_end << " at the end\n";
  if (rounds > 0) {
    std::cout << "\nDurable fetch+complete pairs/s over gRPC on loopback (one CompleteShard that\n"
              << "completes a lease and leases the next shard = one pair), median of " << rounds
              << " windows of " << seconds << " s\n"
              << "  batches: RocksDB WAL fsyncs / etcd transactions per 1000 updates; ms: mean time "
                 "to write one\n";
    std::cout << std::left << std::setw(9) << "clients" << std::setw(10) << "RocksDB" << std::setw(10)
              << "etcd" << std::setw(12) << "etcd/Rocks" << std::setw(24) << "batches/1000 (R, etcd)"
              << "ms per batch (R, etcd)\n";
    for (int c : {1, 16, 256}) {
      const Window& r = tp.rocks.at(c);
      const Window& e = tp.etcd.at(c);
      std::ostringstream batches, ms;
      batches << std::fixed << std::setprecision(1) << r.batches_per_1000 << ", " << e.batches_per_1000;
      ms << std::fixed << std::setprecision(2) << r.write_ms << ", " << e.write_ms;
      std::cout << std::fixed << std::setprecision(0) << std::setw(9) << c << std::setw(10) << r.shards_per_s
                << std::setw(10) << e.shards_per_s << std::setprecision(2) << std::setw(12)
                << e.shards_per_s / r.shards_per_s << std::setw(24) << batches.str() << ms.str() << "\n";
    }
    std::cout << "target: etcd >= 0.5 x RocksDB at 256 clients\n";
  }
  if (failovers > 0) {
    std::cout << std::fixed << std::setprecision(2) << "\nFailover (two pacerd processes, --election-ttl-s 2; "
              << "leader kill -9 -> first lease granted by the new leader, seen by an SDK client), "
              << fo.seconds.size() << " failovers: p50 " << fo.Rank(0.5) << " s, p99 " << fo.Rank(0.99)
              << " s, max " << fo.seconds.back() << " s, min " << fo.seconds.front() << " s ("
              << fo.client_errors << " client calls failed)\n"
              << "target: p99 < 5 s\n";
  }
  std::cout << "(wall " << std::setprecision(0) << wall << " s)\n";
  return 0;
}
