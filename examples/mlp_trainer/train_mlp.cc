// pacer-train-mlp: example (a) of the worker SDK, a synchronous data-parallel trainer.
//
// Each worker process reads its records through ShardReader (the sharding service decides who
// trains on what), runs the local batch its BatchPlan gives for the step (uneven across
// workers; micro-batches x accumulation steps), averages gradients with the SDK's weighted
// all-reduce on Gloo (sum b_i g_i / sum b_i, so the update equals a full-batch update), times
// data wait / communication / compute with StepTimer, and reports progress after each update.
// The model is a one-hidden-layer MLP on a synthetic nonlinear task (synthetic_task.h). At the
// end every worker evaluates the same held-out set and prints (and writes --result-file):
// accuracy, steps, samples and a checksum of the parameters (equal on every rank).
//
//   pacer-train-mlp --addr HOST:PORT --token-file F --worker-id w0 --rank 0 --world-size 4
//       --store-dir /tmp/run1/gloo --batch 8 --register-records 20000 --epochs 2
//
// It honors EXCLUDE_WORKERS (Client::excluded()): while excluded it hands its leases back, joins
// each all-reduce with weight 0 and times half a batch of discarded gradients every --probe-ms,
// so the controller sees it recover. It keeps the step line pacerd hands it (Client::
// step_line_s): it computes a micro-batch in slices (noting the step's progress for the
// heartbeat after each: StepTimer::NoteProgress) and, between them, once its step has
// computed past the line, reports at once (Client::ReportStepPastLine); excluded by the reply
// (or by any reply meanwhile), it abandons the step -- weight 0 in the all-reduce, the step's
// records handed back uncounted with its leases -- so the others' step does not wait for the
// rest of a burst's step.
//
// --collective none trains each worker alone (no all-reduce): the mode the crash tests use to
// kill and restart a worker mid-shard. --ledger keeps the exactly-once ledger of
// examples/consumer/ledger.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "common/flags.h"
#include "common/log.h"
#include "examples/consumer/trainer_start.h"
#include "examples/mlp_trainer/mlp.h"
#include "examples/mlp_trainer/synthetic_task.h"
#include "worker_sdk/client.h"
#include "worker_sdk/collective.h"
#include "worker_sdk/gloo_collective.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/step_timer.h"

namespace po = boost::program_options;
using namespace pacer;
using namespace pacer::examples;

namespace {

class SoloCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(std::span<float>) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

uint64_t Checksum(const std::vector<float>& p) {
  uint64_t h = 1469598103934665603ull;
  for (float v : p) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  ExitWithError("pacer-train-mlp", what + ": " + std::string(s.message()), 1);
}

}  // namespace

