// pacerd_load_bench: a real pacerd under thousands of simulated workers from one process
// (docs/benchmarks.md "pacerd under load").
//
// Each simulated worker is a small state machine on raw gRPC async stubs (no thread of its
// own): it registers with the sharding service and the monitor, then every --heartbeat-ms
// (phases spread over the interval) sends one Heartbeat carrying the progress of the lease it
// holds and one ReportSteps with the steps it "trained" since (--steps-per-heartbeat steps of
// --batch samples), fetches a shard when it holds none and completes it (fetching the next in
// the same call) once its steps have consumed it. A few completion-queue threads (--threads)
// drive them all. pacerd is a child process (the `pacerd` binary next to this one, or
// --pacerd PATH) on port 0 with a temp data dir, restarted for each --workers level, or an
// attached one (--address HOST:PORT --job-token-file F --pacerd-pid PID for its RSS).
//
// Printed per level, every --sample-s and at the end: pacerd's RSS (VmRSS), its CPU, its threads'
// run-queue wait (runnable, no CPU: a starved pacerd) and the load average, CPU per
// worker-second (pacerd's CPU seconds / (workers x seconds)), the Heartbeat round trip p50 /
// p99 / max as the client saw it (queueing in this process included), RPCs and errors by
// method and code. RSS growth is measured from the end of --warmup-s (registration and the
// first windows allocate) to the end of the level.
//
// With --policy FILE the controller decides: the slow workers (every 16th) shift by one every
// --shift-s seconds, so a new batch plan is due every few seconds (the `plans` column: the
// newest plan version a heartbeat carried); the simulated workers keep their batch. With
// --baseline-pacerd PATH each level runs against that binary first, then against this one, so
// one run compares the two code paths on the same machine.
//   pacerd_load_bench [--workers 64,512,4096] [--duration-s 60] [--warmup-s 20] [--json]
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"

namespace {

using Steady = std::chrono::steady_clock;
using Wall = std::chrono::system_clock;  // gRPC alarms take system_clock deadlines
using pacer::Monitor;
using pacer::ShardingService;

// ---- measurement ----

// Latency histogram: log buckets of 2 % from 10 us (a 30-minute run at 4 096 workers makes
// 7 M heartbeats; keeping them all would be the bench's own memory growth).
class Histogram {
 public:
  void Add(double s) {
    const int b = Bucket(s);
    std::lock_guard<std::mutex> l(mu_);
    ++counts_[b];
    ++n_;
    max_ = std::max(max_, s);
  }
  // Percentile, 0..1; the bucket's upper edge.
  double Pct(double p) const {
    std::lock_guard<std::mutex> l(mu_);
    if (n_ == 0) return 0;
    const uint64_t want = static_cast<uint64_t>(std::ceil(p * static_cast<double>(n_)));
    uint64_t seen = 0;
    for (size_t b = 0; b < counts_.size(); ++b) {
      seen += counts_[b];
      if (seen >= std::max<uint64_t>(1, want)) return std::min(max_, Edge(static_cast<int>(b) + 1));
    }
    return max_;
  }
  uint64_t n() const {
    std::lock_guard<std::mutex> l(mu_);
    return n_;
  }
  double max() const {
    std::lock_guard<std::mutex> l(mu_);
    return max_;
  }
  void Reset() {
    std::lock_guard<std::mutex> l(mu_);
    std::fill(counts_.begin(), counts_.end(), 0);
    n_ = 0;
    max_ = 0;
  }

 private:
  static constexpr double kMin = 1e-5, kStep = 1.02;
  static int Bucket(double s) {
    if (!(s > kMin)) return 0;
    return std::min<int>(kBuckets - 1, 1 + static_cast<int>(std::log(s / kMin) / std::log(kStep)));
  }
  static double Edge(int b) { return b == 0 ? kMin : kMin * std::pow(kStep, b); }
  static constexpr int kBuckets = 1000;  // up to 10 us x 1.02^1000 (~4 000 s)
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_ = std::vector<uint64_t>(kBuckets, 0);
  uint64_t n_ = 0;
  double max_ = 0;
};

struct Counters {
  std::atomic<uint64_t> heartbeats{0}, step_reports{0}, fetches{0}, completions{0}, leased{0},
      waits{0}, end_of_data{0}, registrations{0};
  std::atomic<uint64_t> newest_plan{0};  // the newest batch plan version a heartbeat carried
  // Ticks whose heartbeat (or step report) was not sent because the previous one was still in
  // flight: pacerd slower than the heartbeat interval (the SDK sends one at a time too).
  std::atomic<uint64_t> heartbeats_skipped{0}, reports_skipped{0};
  std::mutex mu;
  std::map<std::string, uint64_t> errors;  // "Method CODE" -> count
  std::vector<std::string> first_errors;
  uint64_t Errors() {
    std::lock_guard<std::mutex> l(mu);
    uint64_t n = 0;
    for (const auto& [k, v] : errors) n += v;
    return n;
  }
  void Error(const char* method, const grpc::Status& s) {
    std::lock_guard<std::mutex> l(mu);
    ++errors[std::string(method) + " " + std::to_string(s.error_code())];
    if (first_errors.size() < 5) first_errors.push_back(std::string(method) + ": " + s.error_message());
  }
};

// /proc/<pid>: resident set and CPU seconds (user + system).
double RssMiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0;
}

