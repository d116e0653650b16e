// PacerdProcess: the real pacerd binary as a child process of a test, for chaos tests that
// kill -9 it and start it again on the same data dir and the same port (clients reconnect to
// the address they had). Every process is reaped (testing::Subprocess).
#pragma once

#include <string>
#include <vector>

#include "tests/testing/test_util.h"

namespace pacer::testing {

class PacerdProcess {
 public:
  // pacerd keeps its data dir, port file and log in `dir`; `flags` are added to its command line.
  PacerdProcess(const TempDir& dir, std::vector<std::string> flags)
      : dir_(dir), flags_(std::move(flags)) {}

  // Starts pacerd (on the previous port after the first start) and waits until it serves;
  // a gtest failure (with pacerd's log) if it does not.
  void Start();
  void Kill9() { proc_.Kill(); }
  bool running() { return proc_.running(); }
  pid_t pid() const { return proc_.pid(); }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  const TempDir& dir_;
  const std::vector<std::string> flags_;
  Subprocess proc_;
  int port_ = 0;
};

}  // namespace pacer::testing
