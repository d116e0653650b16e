#include "tests/testing/pacerd_process.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace pacer::testing {

void PacerdProcess::Start() {
  const std::string port_file = dir_.Sub("port.json");
  std::filesystem::remove(port_file);
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::vector<std::string> argv = {BinaryPath("pacerd"), "--data-dir", dir_.Sub("data"),
                                     "--listen", "127.0.0.1:" + std::to_string(port_),
                                     "--metrics-listen", "", "--port-file", port_file};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    proc_ = Subprocess::Start(argv, {}, dir_.Sub("pacerd.log"));
    if (WaitFor([&] { return std::filesystem::exists(port_file) || !proc_.running(); },
                std::chrono::seconds(20)) &&
        std::filesystem::exists(port_file)) {
      const std::string s = ReadFileOrEmpty(port_file);
      port_ = std::stoi(s.substr(s.find(':') + 1));
      return;
    }
    proc_.Kill();  // the port was not free yet, or it failed: try again
  }
  FAIL() << "pacerd did not start; log:\n" << ReadFileOrEmpty(dir_.Sub("pacerd.log"));
}

}  // namespace pacer::testing
