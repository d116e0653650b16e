// sharding_bench: the sharding service's figures, measured in one run on this machine.
//
//   1. ShardingState updates/s in process (fetch + complete pairs, no I/O).
//   2. Shards/s over gRPC on loopback against pacerd's service with its durable journal
//      (sync=true), at 1, 16 and 256 concurrent clients, beside a bare gRPC echo service driven
//      the same way in the same run (a "pair" = two echo calls), by two paths:
//        old: FetchShard, then CompleteShard (two durable calls, two group commits per shard);
//        new: CompleteShard with next_dataset (completes and leases the next shard in one
//             durable call), as the SDK's ShardReader does.
//   3. fsyncs per 1000 updates at each concurrency (group commit at work).
//   4. Recovery time after 1 M journaled updates (v3: decided leases), with snapshots (every
//      10 000) and without.
//   5. pacerd's resident memory serving a 10-billion-record dataset vs a 1-million one.
//   6. (--mark-cost, alone) What the high-water mark costs a commit: the new path against a
//      pacerd whose mark is written before each group is acknowledged (today) and one whose
//      mark lags (before), alternating in the same run.
// Usage: sharding_bench [--json] [--seconds S] [--rounds R] [--rpc-only] [--mark-cost]
// (each gRPC figure: the median of R windows; echo, old and new alternate within a round)
#include <grpcpp/grpcpp.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench/durable_loops.h"
#include "bench/echo_service.h"
#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "common/log.h"
#include "proto/pacer/bench.grpc.pb.h"
#include "sharding_service/sharding_service.h"
#include "sharding_service/sharding_state.h"

namespace pacer::bench {
namespace {

// ---- 1. In-process state machine ----
double StateUpdatesPerSecond() {
  ShardingState st;
  uint64_t seq = 0;
  auto apply = [&](Update u) {
    u.set_seq(++seq);
    u.set_time_ms(static_cast<int64_t>(seq));
    if (!st.ApplyChecked(u).ok()) std::abort();
  };
  Update reg;
  reg.mutable_register_dataset()->mutable_spec()->set_name("train");
  reg.mutable_register_dataset()->mutable_spec()->set_num_records(uint64_t{1} << 40);
  reg.mutable_register_dataset()->mutable_spec()->set_shard_size(16);
  apply(reg);
  for (int w = 0; w < 64; ++w) {
    Update u;
    u.mutable_register_worker()->set_worker_id("w" + std::to_string(w));
    apply(u);
  }
  const int kPairs = 400'000;
  Update fetch, complete;
  complete.mutable_end_lease()->set_reason(LEASE_COMPLETED);
  const auto t0 = Clock::now();
  for (int i = 0; i < kPairs; ++i) {
    // What the service does for a fetch: plan, decide (v3 update records the outcome), apply.
    const std::string worker = "w" + std::to_string(i % 64);
    auto plan = st.PlanFetch(worker, "train");
    if (!plan.ok() || plan->kind != FetchPlan::kLease) std::abort();
    *fetch.mutable_create_lease() = st.DecideLease(*plan, worker, "train", 0);
    apply(fetch);
    complete.mutable_end_lease()->set_lease_id(st.last_lease_id());
    apply(complete);
  }
  return 2.0 * kPairs / Seconds(t0, Clock::now());
}

// ---- 2/3. gRPC pair loops ----
class EchoLoop final : public PairLoop {
 public:
  EchoLoop(Echo::Stub* stub, int id) : stub_(stub) { req_.set_worker_id("w" + std::to_string(id)); }
  void Start() override { Call(0); }

