// Test helpers shared by every tier: private temp dirs, waiting for a condition with a deadline
// (never sleeping as synchronisation), and child processes that are always reaped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pacer::testing {

// A fresh directory under $TEST_TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Polls `condition` (every `poll`) until it holds or `timeout` passes; returns whether it held.
bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll = std::chrono::milliseconds(10));

// A child process in its own process group. The destructor kills the group (SIGKILL) and
// reaps it, so no test leaves a process behind.
class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;

  // Starts argv[0] (a path) with `env` added to the environment; stdout+stderr go to
  // `log_path` (appended) when given.
  static Subprocess Start(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {},
                          const std::string& log_path = "");
  pid_t pid() const { return pid_; }
  bool running();
  // Sends `sig` to the process group.
  void Signal(int sig);
  // Waits for exit up to `timeout`; returns the wait status, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout);
  // SIGKILL + reap.
  void Kill();
  int exit_status() const { return status_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// Path of a binary built by this project (PACER_BIN_DIR, set by ctest).
std::string BinaryPath(const std::string& name);

// A process's resident set size in KiB (VmRSS), this process's when `pid` is 0; -1 if unknown.
int64_t RssKb(pid_t pid = 0);

// Reads a whole file; empty if missing.
std::string ReadFileOrEmpty(const std::string& path);

// The live write-ahead log of a RocksDB folder (its newest *.log), or "" when it holds none.
std::string LiveWal(const std::string& rocksdb_dir);

}  // namespace pacer::testing
