// PacerdHarness: a real pacerd in the test's process, for every pacerd-level test.
//
// What it gives a test, so no test starts pacerd by hand:
//   - its own temp dir (data dir, policy files), a port chosen by the OS, no metrics endpoint;
//   - a SimulatedClock by default: the housekeeping thread is off and the test advances time
//     with Advance(ms), which runs Pacerd::HousekeepingStep() -- the step production's thread
//     runs (lease expiry, the monitor's windows, a reconcile when due) -- so a test never
//     re-implements it and never races it. With `real_clock` the thread runs as in production;
//   - named test policies (tests/testing/policies/NAME.yaml, `TestPolicy("dedicated-1s")`);
//   - Restart() on the same data dir and port (durability tests); mutable_options() for what
//     the next start should change, and TryStart() for a test that expects a start to be
//     refused (start = false: nothing starts until the test says so, e.g. once it has made
//     certificates or damaged the data dir);
//   - ScriptedWorker: a worker whose steps, heartbeats and leases the test scripts, talking to
//     pacerd over real gRPC on loopback with its own per-worker credential.
// Failures to start are gtest failures (ADD_FAILURE) and leave pacerd() null: tests call
// ASSERT_TRUE(h.ok()). Every test that starts pacerd in process does it through this class.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cmd/pacerd/pacerd.h"
#include "common/clock.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/batch_plan.h"
#include "worker_sdk/sharding_client.h"

namespace pacer::testing {

// The path of a named test policy: tests/testing/policies/NAME.yaml.
std::string TestPolicy(const std::string& name);

struct HarnessOptions {
  // A test policy name, a path (containing '/'), or empty for "none". It is copied to the
  // harness's dir (policy_path()): a test may edit the copy and Restart().
  std::string policy;
  bool real_clock = false;  // the production housekeeping thread on the real clock
  // Where the simulated clock starts; 0: a round epoch, so windows start at the test's time
  // zero. A test whose real processes stamp real time (a pacer-agent's node metrics) passes
  // RealClock::Get()->NowMs(), or pacerd refuses their reports as from the future.
  int64_t start_ms = 0;
  // 0: one reconcile a second on the simulated clock; with `real_clock`, production's default
  // (a test converted from a hand-made start keeps the interval it had).
  int64_t reconcile_interval_ms = 0;
  // The data dir; empty: <dir()>/data (a chaos test puts it on a small tmpfs).
  std::string data_dir;
  // false: the constructor prepares dir, options and clock but does not start pacerd; the
  // test starts it with TryStart() (e.g. after damaging the data dir, or expecting a refusal).
  bool start = true;
  // Anything else a test needs set (called last, before the start).
  std::function<void(PacerdOptions&)> adjust;
};

class PacerdHarness {
 public:
  explicit PacerdHarness(HarnessOptions options = {});
  ~PacerdHarness();

  bool ok() const { return pacerd_ != nullptr; }
  Pacerd& pacerd() { return *pacerd_; }
  Pacerd* operator->() { return pacerd_.get(); }
  const Clock* clock() const;
  SimulatedClock& sim_clock() { return clock_; }
  const TempDir& dir() const { return dir_; }
  const PacerdOptions& options() const { return options_; }
  // The options of the next start (Restart(), TryStart()): a test changes them between starts
  // (e.g. --accept-data-loss after a damage). The listen address keeps the port once started.
  PacerdOptions& mutable_options() { return options_; }
  // The --policy file pacerd runs with (a copy the test may edit); empty without a policy.
  const std::string& policy_path() const { return options_.policy_file; }
  std::string address() const { return pacerd_->address(); }
  const std::string& job_token() const { return pacerd_->job_token(); }
  const std::string& admin_token() const { return pacerd_->admin_token(); }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

  // Simulated clock: advances it by `ms` and runs one housekeeping step (production's).
  void Advance(int64_t ms);
  // Runs one housekeeping step now (no time passes).
  void Housekeep() { pacerd_->HousekeepingStep(); }
  // Stops pacerd and starts it again on the same data dir and port (the clock goes on).
  void Restart();
  void Stop();
  // Starts pacerd (stopped, or not started: `start` = false) with options() on the harness's
  // clock and returns why it did not start instead of failing the test: the one way a test
  // that expects pacerd to refuse a start (a damaged data dir, plaintext on a public address)
  // calls Pacerd::Start.
  absl::Status TryStart();

  // The controller's audit trail, newest first (ListActions over gRPC, as pacerctl reads it).
  ListActionsResponse Actions(uint32_t limit = 0);

 private:
  void Start();

  TempDir dir_;
  SimulatedClock clock_;
  HarnessOptions harness_options_;
  PacerdOptions options_;
  std::unique_ptr<Pacerd> pacerd_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A worker the test scripts. Connect() registers it with the sharding service and the monitor
// under its own credential (kind worker). Step() reports one training step to the monitor;
// Heartbeat() sends its step, the plan and exclusion versions it holds and whether it honours
// exclusion, and applies what the reply carries (batch plans through the SDK's LocalBatchPlan,
// the exclusion), returning the reply.
class ScriptedWorker {
 public:
  struct Options {
    std::string id;
    std::string node;  // default: "n-<id>"
    uint32_t batch = 64;
    bool honors_exclusion = false;
    uint32_t max_local_batch = 0;
    std::string run_id;
  };
  ScriptedWorker(PacerdHarness& harness, Options options);