 private:
  void Call(int half) {
    if (stop) {
      stopped = true;
      return;
    }
    ctx_ = std::make_unique<grpc::ClientContext>();
    req_.set_value(req_.value() + 1);
    stub_->async()->Echo(ctx_.get(), &req_, &resp_, [this, half](grpc::Status s) {
      if (!s.ok()) errors++;
      if (half == 1) pairs++;
      Call(1 - half);
    });
  }
  Echo::Stub* stub_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  EchoMessage req_, resp_;
};

struct RpcFigures {
  std::map<int, double> echo, durable, combined, fsyncs_per_1000, combined_fsyncs_per_1000;
};

// pacerd with its RocksDB journal (sync=true). `mark_before_ack`: JournalOptions::mark_before_ack
// (false: the lagging mark of before, for the comparison of section 6 only).
PacerdOptions MarkOptions(bool mark_before_ack) {
  PacerdOptions o;
  o.sharding.journal.mark_before_ack = mark_before_ack;
  return o;
}

// Each figure is the median of `rounds` windows; in a round the echo, the old and the new path
// run one after the other, so a neighbour's load on a shared machine falls on all three alike.
RpcFigures MeasureRpc(double seconds, int rounds) {
  RpcFigures out;
  // The echo baseline.
  EchoServiceImpl echo;
  grpc::ServerBuilder b;
  int echo_port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &echo_port);
  b.RegisterService(&echo);
  auto echo_server = b.BuildAndStart();
  auto echo_channels = Channels("127.0.0.1:" + std::to_string(echo_port), kChannels);
  std::vector<std::unique_ptr<Echo::Stub>> echo_stubs;
  for (auto& c : echo_channels) echo_stubs.push_back(Echo::NewStub(c));
  // Pacer: the real pacerd service with its durable journal.
  DurablePacerd pacerd(MarkOptions(/*mark_before_ack=*/true));
  for (int clients : {1, 16, 256}) {
    std::map<std::string, std::vector<double>> runs;  // figure -> one value per round
    for (int round = 0; round < rounds; ++round) {
      uint64_t errors = 0;
      std::vector<std::unique_ptr<PairLoop>> echo_loops;
      for (int i = 0; i < clients; ++i) {
        echo_loops.push_back(std::make_unique<EchoLoop>(echo_stubs[i % kChannels].get(), i));
      }
      runs["echo"].push_back(Measure(echo_loops, seconds, &errors));
      const Window old_path = pacerd.RunWindow(clients, false, seconds);
      runs["old"].push_back(old_path.shards_per_s);
      runs["old_fsyncs"].push_back(old_path.batches_per_1000);
      const Window new_path = pacerd.RunWindow(clients, true, seconds);
      runs["new"].push_back(new_path.shards_per_s);
      runs["new_fsyncs"].push_back(new_path.batches_per_1000);
    }
    out.echo[clients] = Median(runs["echo"]);
    out.durable[clients] = Median(runs["old"]);
    out.combined[clients] = Median(runs["new"]);
    out.fsyncs_per_1000[clients] = Median(runs["old_fsyncs"]);
    out.combined_fsyncs_per_1000[clients] = Median(runs["new_fsyncs"]);
  }
  echo_server->Shutdown();
  return out;
}

// ---- 6. What the high-water mark costs a commit ----
// The new path (one durable CompleteShard per shard) against two pacerds in the same run: the
// mark written before each group is acknowledged (today's journal), and the lagging mark of
// before (written every 100 ms off the commit path: JournalOptions::mark_before_ack = false).
// Alternating within each round; medians of `rounds` windows.
// And the journal alone, in process (no gRPC, little CPU): `threads` callers each append one
// update and wait until it is acknowledged, again and again; the latency of each commit.
struct CommitLatency {
  double commits_per_s = 0;
  double p50_ms = 0, p99_ms = 0;
};

CommitLatency JournalCommitLatency(bool mark_before_ack, int threads, double seconds) {
  const std::string dir = MakeTempDir();
  JournalOptions o{dir + "/journal", /*sync=*/true};
  o.mark_before_ack = mark_before_ack;
  auto journal = ShardingJournal::Open(o, [](const ShardingSnapshot&) { return absl::OkStatus(); },
                               [](const Update&) { return absl::OkStatus(); });
  if (!journal.ok()) std::abort();
  std::mutex append_mu;  // appends in seq order
  uint64_t seq = 0;
  std::vector<std::vector<double>> latencies(threads);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> callers;
  for (int t = 0; t < threads; ++t) {
    callers.emplace_back([&, t] {
      while (Clock::now() < end) {
        const auto t0 = Clock::now();
        uint64_t s;
        {
          std::lock_guard<std::mutex> l(append_mu);
          s = ++seq;
          Update u;
          u.set_seq(s);
          u.mutable_worker_lost()->set_worker_id("w" + std::to_string(t));
          (*journal)->Append(u);
        }
        std::promise<void> done;
        (*journal)->WhenDurable(s, [&done](absl::Status) { done.set_value(); });
        done.get_future().wait();
        latencies[t].push_back(1e3 * Seconds(t0, Clock::now()));
      }
    });
  }
  for (auto& c : callers) c.join();
  journal->reset();
  std::filesystem::remove_all(dir);
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  CommitLatency out;
  if (all.empty()) return out;
  out.commits_per_s = static_cast<double>(all.size()) / seconds;
  out.p50_ms = all[all.size() / 2];
  out.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return out;
}

struct MarkFigures {
  std::map<int, Window> lagging, before_ack;
  std::map<int, CommitLatency> journal_lagging, journal_before_ack;  // by caller threads
};

MarkFigures MeasureMarkCost(double seconds, int rounds) {
  MarkFigures out;
  DurablePacerd lagging(MarkOptions(/*mark_before_ack=*/false)), before_ack(MarkOptions(/*mark_before_ack=*/true));
  for (int clients : {1, 16, 256}) {
    std::map<std::string, std::vector<double>> runs;
    for (int round = 0; round < rounds; ++round) {
      for (const bool ack : {false, true}) {
        const Window w = (ack ? before_ack : lagging).RunWindow(clients, true, seconds);
        const std::string k = ack ? "ack" : "lag";
        runs[k].push_back(w.shards_per_s);
        runs[k + "_batches"].push_back(w.batches_per_1000);
        runs[k + "_marks"].push_back(w.marks_per_1000);
      }
    }
    out.lagging[clients] = {Median(runs["lag"]), Median(runs["lag_batches"]), Median(runs["lag_marks"])};
    out.before_ack[clients] = {Median(runs["ack"]), Median(runs["ack_batches"]), Median(runs["ack_marks"])};
  }
  for (int threads : {1, 16}) {
    std::map<std::string, std::vector<double>> runs;
    for (int round = 0; round < rounds; ++round) {
      for (const bool ack : {false, true}) {
        const CommitLatency c = JournalCommitLatency(ack, threads, seconds);
        const std::string k = ack ? "ack" : "lag";
        runs[k].push_back(c.commits_per_s);
        runs[k + "_p50"].push_back(c.p50_ms);
        runs[k + "_p99"].push_back(c.p99_ms);
      }
    }
    out.journal_lagging[threads] = {Median(runs["lag"]), Median(runs["lag_p50"]), Median(runs["lag_p99"])};
    out.journal_before_ack[threads] = {Median(runs["ack"]), Median(runs["ack_p50"]), Median(runs["ack_p99"])};
  }
  return out;
}

void PrintMarkTable(const MarkFigures& m) {
  std::cout << "What the high-water mark costs a commit (new path: one durable call per shard)\n"
            << "  lagging: the mark every 100 ms, off the commit path (before)\n"
            << "  before ack: the mark written (fdatasync) before a group is acknowledged (now)\n"
            << "  latency: mean time per call = clients / (shards/s), one call in flight per client\n";
  std::cout << std::left << std::setw(9) << "clients" << std::setw(12) << "lagging" << std::setw(13)
            << "before ack" << std::setw(8) << "ratio" << std::setw(22) << "latency ms (lag, ack)"
            << std::setw(24) << "WAL fsyncs/1000 (lag, ack)"
            << "mark writes/1000 (ack)\n";
  for (int c : {1, 16, 256}) {
    const Window& lag = m.lagging.at(c);
    const Window& ack = m.before_ack.at(c);
    std::ostringstream latency, fsyncs;
    latency << std::fixed << std::setprecision(2) << 1000.0 * c / lag.shards_per_s << ", "
            << 1000.0 * c / ack.shards_per_s;
    fsyncs << std::fixed << std::setprecision(1) << lag.batches_per_1000 << ", " << ack.batches_per_1000;
    std::cout << std::fixed << std::setprecision(0) << std::setw(9) << c << std::setw(12)
              << lag.shards_per_s << std::setw(13) << ack.shards_per_s << std::setprecision(2)
              << std::setw(8) << ack.shards_per_s / lag.shards_per_s << std::setw(22) << latency.str()
              << std::setw(24) << fsyncs.str() << std::setprecision(1) << ack.marks_per_1000 << "\n";
  }
  std::cout << "\nThe journal alone, in process: each caller appends one update and waits for its\n"
            << "acknowledgment; commits/s and commit latency p50 / p99 in ms\n";
  std::cout << std::left << std::setw(9) << "callers" << std::setw(28) << "lagging: commits/s, p50, p99"
            << "before ack: commits/s, p50, p99\n";
  for (int t : {1, 16}) {
    auto row = [](const CommitLatency& c) {
      std::ostringstream o;
      o << std::fixed << std::setprecision(0) << c.commits_per_s << ", " << std::setprecision(2)
        << c.p50_ms << ", " << c.p99_ms;
      return o.str();
    };
    std::cout << std::setw(9) << t << std::setw(28) << row(m.journal_lagging.at(t))
              << row(m.journal_before_ack.at(t)) << "\n";
  }
}

// ---- 4. Recovery ----
// Writes `n` realistic updates (workers fetching, reporting progress, completing) to a journal
// in `dir`, 16 per record, with a snapshot every `snapshot_every` updates (0 = none).
void WriteJournal(const std::string& dir, uint64_t n, uint64_t snapshot_every) {
  auto journal = ShardingJournal::Open({dir, /*sync=*/false}, [](const ShardingSnapshot&) { return absl::OkStatus(); },
                               [](const Update&) { return absl::OkStatus(); });
  if (!journal.ok()) std::abort();
  ShardingState st;
  uint64_t seq = 0;
  auto apply = [&](Update u) {
    u.set_seq(++seq);
    u.set_time_ms(static_cast<int64_t>(seq));
    if (!st.ApplyChecked(u).ok()) std::abort();
    (*journal)->Append(u);
    // Groups of 16 updates per record, as group commit produced at 256 clients (~60 fsyncs per
    // 1000 updates), so the replayed journal has the shape of a real one.
    if (seq % 16 == 0 && !(*journal)->Flush().ok()) std::abort();
    if (snapshot_every && seq % snapshot_every == 0) (*journal)->WriteSnapshot(st.ToSnapshot());
  };
  Update reg;
  reg.mutable_register_dataset()->mutable_spec()->set_name("train");
  reg.mutable_register_dataset()->mutable_spec()->set_num_records(uint64_t{1} << 40);
  reg.mutable_register_dataset()->mutable_spec()->set_shard_size(128);
  reg.mutable_register_dataset()->mutable_spec()->set_shuffle(SHUFFLE_SHARDS);
  apply(reg);
  const int kWorkers = 256;
  for (int w = 0; w < kWorkers; ++w) {
    Update u;
    u.mutable_register_worker()->set_worker_id("w" + std::to_string(w));
    apply(u);
  }
  std::vector<uint64_t> lease_of(kWorkers, 0);
  int w = 0;
  while (seq < n) {
    w = (w + 1) % kWorkers;
    Update u;
    if (lease_of[w] == 0) {
      const std::string worker = "w" + std::to_string(w);
      auto plan = st.PlanFetch(worker, "train");
      if (!plan.ok() || plan->kind != FetchPlan::kLease) std::abort();
      *u.mutable_create_lease() = st.DecideLease(*plan, worker, "train", seq + 1);
      apply(u);
      lease_of[w] = st.last_lease_id();
    } else if (st.FindLease(lease_of[w])->done < 96) {
      u.mutable_progress()->set_lease_id(lease_of[w]);
      u.mutable_progress()->set_records_done(st.FindLease(lease_of[w])->done + 32);
      apply(u);
    } else {
      u.mutable_end_lease()->set_lease_id(lease_of[w]);
      u.mutable_end_lease()->set_reason(LEASE_COMPLETED);
      apply(u);
      lease_of[w] = 0;
    }
  }
  if (!(*journal)->Flush().ok()) std::abort();
}

double RecoverySeconds(const std::string& dir) {
  ShardingServiceOptions o;
  o.data_dir = dir;
  auto svc = ShardingServiceImpl::Open(o, RealClock::Get(), nullptr);
  if (!svc.ok()) {
    std::cerr << "recovery: " << svc.status() << std::endl;
    std::exit(1);
  }
  return (*svc)->stats().recovery_seconds;
}

// ---- 5. pacerd's memory ----
std::string SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

double RssMib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

// Starts the pacerd binary, serves `records` (shuffled shards, unbounded epochs) to 64 clients
// for `seconds`, and returns its resident memory.
double PacerdRssServing(uint64_t records, double seconds, uint64_t* leases) {
  const std::string dir = MakeTempDir();
  const std::string port_file = dir + "/port";
  const std::string pacerd = SelfDir() + "/pacerd";
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    execl(pacerd.c_str(), pacerd.c_str(), "--data-dir", (dir + "/data").c_str(), "--listen",
          "127.0.0.1:0", "--metrics-listen", "", "--port-file", port_file.c_str(), nullptr);
    _exit(127);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(port_file) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling for start-up
  }
  std::ifstream pf(port_file);
  std::string json((std::istreambuf_iterator<char>(pf)), {});
  const int port = std::stoi(json.substr(json.find(':') + 1));
  auto token = LoadToken(dir + "/data/job.token", false);
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = ShardingService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, *token);
    RegisterDatasetRequest req;
    req.mutable_spec()->set_name("big");
    req.mutable_spec()->set_num_records(records);
    req.mutable_spec()->set_shard_size(1000);
    req.mutable_spec()->set_shuffle(SHUFFLE_SHARDS);
    RegisterDatasetResponse resp;
    if (!stub->RegisterDataset(&ctx, req, &resp).ok()) std::abort();
  }
  std::vector<std::unique_ptr<PairLoop>> loops;
  for (int i = 0; i < 64; ++i) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, *token);
    RegisterWorkerRequest req;
    req.set_worker_id("w" + std::to_string(i));
    RegisterWorkerResponse resp;
    if (!stub->RegisterWorker(&ctx, req, &resp).ok()) std::abort();
    loops.push_back(std::make_unique<ShardLoop>(stub.get(), *token, req.worker_id(), resp.incarnation(), "big"));
  }
  uint64_t errors = 0;
  const double rate = Measure(loops, seconds, &errors);
  *leases = static_cast<uint64_t>(rate * seconds);
  const double rss = RssMib(pid);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  std::filesystem::remove_all(dir);
  return rss;
}