double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {  // fields 3.. after "pid (comm)"
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Seconds pacerd's threads spent runnable but waiting for a CPU, so far (the second field of
// /proc/<pid>/task/*/schedstat): a pacerd that waits longer than it runs is starved by the
// machine, whatever its own code does. 0 where schedstat is not available.
double RunQueueWaitSeconds(pid_t pid) {
  std::error_code ec;
  double wait_ns = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(task.path() / "schedstat");
    double run = 0, wait = 0;
    if (f >> run >> wait) wait_ns += wait;
  }
  return wait_ns / 1e9;
}

// The 1-minute load average.
double LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double load = 0;
  f >> load;
  return load;
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// ---- the simulated workers ----

struct Options {
  std::vector<int> workers{64, 512, 4096};
  double duration_s = 60, warmup_s = 20, sample_s = 10;
  int heartbeat_ms = 1000, steps_per_heartbeat = 5, batch = 32, threads = 2, channels = 16;
  uint64_t shard_size = 1600;  // 10 heartbeats of 5 steps x 32 samples
  std::string pacerd, address, job_token_file, out_dir;
  // A controller that decides: pacerd's --policy, and the slow workers (every 16th) shifting by
  // one every shift_s seconds (0: never), so that a new plan is due every few seconds.
  std::string policy;
  double shift_s = 0;
  // Each level runs against this pacerd binary first, then against --pacerd (or the one next
  // to the bench): the previous code path and this one in one run.
  std::string baseline_pacerd;
  pid_t pacerd_pid = -1;
  bool json = false;
};

// Base of every in-flight call: the completion queue hands its pointer back as the tag.
struct Tag {
  virtual ~Tag() = default;
  virtual void Done(bool ok) = 0;
};

class Fleet;

class Worker {
 public:
  Worker(Fleet* fleet, int index, grpc::CompletionQueue* cq, ShardingService::Stub* sharding,
         Monitor::Stub* monitor);
  void Start(Wall::time_point first_tick);
  void Stop() { stopping_ = true; }
  bool idle() const { return in_flight_ == 0 && !alarm_set_; }

 private:
  friend class Fleet;
  template <class Resp, class Fn>
  struct Call : Tag {
    Worker* w;
    grpc::ClientContext ctx;
    grpc::Status status;
    Resp resp;
    std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> reader;
    Steady::time_point start = Steady::now();
    Fn fn;
    Call(Worker* worker, Fn f) : w(worker), fn(std::move(f)) {}
    void Done(bool) override {
      --w->in_flight_;
      fn(*this);
      delete this;
    }
  };
  struct Timer : Tag {
    Worker* w;
    explicit Timer(Worker* worker) : w(worker) {}
    void Done(bool ok) override { w->OnTick(ok); }
  };

  template <class Resp, class Fn>
  Call<Resp, Fn>* NewCall(Fn fn);
  void Register();
  void OnRegistered();
  void OnTick(bool ok);
  void ScheduleTick();
  void Heartbeat();
  void ReportSteps();
  void Fetch();
  void Complete();
  void TakeLease(const pacer::FetchShardResponse& r);

  Fleet* fleet_;
  const int index_;
  const std::string id_, node_;
  grpc::CompletionQueue* cq_;
  ShardingService::Stub* sharding_;
  Monitor::Stub* monitor_;
  grpc::Alarm alarm_;
  Timer timer_{this};
  bool alarm_set_ = false;
  Wall::time_point next_tick_;
  int in_flight_ = 0;
  bool stopping_ = false, registered_ = false, fetching_ = false, completing_ = false;
  bool heartbeat_in_flight_ = false, report_in_flight_ = false;  // one of each at a time, as the SDK
  uint64_t incarnation_ = 0, request_id_ = 0, step_ = 0, reported_step_ = 0, plan_version_ = 0;
  // The lease held: [begin, end) positions, consumed so far.
  uint64_t lease_ = 0, token_ = 0, size_ = 0, consumed_ = 0;
};