  absl::Status Connect();
  // One step: the worker's batch in force (its plan for this step; `samples` >= 0 trains on
  // that many instead, e.g. an excluded worker's probe), with compute time `compute_s` and wall
  // time `wall_s`, reported at the harness clock's time. Advances step().
  absl::Status Step(double compute_s, double wall_s, double comm_s = -1, int64_t samples = -1);
  absl::StatusOr<HeartbeatResponse> Heartbeat();
  // The same, carrying step timings as the SDK's heartbeat does (HeartbeatRequest.step_timings:
  // its newest finished step, the step it is computing and for how long).
  absl::StatusOr<HeartbeatResponse> Heartbeat(const std::vector<HeartbeatStepTiming>& timings);

  const std::string& id() const { return options_.id; }
  uint64_t step() const { return step_; }
  void set_step(uint64_t step) { step_ = step; }
  // The batch this worker trains on at its current step (the plan's samples, else its own).
  int64_t batch();
  // The plan entry in force at its current step (version 0: the initial batch).
  const LocalBatch& batch_in_force() { return plan_.ForStep(step_); }
  uint64_t plan_version() const { return plan_.newest_version(); }
  bool excluded() const { return excluded_; }
  uint64_t exclusion_version() const { return exclusion_version_; }
  // What its heartbeats say from now on (e.g. a trainer restarted on one that cannot skip a
  // gradient); ForgetExclusion(): a restarted trainer holds no exclusion version.
  void set_honors_exclusion(bool honors) { options_.honors_exclusion = honors; }
  bool honors_exclusion() const { return options_.honors_exclusion; }
  void ForgetExclusion() { exclusion_version_ = 0; excluded_ = false; }
  // Every exclusion command a heartbeat reply carried, oldest first, with the version the
  // worker held and whether it said it honours exclusion when it got it (a test checks that
  // versions only move forward and that none went to a worker that cannot carry it out).
  struct ReceivedExclusion {
    uint64_t held_version = 0;
    bool honoring = false;
    ExclusionCommand command;
  };
  const std::vector<ReceivedExclusion>& exclusions_received() const { return received_; }
  ShardingClient& sharding() { return *sharding_; }
  const std::string& credential() const { return credential_; }

 private:
  PacerdHarness& h_;
  Options options_;
  std::string credential_;
  std::unique_ptr<ShardingClient> sharding_;
  std::unique_ptr<Monitor::Stub> monitor_;
  LocalBatchPlan plan_;
  uint64_t step_ = 0;
  uint64_t exclusion_version_ = 0;
  bool excluded_ = false;
  std::vector<ReceivedExclusion> received_;
};

// A synchronous job of ScriptedWorkers on a PacerdHarness, stepped on the simulated clock: every
// `tick_ms` one all-reduce step (each live worker computes batch × per_sample_s / speed, the
// wall is the slowest counted worker's compute plus `comm_s`; an excluded worker reports a
// probe of a quarter batch, as pacer-train-mlp does), every `heartbeat_ms` a heartbeat per
// worker (commands applied), and production's housekeeping step after every tick.
class ScriptedJob {
 public:
  struct Options {
    int workers = 4;
    uint32_t batch = 64;
    double per_sample_s = 0.04 / 64;
    double comm_s = 0.005;
    int64_t tick_ms = 100;
    int64_t heartbeat_ms = 1000;
    bool honors_exclusion = false;
  };
  ScriptedJob(PacerdHarness& harness, Options options);

  absl::Status Connect();
  // Runs `ms` of simulated time.
  absl::Status Run(int64_t ms);
  // One heartbeat per live worker now (e.g. after a Restart() and Connect()).
  absl::Status Heartbeats();
  // A worker's speed factor (1 = nominal; 0.5 = half speed).
  void SetSpeed(const std::string& worker, double factor) { speed_[worker] = factor; }
  // A worker stops (no steps, no heartbeats) until Revive().
  void Kill(const std::string& worker) { dead_.insert(worker); }
  void Revive(const std::string& worker) { dead_.erase(worker); }
  ScriptedWorker& worker(const std::string& id);
  std::vector<std::unique_ptr<ScriptedWorker>>& workers() { return workers_; }
  uint64_t step() const { return step_; }
  int64_t elapsed_ms() const { return elapsed_ms_; }

 private:
  PacerdHarness& h_;
  Options o_;
  std::vector<std::unique_ptr<ScriptedWorker>> workers_;
  std::map<std::string, double> speed_;
  std::set<std::string> dead_;
  uint64_t step_ = 0;
  int64_t elapsed_ms_ = 0;
};

}  // namespace pacer::testing