void PrintRpcTable(const RpcFigures& rpc) {
  std::cout << "Shards/s over gRPC on loopback (durable journal, fsync on); echo: pairs of calls/s\n"
            << "  old: FetchShard + CompleteShard (two durable calls per shard)\n"
            << "  new: CompleteShard that leases the next shard (one durable call per shard)\n";
  std::cout << std::left << std::setw(9) << "clients" << std::setw(12) << "echo pairs"
            << std::setw(12) << "old" << std::setw(12) << "new" << std::setw(9) << "new/old"
            << std::setw(10) << "new/echo" << std::setw(10) << "old/echo"
            << "fsyncs/1000 updates (old, new)\n";
  for (int c : {1, 16, 256}) {
    std::cout << std::setprecision(0) << std::setw(9) << c << std::setw(12) << rpc.echo.at(c)
              << std::setw(12) << rpc.durable.at(c) << std::setw(12) << rpc.combined.at(c)
              << std::setprecision(2) << std::setw(9) << rpc.combined.at(c) / rpc.durable.at(c)
              << std::setw(10) << rpc.combined.at(c) / rpc.echo.at(c) << std::setw(10)
              << rpc.durable.at(c) / rpc.echo.at(c) << std::setprecision(1)
              << rpc.fsyncs_per_1000.at(c) << ", " << rpc.combined_fsyncs_per_1000.at(c) << "\n";
  }
}

}  // namespace
}  // namespace pacer::bench