class Fleet {
 public:
  Fleet(const Options& o, const std::string& address, const std::string& token, int n)
      : o_(o), token_(token) {
    for (int c = 0; c < std::max(1, o.channels); ++c) {
      grpc::ChannelArguments args;
      args.SetInt("pacer.bench.channel", c);  // a distinct argument: a connection of its own
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
      sharding_.push_back(ShardingService::NewStub(ch));
      monitor_.push_back(Monitor::NewStub(ch));
    }
    for (int t = 0; t < std::max(1, o.threads); ++t) cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
    for (int i = 0; i < n; ++i) {
      workers_.push_back(std::make_unique<Worker>(this, i, cqs_[i % cqs_.size()].get(),
                                                  sharding_[i % sharding_.size()].get(),
                                                  monitor_[i % monitor_.size()].get()));
    }
  }
  void Run() {
    for (auto& cq : cqs_) {
      threads_.emplace_back([q = cq.get()] {
        void* tag = nullptr;
        bool ok = false;
        while (q->Next(&tag, &ok)) static_cast<Tag*>(tag)->Done(ok);
      });
    }
    // Registration, then ticks spread over one heartbeat interval.
    const auto t0 = Wall::now() + std::chrono::milliseconds(200);
    for (size_t i = 0; i < workers_.size(); ++i) {
      const auto phase = std::chrono::microseconds(static_cast<int64_t>(
          1000.0 * o_.heartbeat_ms * static_cast<double>(i) / static_cast<double>(workers_.size())));
      Worker* w = workers_[i].get();
      // Start runs on the worker's own queue thread: an alarm due now.
      auto* start = new StartTag(w, t0 + phase);
      start->alarm.Set(w->cq_, Wall::now(), start);
    }
  }
  // Stops every worker; returns when no call or timer is outstanding, then drains the queues.
  void Stop() {
    for (auto& w : workers_) {
      auto* t = new StopTag(w.get());
      t->alarm.Set(w->cq_, Wall::now(), t);
    }
    // Every call has a deadline (AddMetadata), so every worker goes idle; the queues are shut
    // down only then (an alarm set on a shut-down queue is a gRPC assertion).
    while (stopped_.load() < workers_.size()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (auto& cq : cqs_) cq->Shutdown();
    for (auto& t : threads_) t.join();
  }
  void AddMetadata(grpc::ClientContext* ctx) const {
    ctx->AddMetadata("authorization", "Bearer " + token_);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  const Options& o() const { return o_; }
  Counters counters;
  Histogram heartbeat_all, heartbeat_interval;
  std::atomic<size_t> stopped_{0};

 private:
  struct StartTag : Tag {
    Worker* w;
    Wall::time_point first;
    grpc::Alarm alarm;
    StartTag(Worker* worker, Wall::time_point f) : w(worker), first(f) {}
    void Done(bool) override {
      w->Start(first);
      delete this;
    }
  };
  struct StopTag : Tag {
    Worker* w;
    grpc::Alarm alarm;
    explicit StopTag(Worker* worker) : w(worker) {}
    void Done(bool) override {
      w->Stop();
      w->alarm_.Cancel();  // its Timer tag still comes back (ok = false)
      Poll();
      delete this;
    }
    void Poll() {
      if (w->idle()) {
        ++w->fleet_->stopped_;
        return;
      }
      auto* again = new StopPoll(w);
      again->alarm.Set(w->cq_, Wall::now() + std::chrono::milliseconds(20), again);
    }
  };
  struct StopPoll : Tag {
    Worker* w;
    grpc::Alarm alarm;
    explicit StopPoll(Worker* worker) : w(worker) {}
    void Done(bool) override {
      if (w->idle()) {
        ++w->fleet_->stopped_;
      } else {
        auto* again = new StopPoll(w);
        again->alarm.Set(w->cq_, Wall::now() + std::chrono::milliseconds(20), again);
      }
      delete this;
    }
  };

  const Options& o_;
  const std::string token_;
  std::vector<std::unique_ptr<ShardingService::Stub>> sharding_;
  std::vector<std::unique_ptr<Monitor::Stub>> monitor_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

Worker::Worker(Fleet* fleet, int index, grpc::CompletionQueue* cq, ShardingService::Stub* sharding,
               Monitor::Stub* monitor)
    : fleet_(fleet),
      index_(index),
      id_("lw" + std::to_string(index)),
      node_("ln" + std::to_string(index / 8)),
      cq_(cq),
      sharding_(sharding),
      monitor_(monitor) {}

template <class Resp, class Fn>
Worker::Call<Resp, Fn>* Worker::NewCall(Fn fn) {
  auto* c = new Call<Resp, Fn>(this, std::move(fn));
  fleet_->AddMetadata(&c->ctx);
  ++in_flight_;
  return c;
}

void Worker::Start(Wall::time_point first_tick) {
  next_tick_ = first_tick;
  Register();
}

void Worker::Register() {
  pacer::RegisterWorkerRequest req;
  req.set_worker_id(id_);
  req.set_node(node_);
  auto* c = NewCall<pacer::RegisterWorkerResponse>([](auto& call) {
    Worker* w = call.w;
    if (!call.status.ok()) {
      w->fleet_->counters.Error("RegisterWorker", call.status);
      if (!w->stopping_) w->ScheduleTick();  // tried again at the next tick
      return;
    }
    w->incarnation_ = call.resp.incarnation();
    w->OnRegistered();
  });
  c->reader = sharding_->AsyncRegisterWorker(&c->ctx, req, cq_);
  c->reader->Finish(&c->resp, &c->status, c);
}

void Worker::OnRegistered() {
  pacer::MonitorRegisterRequest req;
  req.set_worker_id(id_);
  req.set_node(node_);
  auto* c = NewCall<pacer::MonitorRegisterResponse>([](auto& call) {
    Worker* w = call.w;
    if (!call.status.ok()) {
      w->fleet_->counters.Error("Monitor.RegisterWorker", call.status);
    } else {
      w->registered_ = true;
      ++w->fleet_->counters.registrations;
    }
    if (!w->stopping_) w->ScheduleTick();
  });
  c->reader = monitor_->AsyncRegisterWorker(&c->ctx, req, cq_);
  c->reader->Finish(&c->resp, &c->status, c);
}

void Worker::ScheduleTick() {
  if (alarm_set_ || stopping_) return;
  const auto now = Wall::now();
  while (next_tick_ <= now) next_tick_ += std::chrono::milliseconds(fleet_->o().heartbeat_ms);
  alarm_set_ = true;
  alarm_.Set(cq_, next_tick_, &timer_);
}

void Worker::OnTick(bool ok) {
  alarm_set_ = false;
  if (!ok || stopping_) return;
  if (!registered_) {
    Register();
    return;
  }
  // The steps "trained" since the last tick consume the lease.
  const Options& o = fleet_->o();
  if (lease_ != 0) {
    consumed_ = std::min(size_, consumed_ + static_cast<uint64_t>(o.steps_per_heartbeat) * o.batch);
  }
  step_ += static_cast<uint64_t>(o.steps_per_heartbeat);
  ReportSteps();
  if (lease_ != 0 && consumed_ >= size_ && !completing_) Complete();
  else if (lease_ == 0 && !fetching_) Fetch();
  Heartbeat();
  ScheduleTick();
}

void Worker::Heartbeat() {
  if (heartbeat_in_flight_) {
    ++fleet_->counters.heartbeats_skipped;
    return;
  }
  heartbeat_in_flight_ = true;
  pacer::HeartbeatRequest req;
  req.set_worker_id(id_);
  req.set_incarnation(incarnation_);
  req.set_step(step_);
  req.set_plan_version(plan_version_);
  if (lease_ != 0 && !completing_) {
    pacer::ProgressRequest* p = req.add_progress();
    p->set_worker_id(id_);
    p->set_incarnation(incarnation_);
    p->set_lease_id(lease_);
    p->set_fencing_token(token_);
    p->set_records_done(consumed_);
  }
  auto* c = NewCall<pacer::HeartbeatResponse>([](auto& call) {
    Worker* w = call.w;
    w->heartbeat_in_flight_ = false;
    const double s = std::chrono::duration<double>(Steady::now() - call.start).count();
    w->fleet_->heartbeat_all.Add(s);
    w->fleet_->heartbeat_interval.Add(s);
    if (!call.status.ok()) {
      w->fleet_->counters.Error("Heartbeat", call.status);
      return;
    }
    ++w->fleet_->counters.heartbeats;
    for (const auto& cmd : call.resp.commands()) {
      if (!cmd.has_batch_plan() || cmd.batch_plan().version() <= w->plan_version_) continue;
      w->plan_version_ = cmd.batch_plan().version();
      auto& newest = w->fleet_->counters.newest_plan;
      for (uint64_t seen = newest.load(); seen < w->plan_version_ &&
                                          !newest.compare_exchange_weak(seen, w->plan_version_);) {
      }
    }
    for (uint64_t id : call.resp.cancelled_leases()) {
      if (id == w->lease_) w->lease_ = 0;  // fenced elsewhere: fetch another
    }
  });
  c->reader = sharding_->AsyncHeartbeat(&c->ctx, req, cq_);
  c->reader->Finish(&c->resp, &c->status, c);
}

void Worker::ReportSteps() {
  const Options& o = fleet_->o();
  if (report_in_flight_) {  // the steps go in the next report
    ++fleet_->counters.reports_skipped;
    return;
  }
  report_in_flight_ = true;
  pacer::ReportStepsRequest req;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const double step_s = o.heartbeat_ms / 1000.0 / o.steps_per_heartbeat;
  // A modelled speed: most workers alike, every 16th 30 % slower (the monitor classifies);
  // with --shift-s the slow ones change every shift_s seconds.
  const int64_t shift = o.shift_s > 0 ? static_cast<int64_t>(now_ms / (1000 * o.shift_s)) : 0;
  const double compute = step_s * ((index_ + shift) % 16 == 0 ? 0.9 : 0.6);
  // Every step since the last report sent (at most the last 64: the monitor's de-duplication
  // window), so a skipped report's steps arrive with the next.
  const uint64_t from = std::max(reported_step_ + 1, step_ >= 64 ? step_ - 63 : 1);
  reported_step_ = step_;
  for (uint64_t st = from; st <= step_; ++st) {
    pacer::StepReport* r = req.add_steps();
    r->set_worker_id(id_);
    r->set_step(st);
    r->set_local_batch(static_cast<uint32_t>(o.batch));
    r->set_samples(static_cast<uint64_t>(o.batch));
    r->set_compute_s(compute);
    r->set_comm_s(step_s - compute);
    r->set_wall_s(step_s);
    r->set_time_ms(now_ms);
  }
  auto* c = NewCall<pacer::ReportStepsResponse>([](auto& call) {
    call.w->report_in_flight_ = false;
    if (!call.status.ok()) {
      call.w->fleet_->counters.Error("ReportSteps", call.status);
      return;
    }
    ++call.w->fleet_->counters.step_reports;
  });
  c->reader = monitor_->AsyncReportSteps(&c->ctx, req, cq_);
  c->reader->Finish(&c->resp, &c->status, c);
}

void Worker::TakeLease(const pacer::FetchShardResponse& r) {
  Counters& k = fleet_->counters;
  if (r.outcome() == pacer::FetchShardResponse::LEASED) {
    ++k.leased;
    lease_ = r.lease().lease_id();
    token_ = r.lease().fencing_token();
    size_ = r.lease().end() - r.lease().begin();
    consumed_ = r.lease().records_done();
  } else if (r.outcome() == pacer::FetchShardResponse::WAIT) {
    ++k.waits;
  } else {
    ++k.end_of_data;
  }
}

void Worker::Fetch() {
  pacer::FetchShardRequest req;
  req.set_worker_id(id_);
  req.set_incarnation(incarnation_);
  req.set_dataset("load");
  req.set_request_id(++request_id_);
  fetching_ = true;
  auto* c = NewCall<pacer::FetchShardResponse>([](auto& call) {
    Worker* w = call.w;
    w->fetching_ = false;
    ++w->fleet_->counters.fetches;
    if (!call.status.ok()) {
      w->fleet_->counters.Error("FetchShard", call.status);
      return;
    }
    w->TakeLease(call.resp);
  });
  c->reader = sharding_->AsyncFetchShard(&c->ctx, req, cq_);
  c->reader->Finish(&c->resp, &c->status, c);
}

void Worker::Complete() {
  pacer::CompleteShardRequest req;
  req.set_worker_id(id_);
  req.set_incarnation(incarnation_);
  req.set_lease_id(lease_);
  req.set_fencing_token(token_);
  req.set_next_dataset("load");
  req.set_next_request_id(++request_id_);
  completing_ = true;
  auto* c = NewCall<pacer::CompleteShardResponse>([](auto& call) {
    Worker* w = call.w;
    w->completing_ = false;
    ++w->fleet_->counters.completions;
    if (!call.status.ok()) {
      w->fleet_->counters.Error("CompleteShard", call.status);
      w->lease_ = 0;  // fetch afresh at the next tick
      return;
    }
    w->lease_ = 0;
    if (call.resp.has_next()) w->TakeLease(call.resp.next());
  });
  c->reader = sharding_->AsyncCompleteShard(&c->ctx, req, cq_);
  c->reader->Finish(&c->resp, &c->status, c);
}

// ---- pacerd ----

struct Child {
  pid_t pid = -1;
  std::string dir, address, token;
};

// The running child, for the signal handler (SIGINT / SIGTERM end it before the bench exits).
volatile sig_atomic_t g_child_pid = -1;

void OnSignal(int sig) {
  if (g_child_pid > 0) kill(-g_child_pid, SIGTERM);
  signal(sig, SIG_DFL);
  raise(sig);
}

std::string SelfDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : p.parent_path().string();
}

bool StartPacerd(const Options& o, int workers, Child* child, std::string* err) {
  char tmpl[] = "/tmp/pacerd_load_bench.XXXXXX";
  if (!mkdtemp(tmpl)) {
    *err = "mkdtemp failed";
    return false;
  }
  child->dir = tmpl;
  std::random_device rd;
  char tok[33];
  std::snprintf(tok, sizeof(tok), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  child->token = tok;
  const std::string token_file = child->dir + "/job.token";
  {
    std::ofstream f(token_file);
    f << child->token << "\n";
  }
  chmod(token_file.c_str(), 0600);
  const std::string port_file = child->dir + "/port.json";
  const std::string log = child->dir + "/pacerd.log";
  const std::string bin = o.pacerd.empty() ? SelfDir() + "/pacerd" : o.pacerd;
  if (access(bin.c_str(), X_OK) != 0) {
    *err = "no pacerd binary at " + bin;
    return false;
  }
  std::vector<std::string> argv = {bin,
                                   "--data-dir", child->dir + "/data",
                                   "--listen", "127.0.0.1:0",
                                   "--metrics-listen", "127.0.0.1:0",
                                   "--job-token-file", token_file,
                                   "--port-file", port_file,
                                   "--heartbeat-interval-ms", std::to_string(o.heartbeat_ms),
                                   "--max-workers", std::to_string(std::max(workers + 16, 1024))};
  if (!o.policy.empty()) {
    argv.push_back("--policy");
    argv.push_back(o.policy);
  }
  const pid_t pid = fork();
  if (pid < 0) {
    *err = "fork failed";
    return false;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // pacerd goes when the bench does, however it ends
    FILE* f = std::fopen(log.c_str(), "a");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  child->pid = pid;
  g_child_pid = pid;
  // Until the port file appears (pacerd writes it once serving) or the child exits.
  for (int i = 0; i < 600; ++i) {
    std::ifstream f(port_file);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t at = s.find("\"port\":");
    if (at != std::string::npos) {
      child->address = "127.0.0.1:" + std::to_string(std::atoi(s.c_str() + at + 7));
      return true;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      child->pid = -1;
      *err = "pacerd exited; its log: " + log;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  *err = "pacerd did not serve within 60 s; its log: " + log;
  return false;
}

void StopPacerd(Child* child) {
  if (child->pid <= 0) return;
  g_child_pid = -1;
  kill(-child->pid, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    int status = 0;
    if (waitpid(child->pid, &status, WNOHANG) == child->pid) {
      child->pid = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (child->pid > 0) {
    kill(-child->pid, SIGKILL);
    waitpid(child->pid, nullptr, 0);
    child->pid = -1;
  }
  std::error_code ec;
  std::filesystem::remove_all(child->dir, ec);
}

bool RegisterDataset(const std::string& address, const std::string& token, uint64_t records,
                     uint64_t shard_size, std::string* err) {
  auto stub = ShardingService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  pacer::RegisterDatasetRequest req;
  pacer::DatasetSpec* spec = req.mutable_spec();
  spec->set_name("load");
  spec->set_num_records(records);
  spec->set_shard_size(shard_size);
  spec->set_batch_size(32);
  spec->set_num_epochs(1);
  pacer::RegisterDatasetResponse resp;
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Status s = stub->RegisterDataset(&ctx, req, &resp);
  if (!s.ok()) *err = "RegisterDataset: " + s.error_message();
  return s.ok();
}

struct LevelResult {
  int workers = 0;
  double seconds = 0, rss_start = 0, rss_warm = 0, rss_end = 0, rss_max = 0;
  double cpu_s = 0, cpu_ms_per_worker_s = 0, bench_cpu_s = 0;
  // pacerd's run-queue wait per second of its CPU after the warm-up, and the machine's load
  // average (lowest and highest sample) during the level.
  double wait_per_cpu_s = 0, load_min = 0, load_max = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  uint64_t heartbeats = 0, step_reports = 0, completions = 0, errors = 0, skipped = 0;
  uint64_t newest_plan = 0;  // batch plans issued (the newest version a heartbeat carried)
  std::string pacerd;        // "baseline" or "this" with --baseline-pacerd
};

bool RunLevel(const Options& o, int n, LevelResult* out) {
  Child child;
  std::string err;
  std::string address = o.address, token;
  pid_t pid = o.pacerd_pid;
  if (address.empty()) {
    if (!StartPacerd(o, n, &child, &err)) {
      std::cerr << "pacerd_load_bench: " << err << "\n";
      return false;
    }
    address = child.address;
    token = child.token;
    pid = child.pid;
  } else {
    std::ifstream f(o.job_token_file);
    std::getline(f, token);
  }
  // Enough records that the epoch outlasts the level (2x what the workers can consume).
  const double per_s = 1000.0 / o.heartbeat_ms * o.steps_per_heartbeat * o.batch;
  const uint64_t records = static_cast<uint64_t>(2 * n * per_s * (o.duration_s + 60)) + 100 * o.shard_size;
  if (!RegisterDataset(address, token, records, o.shard_size, &err)) {
    std::cerr << "pacerd_load_bench: " << err << "\n";
    StopPacerd(&child);
    return false;
  }
  out->workers = n;
  out->rss_start = pid > 0 ? RssMiB(pid) : 0;
  const double cpu0 = pid > 0 ? CpuSeconds(pid) : 0, self0 = SelfCpuSeconds();
  double cpu_warm = cpu0, wait_warm = pid > 0 ? RunQueueWaitSeconds(pid) : 0;
  double wait_last = wait_warm;
  out->load_min = out->load_max = LoadAverage();
  Fleet fleet(o, address, token, n);
  const auto t0 = Steady::now();
  fleet.Run();
  auto next_sample = t0 + std::chrono::duration<double>(o.sample_s);
  const auto warm_at = t0 + std::chrono::duration<double>(std::min(o.warmup_s, o.duration_s));
  const auto end_at = t0 + std::chrono::duration<double>(o.duration_s);
  bool warm = false;
  uint64_t hb_last = 0;
  double t_last = 0, cpu_last = cpu0;
  if (!o.json) {
    std::printf("-- %d workers, %.0f s (pacerd pid %d at %s)\n", n, o.duration_s, pid, address.c_str());
    std::printf("%8s %9s %8s %9s %6s %10s %9s %9s %9s %9s %7s\n", "t_s", "rss_MiB", "cpu_%",
                "rq_wait_%", "load", "hb/s", "p50_ms", "p99_ms", "max_ms", "hb_skip", "errors");
    std::fflush(stdout);
  }
  while (Steady::now() < end_at) {
    std::this_thread::sleep_until(std::min({next_sample, end_at, warm ? end_at : warm_at}));
    const auto now = Steady::now();
    const double t = std::chrono::duration<double>(now - t0).count();
    const double rss = pid > 0 ? RssMiB(pid) : 0;
    out->rss_max = std::max(out->rss_max, rss);
    if (!warm && now >= warm_at) {
      warm = true;
      out->rss_warm = rss;
      cpu_warm = pid > 0 ? CpuSeconds(pid) : 0;
      wait_warm = pid > 0 ? RunQueueWaitSeconds(pid) : 0;
    }
    if (now >= next_sample || now >= end_at) {
      const double cpu = pid > 0 ? CpuSeconds(pid) : 0;
      const double wait = pid > 0 ? RunQueueWaitSeconds(pid) : 0;
      const double load = LoadAverage();
      out->load_min = std::min(out->load_min, load);
      out->load_max = std::max(out->load_max, load);
      const uint64_t hb = fleet.counters.heartbeats.load();
      if (!o.json) {
        // rq_wait_%: pacerd's threads' time runnable but not running, per wall second (summed
        // over threads, like cpu_%).
        std::printf("%8.0f %9.1f %8.1f %9.1f %6.1f %10.0f %9.2f %9.2f %9.2f %9llu %7llu\n", t, rss,
                    100 * (cpu - cpu_last) / std::max(1e-9, t - t_last),
                    100 * (wait - wait_last) / std::max(1e-9, t - t_last), load,
                    static_cast<double>(hb - hb_last) / std::max(1e-9, t - t_last),
                    1000 * fleet.heartbeat_interval.Pct(0.5), 1000 * fleet.heartbeat_interval.Pct(0.99),
                    1000 * fleet.heartbeat_interval.max(),
                    static_cast<unsigned long long>(fleet.counters.heartbeats_skipped.load()),
                    static_cast<unsigned long long>(fleet.counters.Errors()));
        std::fflush(stdout);
      }
      fleet.heartbeat_interval.Reset();
      hb_last = hb;
      t_last = t;
      cpu_last = cpu;
      wait_last = wait;
      while (next_sample <= now) next_sample += std::chrono::duration_cast<Steady::duration>(
                                                    std::chrono::duration<double>(o.sample_s));
    }
  }
  const double seconds = std::chrono::duration<double>(Steady::now() - t0).count();
  const double cpu1 = pid > 0 ? CpuSeconds(pid) : 0;
  out->rss_end = pid > 0 ? RssMiB(pid) : 0;
  out->rss_max = std::max(out->rss_max, out->rss_end);
  fleet.Stop();
  out->seconds = seconds;
  out->cpu_s = cpu1 - cpu0;
  // Per worker-second after the warm-up (registration bursts excluded).
  const double steady_s = std::max(1e-9, seconds - std::min(o.warmup_s, seconds));
  out->cpu_ms_per_worker_s = 1000 * (cpu1 - cpu_warm) / (static_cast<double>(n) * steady_s);
  if (pid > 0) {
    out->wait_per_cpu_s = (RunQueueWaitSeconds(pid) - wait_warm) / std::max(1e-9, cpu1 - cpu_warm);
  }
  out->bench_cpu_s = SelfCpuSeconds() - self0;
  out->p50_ms = 1000 * fleet.heartbeat_all.Pct(0.5);
  out->p99_ms = 1000 * fleet.heartbeat_all.Pct(0.99);
  out->max_ms = 1000 * fleet.heartbeat_all.max();
  out->heartbeats = fleet.counters.heartbeats.load();
  out->step_reports = fleet.counters.step_reports.load();
  out->completions = fleet.counters.completions.load();
  out->errors = fleet.counters.Errors();
  out->skipped = fleet.counters.heartbeats_skipped.load();
  out->newest_plan = fleet.counters.newest_plan.load();
  {
    std::lock_guard<std::mutex> l(fleet.counters.mu);
    for (const auto& [k, v] : fleet.counters.errors) std::fprintf(stderr, "  errors %s: %llu\n", k.c_str(), static_cast<unsigned long long>(v));
    for (const auto& e : fleet.counters.first_errors) std::fprintf(stderr, "  e.g. %s\n", e.c_str());
  }
  StopPacerd(&child);
  return true;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    auto val = [&](const char* name) -> const char* {
      if (std::strcmp(argv[i], name) != 0 || i + 1 >= argc) return nullptr;
      return argv[++i];
    };
    const char* v = nullptr;
    if (!std::strcmp(argv[i], "--json")) o.json = true;
    else if ((v = val("--workers"))) o.workers = ParseList(v);
    else if ((v = val("--duration-s"))) o.duration_s = std::atof(v);
    else if ((v = val("--warmup-s"))) o.warmup_s = std::atof(v);
    else if ((v = val("--sample-s"))) o.sample_s = std::atof(v);
    else if ((v = val("--heartbeat-ms"))) o.heartbeat_ms = std::atoi(v);
    else if ((v = val("--steps-per-heartbeat"))) o.steps_per_heartbeat = std::atoi(v);
    else if ((v = val("--batch"))) o.batch = std::atoi(v);
    else if ((v = val("--shard-size"))) o.shard_size = std::strtoull(v, nullptr, 10);
    else if ((v = val("--threads"))) o.threads = std::atoi(v);
    else if ((v = val("--channels"))) o.channels = std::atoi(v);
    else if ((v = val("--pacerd"))) o.pacerd = v;
    else if ((v = val("--address"))) o.address = v;
    else if ((v = val("--job-token-file"))) o.job_token_file = v;
    else if ((v = val("--pacerd-pid"))) o.pacerd_pid = std::atoi(v);
    else if ((v = val("--policy"))) o.policy = v;
    else if ((v = val("--shift-s"))) o.shift_s = std::atof(v);
    else if ((v = val("--baseline-pacerd"))) o.baseline_pacerd = v;
    else if (!std::strcmp(argv[i], "--help")) {
      std::cout << "Usage: pacerd_load_bench [--workers 64,512,4096] [--duration-s S] [--warmup-s S]\n"
                   "  [--sample-s S] [--heartbeat-ms MS] [--steps-per-heartbeat N] [--batch B]\n"
                   "  [--shard-size N] [--threads T] [--channels C] [--pacerd PATH]\n"
                   "  [--address HOST:PORT --job-token-file F [--pacerd-pid PID]] [--json]\n"
                   "  [--policy FILE [--shift-s S]] [--baseline-pacerd PATH]\n";
      return 0;
    } else {
      std::cerr << "pacerd_load_bench: unknown option '" << argv[i] << "' (--help)\n";
      return 2;
    }
  }
  if (o.workers.empty() || o.duration_s <= 0 || o.heartbeat_ms < 10 || o.steps_per_heartbeat < 1 ||
      o.batch < 1 || o.shard_size < 1 || o.threads < 1 || o.channels < 1 ||
      (!o.address.empty() && o.job_token_file.empty())) {
    std::cerr << "pacerd_load_bench: bad options (--help)\n";
    return 2;
  }
  for (int n : o.workers)
    if (n < 1 || n > 65536) {
      std::cerr << "pacerd_load_bench: --workers entries must be in 1..65536\n";
      return 2;
    }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::vector<LevelResult> results;
  std::vector<std::pair<std::string, std::string>> binaries = {{"", o.pacerd}};
  if (!o.baseline_pacerd.empty()) binaries = {{"baseline", o.baseline_pacerd}, {"this", o.pacerd}};
  for (int n : o.workers) {
    for (const auto& [label, bin] : binaries) {
      Options run = o;
      run.pacerd = bin;
      LevelResult r;
      if (!label.empty() && !o.json) std::printf("== pacerd: %s\n", label.c_str());
      if (!RunLevel(run, n, &r)) return 1;
      r.pacerd = label;
      results.push_back(r);
    }
  }
  if (o.json) {
    std::printf("[");
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      std::printf("%s{\"workers\":%d,\"seconds\":%.1f,\"rss_start_mib\":%.1f,\"rss_warm_mib\":%.1f,"
                  "\"rss_end_mib\":%.1f,\"rss_max_mib\":%.1f,\"cpu_s\":%.2f,\"cpu_ms_per_worker_s\":%.4f,"
                  "\"bench_cpu_s\":%.2f,\"heartbeat_p50_ms\":%.2f,\"heartbeat_p99_ms\":%.2f,"
                  "\"heartbeat_max_ms\":%.2f,\"heartbeats\":%llu,\"step_reports\":%llu,"
                  "\"completions\":%llu,\"heartbeats_skipped\":%llu,\"errors\":%llu,"
                  "\"runqueue_wait_per_cpu_s\":%.2f,\"load_min\":%.1f,\"load_max\":%.1f,"
                  "\"plans\":%llu,\"pacerd\":\"%s\"}",
                  i ? "," : "", r.workers, r.seconds, r.rss_start, r.rss_warm, r.rss_end, r.rss_max,
                  r.cpu_s, r.cpu_ms_per_worker_s, r.bench_cpu_s, r.p50_ms, r.p99_ms, r.max_ms,
                  static_cast<unsigned long long>(r.heartbeats),
                  static_cast<unsigned long long>(r.step_reports),
                  static_cast<unsigned long long>(r.completions),
                  static_cast<unsigned long long>(r.skipped),
                  static_cast<unsigned long long>(r.errors), r.wait_per_cpu_s, r.load_min,
                  r.load_max, static_cast<unsigned long long>(r.newest_plan), r.pacerd.c_str());
    }
    std::printf("]\n");
  } else {
    // wait/cpu: pacerd's run-queue wait per second of its CPU after the warm-up (above 1: it
    // waited for a CPU longer than it ran); load: the load average, lowest-highest sample.
    std::printf("\n%8s %8s %7s %9s %9s %9s %9s %9s %12s %8s %8s %8s %10s %8s %7s %9s %11s %6s\n",
                "pacerd", "workers", "secs", "rss0_MiB", "rssW_MiB", "rssE_MiB", "rssMax", "growth",
                "cpu_ms/w·s", "p50_ms", "p99_ms", "max_ms", "heartbeats", "hb_skip", "errors",
                "wait/cpu", "load", "plans");
    for (const auto& r : results) {
      std::printf("%8s %8d %7.0f %9.1f %9.1f %9.1f %9.1f %+9.1f %12.4f %8.2f %8.2f %8.1f %10llu %8llu %7llu "
                  "%9.2f %5.1f-%-5.1f %6llu\n",
                  r.pacerd.empty() ? "-" : r.pacerd.c_str(), r.workers, r.seconds, r.rss_start,
                  r.rss_warm, r.rss_end, r.rss_max,
                  r.rss_end - r.rss_warm, r.cpu_ms_per_worker_s, r.p50_ms, r.p99_ms, r.max_ms,
                  static_cast<unsigned long long>(r.heartbeats), static_cast<unsigned long long>(r.skipped),
                  static_cast<unsigned long long>(r.errors), r.wait_per_cpu_s, r.load_min, r.load_max,
                  static_cast<unsigned long long>(r.newest_plan));
    }
  }
  uint64_t errors = 0;
  for (const auto& r : results) errors += r.errors;
  return errors == 0 ? 0 : 3;
}