int main(int argc, char** argv) {
  SetLogProgramName("pacer-train-mlp");
  ClientOptions copts;
  std::string dataset = "train", store_dir, collective_kind = "gloo", result_file, ledger_path;
  std::string allreduce_algorithm = "bcube";
  uint64_t register_records = 0, shard_size = 0, eval_records = 2000, max_steps = 0;
  uint32_t epochs = 1, batch = 32, accumulation = 1, hidden = 32, rank = 0, world = 1;
  float lr = 0.2f;
  double target = 0, step_ms = 0;
  int64_t probe_ms = 2'000;
  uint64_t seed = 1;
  po::options_description desc("Options");
  AddClientFlags(desc, &copts);
  desc.add_options()
      ("dataset", po::value(&dataset)->default_value(dataset), "dataset to train on")
      ("register-records", po::value(&register_records), "register the dataset with this many records first (same on every worker)")
      ("shard-size", po::value(&shard_size), "records per shard when registering (default 10 x batch)")
      ("epochs", po::value(&epochs)->default_value(epochs), "epochs when registering")
      ("batch", po::value(&batch)->default_value(batch), "initial local micro batch (until a batch plan arrives)")
      ("accumulation", po::value(&accumulation)->default_value(accumulation), "initial accumulation steps")
      ("rank", po::value(&rank)->default_value(rank), "this worker's rank in the all-reduce group")
      ("world-size", po::value(&world)->default_value(world), "all-reduce group size")
      ("store-dir", po::value(&store_dir), "Gloo FileStore directory shared by the ranks (fresh per run)")
      ("collective", po::value(&collective_kind)->default_value(collective_kind), "gloo | none")
      ("allreduce-algorithm", po::value(&allreduce_algorithm)->default_value(allreduce_algorithm),
       "Gloo all-reduce: bcube (fewer steps; default) | ring")
      ("hidden", po::value(&hidden)->default_value(hidden), "hidden units")
      ("lr", po::value(&lr)->default_value(lr), "learning rate")
      ("seed", po::value(&seed)->default_value(seed), "model init seed (same on every rank)")
      ("eval-records", po::value(&eval_records)->default_value(eval_records), "held-out samples")
      ("target-accuracy", po::value(&target)->default_value(0), "exit 3 when the final accuracy is below")
      ("max-steps", po::value(&max_steps)->default_value(0), "stop after this many steps (0: end of data)")
      ("step-ms", po::value(&step_ms)->default_value(0), "extra simulated compute per step (demos)")
      ("probe-ms", po::value(&probe_ms)->default_value(probe_ms),
       "while excluded from the job's steps: time half a batch this often (keep it well under the monitor's window)")
      ("result-file", po::value(&result_file), "write a JSON line with the results here")
      ("ledger", po::value(&ledger_path), "keep the exactly-once ledger here");
  ParseFlagsOrExit(argc, argv, "Usage: pacer-train-mlp [options]", desc);
  if (batch == 0 || accumulation == 0) ExitWithError("pacer-train-mlp", "--batch and --accumulation must be > 0");
  if (probe_ms <= 0) ExitWithError("pacer-train-mlp", "--probe-ms must be > 0");
  if (collective_kind != "gloo" && collective_kind != "none") {
    ExitWithError("pacer-train-mlp", "--collective: gloo | none");
  }
  copts.initial_micro_batch = batch;
  copts.initial_accumulation_steps = accumulation;
  // This trainer carries out EXCLUDE_WORKERS (the excluded branch of the loop below).
  copts.honors_exclusion = collective_kind == "gloo" && world > 1;

  auto started = StartTrainer(copts, {.dataset = dataset, .ledger_path = ledger_path,
                                      .register_records = register_records, .shard_size = shard_size,
                                      .epochs = epochs, .shuffle_seed = 17,
                                      .batch_size = uint64_t{batch} * accumulation});
  if (!started.ok()) ExitWithError("pacer-train-mlp", std::string(started.status().message()), 1);
  Client& client = *started->client;
  auto reader_or = ShardReader::Create(&client, started->reader_options);
  if (!reader_or.ok()) Fail("reader", reader_or.status());
  ShardReader& reader = **reader_or;

  std::unique_ptr<Collective> collective;
  if (collective_kind == "gloo" && world > 1) {
    if (store_dir.empty()) ExitWithError("pacer-train-mlp", "--store-dir is required with --world-size > 1");
    GlooOptions g;
    g.rank = static_cast<int>(rank);
    g.size = static_cast<int>(world);
    g.store_dir = store_dir;
    g.prefix = dataset;
    if (!ParseGlooAlgorithm(allreduce_algorithm, &g.algorithm)) {
      ExitWithError("pacer-train-mlp", "--allreduce-algorithm: bcube | ring, not '" + allreduce_algorithm + "'");
    }
    auto c = GlooCollective::Create(g);
    if (!c.ok()) Fail("all-reduce group", c.status());
    collective = std::move(*c);
  } else {
    collective = std::make_unique<SoloCollective>();
  }
  const bool lockstep = collective->size() > 1;

  SyntheticTask task(TaskSpec{});
  const uint32_t dims = task.spec().dims;
  Mlp model(dims, hidden, task.spec().classes, seed);
  StepTimer timer(&client);
  std::vector<uint64_t> ids;
  std::vector<float> x, grad, step_grad, scratch;
  std::vector<uint32_t> labels;
  uint64_t step = 0, samples_total = 0;
  // Steps that updated the model, and those of them where this worker trained less than its
  // planned batch before its data ended (its reader had nothing more in time).
  uint64_t updates = 0, short_steps = 0;
  double last_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  uint64_t excluded_steps = 0, abandoned_steps = 0;
  bool handed_back = false;  // the leases went back at this exclusion
  // A step abandoned at the step line: the position of its first record. Its records (and any
  // read after them) are not trained: they go back uncounted when the leases are handed back,
  // which the next step does before anything else. kAllHandedOut: none.
  uint64_t untrained_from = ShardReader::kAllHandedOut;
  // Slices a micro-batch is computed in when the job steps together: between them the step line
  // is checked, when one is in force, and the step's progress is noted for the heartbeat
  // (StepTimer::NoteProgress: pacerd measures a slowed worker's speed within its slow step);
  // and how long the report of a step past the line may wait for its reply.
  constexpr uint32_t kLineSlices = 4;
  constexpr int64_t kLineReplyMs = 2'000;
  auto last_probe = std::chrono::steady_clock::time_point();  // excluded: the last probe
  for (;;) {
    if (max_steps > 0 && step >= max_steps) break;
    const LocalBatch& plan = client.batch_plan().ForStep(step);
    client.SetStep(step);
    const uint64_t planned = uint64_t{plan.micro_batch} * plan.accumulation_steps;
    timer.BeginStep(step, planned);
    if (lockstep && (client.excluded() || untrained_from != ShardReader::kAllHandedOut)) {
      // EXCLUDE_WORKERS: the others do not wait for this worker's gradient. It hands its
      // leases back (every record it was given is trained and reported by now), trains on
      // nothing and joins each all-reduce with weight 0. So that the controller sees when it
      // can be waited for again, every --probe-ms it times half its planned batch over data it
      // already holds (gradient discarded) and reports that step. Not less: under a CPU quota
      // (the usual contention in shared clusters) a short burst of work runs at full speed on
      // the quota's carried-over slack and would hide the slowdown; and not on every step: a
      // slowed probe holds that one step back, and a worker computing between all-reduces
      // would spend the quota its all-reduces need.
      // (Or let back in before an abandoned step's records went back: they go back first, and
      // this step is a weight-0 one too.)
      if (!handed_back) {
        auto released = reader.ReleaseAll(10'000, untrained_from);
        handed_back = released.ok();
        if (!released.ok()) {
          PACER_LOG(WARNING) << "excluded, leases not handed back yet (next step): " << released.status();
        } else {
          PACER_LOG(INFO) << "excluded from the job's steps: handed back " << *released << " lease(s)"
                          << (untrained_from != ShardReader::kAllHandedOut
                                  ? ", the abandoned step's records uncounted" : "");
          untrained_from = ShardReader::kAllHandedOut;
        }
        timer.BeginStep(step, planned);  // the release is not this step's compute
      }
      ++excluded_steps;
      uint64_t probe = 0;
      if (const auto now = std::chrono::steady_clock::now(); now - last_probe >= std::chrono::milliseconds(probe_ms)) {
        last_probe = now;
        const uint64_t target_rows = std::max<uint64_t>(1, uint64_t{plan.micro_batch} * plan.accumulation_steps / 2);
        if (labels.empty()) {  // nothing trained yet: probe on held-out samples
          x.resize(dims);
          labels.assign(1, task.Sample(kEvalIdBase, x.data()));
        }
        // At least kMinProbeS too: well past what a quota's carried-over slack runs at full speed.
        constexpr double kMinProbeS = 0.02;
        while (probe < target_rows ||
               std::chrono::duration<double>(std::chrono::steady_clock::now() - now).count() < kMinProbeS) {
          const uint64_t want = probe < target_rows ? target_rows - probe : std::max<uint64_t>(1, target_rows / 4);
          const size_t n = static_cast<size_t>(std::min<uint64_t>(want, labels.size()));
          model.Gradient(x.data(), labels.data(), n, &grad);
          probe += n;
        }
      }
      step_grad.assign(model.num_params(), 0.0f);
      double total = 0;
      {
        auto scope = timer.Time(StepTimer::Phase::kCommunication);
        absl::Status s = WeightedAverage(*collective, step_grad, 0.0, &total, &scratch);
        if (!s.ok()) Fail("all-reduce", s);
      }
      if (total > 0) model.Step(step_grad, lr / (1.0f + static_cast<float>(step) / 200.0f));
      if (probe > 0) timer.EndStep(plan.micro_batch, probe);
      ++step;
      if (total == 0) {  // the others' end-of-data check: this worker holds no data
        float running = 0.0f;
        absl::Status s = collective->AllReduceSum(std::span<float>(&running, 1));
        if (!s.ok()) Fail("all-reduce", s);
        if (running == 0.0f) break;
      }
      if (client.stop_requested()) break;
      continue;
    }
    if (reader.holding_off()) {
      PACER_LOG(INFO) << "included in the job's steps again after " << excluded_steps << " excluded step(s)";
      reader.Resume();
      handed_back = false;
    }
    step_grad.assign(model.num_params(), 0.0f);
    uint64_t samples = 0;
    bool ended = false;
    double loss_sum = 0;
    // The step line: between slices, whether to abandon the step (see the file comment).
    const uint64_t step_from = reader.records_read();
    const bool keeps_line = lockstep && client.step_line_s() > 0;
    bool line_reported = false, abandon = false;
    auto stop_here = [&] {
      if (!lockstep) return false;
      if (client.excluded()) return true;  // a heartbeat reply excluded it during the step
      if (!keeps_line || line_reported || !timer.PastStepLine()) return false;
      line_reported = true;
      absl::StatusOr<bool> out = false;
      {
        auto scope = timer.Time(StepTimer::Phase::kCommunication);  // not this step's compute
        out = client.ReportStepPastLine(kLineReplyMs);
      }
      if (!out.ok()) {
        PACER_LOG(WARNING) << "step line: " << out.status();
      }
      return out.ok() && *out;
    };
    for (uint32_t k = 0; k < plan.accumulation_steps && !ended && !abandon; ++k) {
      ids.clear();
      absl::StatusOr<ShardReader::Outcome> got;
      {
        auto scope = timer.Time(StepTimer::Phase::kDataWait);
        got = reader.Next(plan.micro_batch, &ids,
                          lockstep ? ShardReader::Blocking::kUntilPrefetched
                                   : ShardReader::Blocking::kUntilData);
      }
      if (!got.ok()) Fail("read", got.status());
      if (*got == ShardReader::Outcome::kEndOfData) ended = true;
      if (ids.empty()) break;
      x.resize(ids.size() * dims);
      labels.resize(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) labels[i] = task.Sample(ids[i], &x[i * dims]);
      const size_t slice = lockstep ? (ids.size() + kLineSlices - 1) / kLineSlices : ids.size();
      for (size_t from = 0; from < ids.size() && !abandon; from += slice) {
        const size_t n = std::min(slice, ids.size() - from);
        loss_sum += model.Gradient(&x[from * dims], &labels[from], n, &grad) * n;
        for (size_t i = 0; i < grad.size(); ++i) step_grad[i] += grad[i] * static_cast<float>(n);
        samples += n;
        if (lockstep) timer.NoteProgress(samples);
        abandon = stop_here();
      }
    }
    if (!abandon && step_ms > 0) {  // simulated extra compute (demos), not synchronisation
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(step_ms * 1000)));
      abandon = stop_here();
    }
    if (abandon) {
      // Weight 0 in the all-reduce, nothing trained: the records read for this step go back
      // uncounted at the next step (ShardReader::ReleaseAll), to be trained by another worker.
      PACER_LOG(INFO) << "step " << step << " abandoned at the step line after " << samples << " of "
                      << planned << " samples (" << timer.ComputeSoFarS()
                      << " s of compute): its records go back uncounted";
      step_grad.assign(model.num_params(), 0.0f);
      untrained_from = step_from;
      ended = false;  // its records are not done
      ++abandoned_steps;
    }
    const uint64_t computed = samples;
    if (abandon) samples = 0;
    if (samples > 0) {
      for (float& v : step_grad) v /= static_cast<float>(samples);
      last_loss = loss_sum / static_cast<double>(samples);
    }
    double total = 0;
    {
      auto scope = timer.Time(StepTimer::Phase::kCommunication);
      absl::Status s = WeightedAverage(*collective, step_grad, static_cast<double>(samples), &total, &scratch);
      if (!s.ok()) Fail("all-reduce", s);
    }
    // Step decay: the final iterate, not a lucky one, is evaluated.
    if (total > 0) model.Step(step_grad, lr / (1.0f + static_cast<float>(step) / 200.0f));
    if (!abandon) reader.MarkConsumed();
    if (total > 0) ++updates;
    if (samples < planned && !ended && !abandon && total > 0) ++short_steps;
    samples_total += samples;
    // An abandoned step is reported too, with what it computed: the burst's pace.
    if (computed > 0) timer.EndStep(plan.micro_batch, computed);
    ++step;
    if (total == 0) {
      // Nobody had data this step: either every worker has ended, or the rest of the epoch is
      // in flight elsewhere. Every rank sees total == 0 at the same step, so this extra
      // collective stays in lockstep.
      float running = ended ? 0.0f : 1.0f;
      absl::Status s = collective->AllReduceSum(std::span<float>(&running, 1));
      if (!s.ok()) Fail("all-reduce", s);
      if (running == 0.0f) break;
      if (!lockstep) std::this_thread::yield();
    }
    if (client.stop_requested()) {
      PACER_LOG(INFO) << "stop requested: " << client.stop_reason();
      break;
    }
    if (step % 200 == 0) {
      PACER_LOG(INFO) << "step " << step << " loss " << last_loss << " local batch "
                      << plan.micro_batch << "x" << plan.accumulation_steps;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  absl::Status flushed = client.Flush(30'000);
  if (!flushed.ok()) Fail("flush", flushed);

  std::vector<float> ex(dims);
  uint64_t correct = 0;
  for (uint64_t i = 0; i < eval_records; ++i) {
    const uint32_t label = task.Sample(kEvalIdBase + i, ex.data());
    correct += model.Predict(ex.data()) == label;
  }
  const double accuracy = eval_records ? static_cast<double>(correct) / eval_records : 0;
  const auto stats = client.stats();
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"worker\":\"%s\",\"rank\":%u,\"accuracy\":%.4f,\"steps\":%llu,"
                "\"updates\":%llu,\"short_steps\":%llu,\"samples\":%llu,"
                "\"final_batch\":%u,\"plans_received\":%llu,\"excluded_steps\":%llu,\"abandoned_steps\":%llu,"
                "\"seconds\":%.2f,"
                "\"checksum\":\"%016llx\"}",
                client.worker_id().c_str(), rank, accuracy, static_cast<unsigned long long>(step),
                static_cast<unsigned long long>(updates), static_cast<unsigned long long>(short_steps),
                static_cast<unsigned long long>(samples_total), client.batch_plan().current().micro_batch,
                static_cast<unsigned long long>(stats.plans_received),
                static_cast<unsigned long long>(excluded_steps),
                static_cast<unsigned long long>(abandoned_steps), secs,
                static_cast<unsigned long long>(Checksum(model.params())));
  std::cout << line << std::endl;
  if (!result_file.empty()) {
    std::ofstream(result_file) << line << "\n";
  }
  client.Close();
  reader_or->reset();
  if (target > 0 && accuracy < target) {
    std::cerr << "pacer-train-mlp: accuracy " << accuracy << " below target " << target << "\n";
    return 3;
  }
  return 0;
}
