// A worker process for the agent tests.
//
//   agent_test_worker sleep                       idle until killed
//   agent_test_worker crash --after-ms N --code C exit with code C after N ms
//   agent_test_worker spin --progress FILE        CPU-bound loop; every 50 ms writes
//                                                 "<iterations> <cpu_ns> <wall_ns>\n" to FILE
//                                                 (atomically, by rename)
// Options: --only WORKER_ID   act only when $PACER_WORKER_ID is WORKER_ID, otherwise sleep
//          --env-file FILE    write the PACER_* environment to FILE at start
//          --env-dir DIR      write the PACER_* and torchrun variables (RANK, MASTER_PORT,
//                             TORCHELASTIC_*, ...) to DIR/<worker id>.<restart count>.env at
//                             start (atomically, by rename)
//          --exit-at-restart N  exit 0 at once (after the env files) when
//                             $TORCHELASTIC_RESTART_COUNT >= N
// Prints "started <pid> <worker id>" first.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

extern char** environ;

namespace {

int64_t Ns(clockid_t c) {
  timespec ts;
  clock_gettime(c, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

[[noreturn]] void Idle() {
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "sleep";
  std::string progress, only, env_file, env_dir;
  long after_ms = 0, code = 1, exit_at_restart = -1;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--progress") progress = v;
    if (k == "--after-ms") after_ms = std::atol(v.c_str());
    if (k == "--code") code = std::atol(v.c_str());
    if (k == "--only") only = v;
    if (k == "--env-file") env_file = v;
    if (k == "--env-dir") env_dir = v;
    if (k == "--exit-at-restart") exit_at_restart = std::atol(v.c_str());
  }
  const char* id = std::getenv("PACER_WORKER_ID");
  std::printf("started %d %s\n", getpid(), id ? id : "?");
  std::fflush(stdout);
  if (!env_file.empty()) {
    std::ofstream out(env_file);
    for (char** e = environ; *e; ++e) {
      if (std::strncmp(*e, "PACER_", 6) == 0) out << *e << "\n";
    }
  }
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const long restart_count = restart ? std::atol(restart) : -1;
  if (!env_dir.empty()) {
    const std::string path = env_dir + "/" + (id ? id : "unknown") + "." +
                             (restart ? restart : "none") + ".env";
    {
      std::ofstream out(path + ".tmp");
      for (char** e = environ; *e; ++e) {
        static const char* const kPrefixes[] = {"PACER_", "RANK=", "LOCAL_", "WORLD_SIZE=", "GROUP_",
                                                "ROLE_", "MASTER_", "TORCHELASTIC_"};
        for (const char* p : kPrefixes) {
          if (std::strncmp(*e, p, std::strlen(p)) == 0) {
            out << *e << "\n";
            break;
          }
        }
      }
    }
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  if (exit_at_restart >= 0 && restart_count >= exit_at_restart) {
    std::printf("restart %ld: exiting 0\n", restart_count);
    return 0;
  }
  if (!only.empty() && (id == nullptr || only != id)) Idle();
  if (mode == "sleep") Idle();
  if (mode == "crash") {
    usleep(static_cast<useconds_t>(after_ms) * 1000);
    std::fprintf(stderr, "crashing with code %ld\n", code);
    return static_cast<int>(code);
  }
  if (mode == "spin") {
    const std::string tmp = progress + ".tmp";
    volatile uint64_t sink = 0;
    uint64_t iterations = 0;
    const int64_t wall0 = Ns(CLOCK_MONOTONIC), cpu0 = Ns(CLOCK_PROCESS_CPUTIME_ID);
    int64_t next_report = wall0;
    for (;;) {
      for (int i = 0; i < 20000; ++i) sink = sink * 31 + i;  // one unit of work
      ++iterations;
      const int64_t wall = Ns(CLOCK_MONOTONIC);
      if (wall >= next_report) {
        next_report = wall + 50'000'000;
        if (FILE* f = std::fopen(tmp.c_str(), "w")) {
          std::fprintf(f, "%llu %lld %lld\n", static_cast<unsigned long long>(iterations),
                       static_cast<long long>(Ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0),
                       static_cast<long long>(wall - wall0));
          std::fclose(f);
          std::rename(tmp.c_str(), progress.c_str());
        }
      }
    }
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