int main(int argc, char** argv) {
  using namespace pacer::bench;
  bool json = false, rpc_only = false, mark_only = false;
  double seconds = 2.0;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = std::stod(argv[++i]);
    else if (!std::strcmp(argv[i], "--rpc-only")) rpc_only = true;
    else if (!std::strcmp(argv[i], "--mark-cost")) mark_only = true;
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::max(1, std::stoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--help")) {
      std::cout << "Usage: sharding_bench [--json] [--seconds S] [--rounds R] [--rpc-only] [--mark-cost]\n"
                   "  --seconds: each measurement window (default 2); --rounds: windows per gRPC\n"
                   "  figure, the median is printed (default 3); --rpc-only: only the gRPC table;\n"
                   "  --mark-cost: only what the high-water mark costs a commit (section 6)\n";
      return 0;
    } else {
      std::cerr << "sharding_bench: unknown argument '" << argv[i] << "'\n";
      return 2;
    }
  }
  setenv("PACER_LOG_LEVEL", "ERROR", 1);
  const auto t0 = std::chrono::steady_clock::now();
  if (mark_only) {
    const MarkFigures marks = MeasureMarkCost(seconds, rounds);
    if (json) {
      std::cout << std::fixed << std::setprecision(4) << "{";
      const char* sep = "";
      for (int c : {1, 16, 256}) {
        std::cout << sep << "\"lagging_mark_shards_per_s_" << c << "\": " << marks.lagging.at(c).shards_per_s
                  << ", \"mark_before_ack_shards_per_s_" << c << "\": " << marks.before_ack.at(c).shards_per_s
                  << ", \"mark_writes_per_1000_updates_" << c << "\": " << marks.before_ack.at(c).marks_per_1000;
        sep = ", ";
      }
      for (int t : {1, 16}) {
        std::cout << ", \"journal_lagging_p50_ms_" << t << "\": " << marks.journal_lagging.at(t).p50_ms
                  << ", \"journal_before_ack_p50_ms_" << t << "\": " << marks.journal_before_ack.at(t).p50_ms
                  << ", \"journal_lagging_commits_per_s_" << t << "\": " << marks.journal_lagging.at(t).commits_per_s
                  << ", \"journal_before_ack_commits_per_s_" << t << "\": " << marks.journal_before_ack.at(t).commits_per_s;
      }
      std::cout << "}" << std::endl;
    } else {
      PrintMarkTable(marks);
    }
    return 0;
  }
  const double state_rate = rpc_only ? 0 : StateUpdatesPerSecond();
  if (!json) std::cerr << "[1/4] state machine done\n";
  const RpcFigures rpc = MeasureRpc(seconds, rounds);
  if (!json) std::cerr << "[2/4] gRPC pairs done\n";
  if (rpc_only && !json) {
    std::cout << std::fixed;
    PrintRpcTable(rpc);
    return 0;
  }
  const std::string snap_dir = MakeTempDir(), nosnap_dir = MakeTempDir();
  WriteJournal(snap_dir, 1'000'000, 10'000);
  WriteJournal(nosnap_dir, 1'000'000, 0);
  const double rec_snap = RecoverySeconds(snap_dir);
  const double rec_nosnap = RecoverySeconds(nosnap_dir);
  std::filesystem::remove_all(snap_dir);
  std::filesystem::remove_all(nosnap_dir);
  if (!json) std::cerr << "[3/4] recovery done\n";
  uint64_t leases_big = 0, leases_small = 0;
  const double rss_big = PacerdRssServing(10'000'000'000ULL, seconds, &leases_big);
  const double rss_small = PacerdRssServing(1'000'000ULL, seconds, &leases_small);
  if (!json) std::cerr << "[4/4] memory done\n";
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (json) {
    std::cout << std::fixed << std::setprecision(4) << "{"
              << "\"state_updates_per_s\": " << state_rate;
    for (int c : {1, 16, 256}) {
      std::cout << ", \"echo_pairs_per_s_" << c << "\": " << rpc.echo.at(c)
                << ", \"durable_pairs_per_s_" << c << "\": " << rpc.durable.at(c)
                << ", \"durable_vs_echo_" << c << "\": " << rpc.durable.at(c) / rpc.echo.at(c)
                << ", \"combined_shards_per_s_" << c << "\": " << rpc.combined.at(c)
                << ", \"combined_vs_old_" << c << "\": " << rpc.combined.at(c) / rpc.durable.at(c)
                << ", \"combined_vs_echo_" << c << "\": " << rpc.combined.at(c) / rpc.echo.at(c)
                << ", \"fsyncs_per_1000_updates_" << c << "\": " << rpc.fsyncs_per_1000.at(c)
                << ", \"combined_fsyncs_per_1000_updates_" << c << "\": "
                << rpc.combined_fsyncs_per_1000.at(c);
    }
    std::cout << ", \"fsyncs_per_1000_updates\": " << rpc.fsyncs_per_1000.at(256)
              << ", \"recovery_s_1m_updates\": " << rec_snap
              << ", \"recovery_s_1m_updates_no_snapshot\": " << rec_nosnap
              << ", \"rss_mib_10g_records\": " << rss_big
              << ", \"rss_mib_1m_records\": " << rss_small
              << ", \"wall_s\": " << wall << "}" << std::endl;
    return 0;
  }
  std::cout << std::fixed << std::setprecision(0);
  std::cout << "\nShardingState in process: " << state_rate << " updates/s\n\n";
  PrintRpcTable(rpc);
  std::cout << std::setprecision(3);
  std::cout << "\nRecovery after 1 000 000 updates: " << rec_snap << " s with snapshots (every 10 000), "
            << rec_nosnap << " s without\n";
  std::cout << std::setprecision(1);
  std::cout << "pacerd resident memory: " << rss_big << " MiB serving 10 000 000 000 records ("
            << leases_big << " leases in " << seconds << " s), " << rss_small
            << " MiB serving 1 000 000 records\n";
  std::cout << "targets: new >= 1.8 x old at 1 and 16 clients, new >= 0.8 x echo pairs at 256 "
               "clients; recovery < 1 s; < 200 MiB\n";
  std::cout << "(wall " << std::setprecision(0) << wall << " s)\n";
  return 0;
}
