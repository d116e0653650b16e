// sdk_bench: what the worker SDK costs a training step.
//
// One process, one run: an in-process pacerd (loopback gRPC, durable journal) and one worker
// whose training loop "computes" for 10 ms per step (a busy loop on the steady clock). The same
// loop runs in alternating blocks with the SDK on (ShardReader::Next + MarkConsumed, batch plan,
// StepTimer with step reports; the Client's reporter batches heartbeat, progress and step
// statistics in the background) and off (record ids from a local array, no accounting), so
// drift and noise hit both modes alike. It prints, per mode, the mean wall time per step and
// the time the training thread spent inside SDK calls (mean, p50, p99, max), and:
//   overhead_fraction_10ms_step = (mean SDK time per step on - off) / 10 ms
//   wall_overhead_fraction      = (mean wall step on - off) / mean wall step off
//   p99_sdk_call_us             = p99 over steps of the SDK time in one step (on)
//   sdk_bench [--steps N] [--batch B] [--heartbeat-ms MS] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cmd/pacerd/pacerd.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/step_timer.h"

using namespace pacer;
using Clock_ = std::chrono::steady_clock;

namespace {

double Us(Clock_::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void Compute(std::chrono::microseconds d) {
  const auto until = Clock_::now() + d;
  volatile uint64_t x = 0;
  while (Clock_::now() < until) x = x + 1;
}

struct ModeStats {
  std::vector<double> sdk_us;
  std::vector<double> wall_us;
  double Mean(const std::vector<double>& v) const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  double Pct(std::vector<double> v, double p) const {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
  }
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 600, batch = 32, heartbeat_ms = 1000;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batch = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--heartbeat-ms") && i + 1 < argc) heartbeat_ms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--help")) {
      std::cout << "Usage: sdk_bench [--steps N] [--batch B] [--heartbeat-ms MS] [--json]\n";
      return 0;
    } else {
      std::cerr << "sdk_bench: unknown option '" << argv[i] << "'\n";
      return 2;
    }
  }
  if (steps < 20 || batch < 1) {
    std::cerr << "sdk_bench: --steps >= 20 and --batch >= 1\n";
    return 2;
  }
  char tmpl[] = "/tmp/sdk_bench.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  PacerdOptions po;
  po.data_dir = dir + "/data";
  po.listen = "127.0.0.1:0";
  po.metrics_listen = "";
  po.sharding.heartbeat_interval_ms = heartbeat_ms;
  auto pacerd = Pacerd::Start(po);
  if (!pacerd.ok()) {
    std::cerr << "sdk_bench: " << pacerd.status() << "\n";
    return 1;
  }
  ClientOptions co;
  co.address = (*pacerd)->address();
  co.token = (*pacerd)->job_token();
  co.worker_id = "bench";
  co.initial_micro_batch = static_cast<uint32_t>(batch);
  auto client = Client::Connect(co);
  if (!client.ok()) {
    std::cerr << "sdk_bench: " << client.status() << "\n";
    return 1;
  }
  DatasetSpec spec;
  spec.set_name("train");
  spec.set_num_records(static_cast<uint64_t>(steps) * batch * 2);
  spec.set_shard_size(static_cast<uint64_t>(batch) * 10);
  spec.set_num_epochs(1);
  if (auto s = (*client)->sharding().RegisterDataset(spec); !s.ok()) {
    std::cerr << "sdk_bench: " << s.status() << "\n";
    return 1;
  }
  ShardReaderOptions ro;
  ro.prefetch_leases = 2;
  auto reader = ShardReader::Create(client->get(), ro);
  if (!reader.ok()) {
    std::cerr << "sdk_bench: " << reader.status() << "\n";
    return 1;
  }
  StepTimer timer(client->get());
  std::vector<uint64_t> ids, local(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) local[i] = static_cast<uint64_t>(i);
  ModeStats on, off;
  const auto compute = std::chrono::microseconds(10'000);
  // Warm-up: the first lease and connections.
  ids.clear();
  (void)(*reader)->Next(static_cast<size_t>(batch), &ids);
  (*reader)->MarkConsumed();

  const int block = 25;
  uint64_t step = 0;
  for (int done = 0; done < 2 * steps; done += block) {
    const bool sdk = (done / block) % 2 == 0;
    for (int k = 0; k < block; ++k, ++step) {
      const auto t0 = Clock_::now();
      Clock_::duration in_sdk{};
      if (sdk) {
        auto a = Clock_::now();
        const LocalBatch& plan = (*client)->batch_plan().ForStep(step);
        (*client)->SetStep(step);
        timer.BeginStep(step);
        ids.clear();
        {
          auto wait = timer.Time(StepTimer::Phase::kDataWait);
          auto got = (*reader)->Next(plan.micro_batch, &ids);
          if (!got.ok()) {
            std::cerr << "sdk_bench: " << got.status() << "\n";
            return 1;
          }
        }
        in_sdk += Clock_::now() - a;
        Compute(compute);
        a = Clock_::now();
        (*reader)->MarkConsumed();
        timer.EndStep(plan.micro_batch, ids.size());
        in_sdk += Clock_::now() - a;
      } else {
        auto a = Clock_::now();
        ids.assign(local.begin(), local.end());
        in_sdk += Clock_::now() - a;
        Compute(compute);
      }
      ModeStats& m = sdk ? on : off;
      m.sdk_us.push_back(Us(in_sdk));
      m.wall_us.push_back(Us(Clock_::now() - t0));
    }
  }
  const absl::Status flushed = (*client)->Flush(30'000);
  const ClientStats cs = (*client)->stats();
  (*client)->Close();
  reader->reset();
  client->reset();
  pacerd->reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  const double overhead = (on.Mean(on.sdk_us) - off.Mean(off.sdk_us)) / 10'000.0;
  const double wall_overhead = (on.Mean(on.wall_us) - off.Mean(off.wall_us)) / off.Mean(off.wall_us);
  const double p99 = on.Pct(on.sdk_us, 0.99);
  if (json) {
    std::printf(
        "{\"steps_per_mode\":%d,\"batch\":%d,\"heartbeat_ms\":%d,\"overhead_fraction_10ms_step\":%.6f,"
        "\"wall_overhead_fraction\":%.6f,\"p99_sdk_call_us\":%.2f,\"p50_sdk_call_us\":%.2f,"
        "\"max_sdk_call_us\":%.2f,\"mean_sdk_call_us\":%.2f,\"mean_step_us_on\":%.1f,"
        "\"mean_step_us_off\":%.1f,\"heartbeats\":%llu,\"progress_acked\":%llu,"
        "\"completions_acked\":%llu,\"steps_reported\":%llu,\"all_acknowledged\":%s}\n",
        steps, batch, heartbeat_ms, overhead, wall_overhead, p99, on.Pct(on.sdk_us, 0.5),
        on.Pct(on.sdk_us, 1.0), on.Mean(on.sdk_us), on.Mean(on.wall_us), off.Mean(off.wall_us),
        static_cast<unsigned long long>(cs.heartbeats_ok),
        static_cast<unsigned long long>(cs.progress_acked),
        static_cast<unsigned long long>(cs.completions_acked),
        static_cast<unsigned long long>(cs.steps_sent), flushed.ok() ? "true" : "false");
  } else {
    std::printf("SDK cost per training step (10 ms compute, batch %d, heartbeat %d ms, %d steps per mode)\n",
                batch, heartbeat_ms, steps);
    std::printf("  %-28s %12s %12s\n", "", "SDK on", "SDK off");
    std::printf("  %-28s %12.1f %12.1f\n", "mean wall per step (us)", on.Mean(on.wall_us), off.Mean(off.wall_us));
    std::printf("  %-28s %12.2f %12.2f\n", "mean in SDK calls (us)", on.Mean(on.sdk_us), off.Mean(off.sdk_us));
    std::printf("  %-28s %12.2f %12.2f\n", "p50 in SDK calls (us)", on.Pct(on.sdk_us, 0.5), off.Pct(off.sdk_us, 0.5));
    std::printf("  %-28s %12.2f %12.2f\n", "p99 in SDK calls (us)", p99, off.Pct(off.sdk_us, 0.99));
    std::printf("  %-28s %12.2f %12.2f\n", "max in SDK calls (us)", on.Pct(on.sdk_us, 1.0), off.Pct(off.sdk_us, 1.0));
    std::printf("overhead_fraction_10ms_step %.6f (%.4f %%)\n", overhead, overhead * 100);
    std::printf("wall_overhead_fraction      %.6f (noisier: includes scheduling of the background threads)\n", wall_overhead);
    std::printf("background: %llu heartbeats, %llu progress reports, %llu completions, %llu step reports acknowledged%s\n",
                static_cast<unsigned long long>(cs.heartbeats_ok),
                static_cast<unsigned long long>(cs.progress_acked),
                static_cast<unsigned long long>(cs.completions_acked),
                static_cast<unsigned long long>(cs.steps_sent),
                flushed.ok() ? "" : " (NOT all acknowledged at the end)");
  }
  return flushed.ok() ? 0 : 1;
}
