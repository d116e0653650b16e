// A minimal elastic all-reduce worker for sdk_elastic_allreduce_test: rank r contributes
// (r+1)*(step+1) each step and checks the sum is world*(world+1)/2*(step+1), through an
// ElasticGlooCollective rendezvousing in pacerd. After every (re)build the ranks agree on the
// step (one all-reduce of each rank's step; the largest wins), as a real trainer would before
// broadcasting its model. All ranks stop at the same step once one of them sees --stop-file.
//
// Prints "joined gen G rank R", "regrouped gen G at step S", "step S gen G" every 10 steps and
// "done step S checked N" at the end. Exit 0: stopped cleanly; 2: a wrong sum; 3: regroup
// failed.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/flags.h"
#include "common/log.h"
#include "worker_sdk/client.h"
#include "worker_sdk/elastic_gloo.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  pacer::SetLogProgramName("elastic-test-worker");
  pacer::ClientOptions co;
  int rank = -1;
  uint32_t world = 0;
  std::string stop_file;
  int64_t timeout_ms = 5'000, compute_us = 2'000;
  po::options_description desc("Options");
  pacer::AddClientFlags(desc, &co);
  desc.add_options()("rank", po::value(&rank)->default_value(-1), "rank (-1: pacerd assigns)")(
      "world-size", po::value(&world)->required(), "ranks in the group")(
      "stop-file", po::value(&stop_file)->required(), "stop once this file exists")(
      "timeout-ms", po::value(&timeout_ms)->default_value(timeout_ms), "collective timeout")(
      "compute-us", po::value(&compute_us)->default_value(compute_us), "simulated compute per step");
  pacer::ParseFlagsOrExit(argc, argv, "Usage: elastic_test_worker [options]", desc);
  co.report_steps = false;

  auto client = pacer::Client::Connect(co);
  if (!client.ok()) pacer::ExitWithError("elastic_test_worker", client.status().ToString(), 4);
  pacer::ElasticGlooOptions eo;
  eo.rank = rank;
  eo.world_size = world;
  eo.timeout_ms = timeout_ms;
  eo.regroup_timeout_ms = 90'000;
  auto coll = pacer::ElasticGlooCollective::Create(client->get(), eo);
  if (!coll.ok()) pacer::ExitWithError("elastic_test_worker", coll.status().ToString(), 3);
  pacer::ElasticGlooCollective& c = **coll;
  std::printf("joined gen %lu rank %d\n", static_cast<unsigned long>(c.generation()), c.rank());
  std::fflush(stdout);

  const float per_step = static_cast<float>(world) * static_cast<float>(world + 1) / 2.0f;
  uint64_t step = 0, checked = 0;
  bool need_sync = true;
  for (;;) {
    if (c.regroup_pending()) {
      if (absl::Status s = c.Regroup(); !s.ok()) {
        pacer::ExitWithError("elastic_test_worker", "regroup: " + s.ToString(), 3);
      }
      std::printf("regrouped gen %lu at step %lu\n", static_cast<unsigned long>(c.generation()),
                  static_cast<unsigned long>(step));
      std::fflush(stdout);
      need_sync = true;
    }
    if (need_sync) {
      std::vector<float> steps(world, 0.0f);
      steps[c.rank()] = static_cast<float>(step);
      if (!c.AllReduceSum(steps).ok()) continue;  // broken: regroup at the top
      step = static_cast<uint64_t>(*std::max_element(steps.begin(), steps.end()));
      need_sync = false;
    }
    // The step's "compute" (work, not synchronisation).
    std::this_thread::sleep_for(std::chrono::microseconds(compute_us));
    struct stat st;
    const bool stop = ::stat(stop_file.c_str(), &st) == 0;
    std::vector<float> data = {static_cast<float>(c.rank() + 1) * static_cast<float>(step + 1),
                               stop ? 1.0f : 0.0f};
    if (absl::Status s = c.AllReduceSum(data); !s.ok()) {
      std::printf("collective failed at step %lu: %s\n", static_cast<unsigned long>(step),
                  std::string(s.message()).c_str());
      std::fflush(stdout);
      continue;
    }
    const float want = per_step * static_cast<float>(step + 1);
    if (data[0] != want) {
      std::printf("WRONG sum at step %lu: %g, want %g\n", static_cast<unsigned long>(step), data[0], want);
      return 2;
    }
    ++checked;
    if (data[1] > 0) {
      std::printf("done step %lu checked %lu gen %lu\n", static_cast<unsigned long>(step),
                  static_cast<unsigned long>(checked), static_cast<unsigned long>(c.generation()));
      std::fflush(stdout);
      (*client)->Close(2'000);
      return 0;
    }
    ++step;
    if (step % 10 == 0) {
      std::printf("step %lu gen %lu\n", static_cast<unsigned long>(step),
                  static_cast<unsigned long>(c.generation()));
      std::fflush(stdout);
    }
  }
}
