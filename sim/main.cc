// pacer-sim: runs the real monitor, controller and sharding state against modelled workers
// and compares policies with the balanced bound (docs/design.md §7, docs/simulator.md).
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include "common/flags.h"
#include "sim/comparison.h"
#include "sim/report.h"
#include "sim/scenario.h"

#ifndef PACER_POLICY_DIR
#define PACER_POLICY_DIR "policies"
#endif

namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description opts("Options");
  opts.add_options()
      ("scenario", po::value<std::string>(), "scenario YAML file (sim/scenarios/*.yaml)")
      ("policy", po::value<std::vector<std::string>>(),
       "policy NAME (none, backup-workers, lb-bsp, timeout-relaunch, non-dedicated, dedicated) or a "
       "policy FILE; repeat for several (default: all six)")
      ("policy-dir", po::value<std::string>()->default_value(PACER_POLICY_DIR),
       "where policy NAMEs are looked up")
      ("json", "print JSON instead of the table")
      ("svg", po::value<std::string>(), "write a throughput-over-time plot to this file")
      ("json-file", po::value<std::string>(), "also write the JSON report to this file")
      ("threads", po::value<int>()->default_value(0),
       "policies run in parallel (0 = one per core); results do not depend on it")
      ("max-wall-s", po::value<double>()->default_value(1800),
       "give up (exit 4) when the comparison runs longer than this many wall-clock seconds");
  pacer::ParsedFlags f = pacer::ParseFlagsOrExit(
      argc, argv, "usage: pacer-sim --scenario FILE [--policy NAME|FILE ...] [--json] [--svg FILE] [--json-file FILE]",
      opts);
  const std::string prog = "pacer-sim";
  if (!f.vm.count("scenario")) pacer::ExitWithError(prog, "--scenario FILE is required");
  absl::StatusOr<pacer::sim::Scenario> sc =
      pacer::sim::LoadScenarioFile(f.vm["scenario"].as<std::string>());
  if (!sc.ok()) pacer::ExitWithError(prog, std::string(sc.status().message()));
  std::vector<std::string> names = f.vm.count("policy")
                                       ? f.vm["policy"].as<std::vector<std::string>>()
                                       : pacer::sim::DefaultPolicies();
  std::vector<pacer::sim::PolicyChoice> policies;
  for (const auto& n : names) {
    auto p = pacer::sim::ResolvePolicy(n, f.vm["policy-dir"].as<std::string>());
    if (!p.ok()) pacer::ExitWithError(prog, std::string(p.status().message()));
    policies.push_back(std::move(*p));
  }
  int threads = f.vm["threads"].as<int>();
  if (threads < 0 || threads > 1024) pacer::ExitWithError(prog, "--threads must be in 0..1024");
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double max_wall_s = f.vm["max-wall-s"].as<double>();
  if (!(max_wall_s > 0 && max_wall_s <= 7 * 24 * 3600)) {
    pacer::ExitWithError(prog, "--max-wall-s must be in (0, 604800]");
  }
  // The wall-clock limit: a watchdog that ends the process (the simulation holds no resource
  // that outlives it), so no scenario, however large, runs unbounded.
  std::thread([max_wall_s, name = f.vm["scenario"].as<std::string>()] {
    std::this_thread::sleep_for(std::chrono::duration<double>(max_wall_s));
    std::cerr << "pacer-sim: " << name << " still running after --max-wall-s " << max_wall_s
              << " s: giving up (raise --max-wall-s, or simulate fewer hours or workers)" << std::endl;
    std::_Exit(4);
  }).detach();
  auto c = pacer::sim::RunComparison(*sc, policies, threads);
  if (!c.ok()) pacer::ExitWithError(prog, std::string(c.status().message()), 1);
  std::cout << (f.vm.count("json") ? pacer::sim::FormatJson(*c) : pacer::sim::FormatTable(*c));
  if (f.vm.count("json-file")) {
    std::ofstream out(f.vm["json-file"].as<std::string>());
    out << pacer::sim::FormatJson(*c);
    if (!out) pacer::ExitWithError(prog, "cannot write " + f.vm["json-file"].as<std::string>(), 1);
  }
  if (f.vm.count("svg")) {
    std::ofstream out(f.vm["svg"].as<std::string>());
    out << pacer::sim::FormatSvg(*c);
    if (!out) pacer::ExitWithError(prog, "cannot write " + f.vm["svg"].as<std::string>(), 1);
  }
  for (const auto& r : c->runs)
    if (r.records_lost != 0 || r.records_duplicated != 0 || r.state_done_mismatch != 0) return 3;
  return 0;
}
