// find_package(pacer): installs this build into a private prefix (cmake --install), configures
// and builds tests/sdk/find_package_consumer against that prefix only, starts the *installed*
// pacerd on loopback (port from the OS, --port-file) and runs the consumer against it:
// register, lease a shard, report it done.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <regex>

#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using std::chrono::milliseconds;
using testing::ReadFileOrEmpty;
using testing::Subprocess;
using testing::TempDir;
using testing::WaitFor;

// Runs argv to completion (or kills it at `timeout`); returns whether it exited 0.
bool RunToEnd(const std::vector<std::string>& argv, const std::string& log, milliseconds timeout) {
  Subprocess p = Subprocess::Start(argv, {}, log);
  const int status = p.Wait(timeout);
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(FindPackageTest, InstalledPackageBuildsAConsumerThatTalksToTheInstalledPacerd) {
  TempDir dir;
  const std::string prefix = dir.Sub("prefix");
  const std::string log = dir.Sub("steps.log");
  ASSERT_TRUE(RunToEnd({PACER_CMAKE_COMMAND, "--install", PACER_BINARY_DIR, "--prefix", prefix}, log,
                  milliseconds(120'000)))
      << ReadFileOrEmpty(log);
  for (const char* f : {"lib/cmake/pacer/pacerConfig.cmake", "lib/cmake/pacer/pacerConfigVersion.cmake",
                        "lib/cmake/pacer/pacerTargets.cmake", "include/worker_sdk/client.h",
                        "include/proto/pacer/sharding.pb.h", "bin/pacerd", "bin/pacerctl",
                        "bin/pacer-agent"}) {
    EXPECT_TRUE(std::filesystem::exists(prefix + "/" + f)) << f;
  }

  const std::string consumer = dir.Sub("consumer");
  std::vector<std::string> configure = {PACER_CMAKE_COMMAND, "-S", PACER_CONSUMER_SOURCE_DIR, "-B",
                                        consumer, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                                        "-DCMAKE_PREFIX_PATH=" + prefix};
  if (std::string(PACER_CCACHE).size()) {
    configure.push_back(std::string("-DCMAKE_CXX_COMPILER_LAUNCHER=") + PACER_CCACHE);
  }
  ASSERT_TRUE(RunToEnd(configure, log, milliseconds(120'000))) << ReadFileOrEmpty(log);
  ASSERT_TRUE(RunToEnd({PACER_CMAKE_COMMAND, "--build", consumer}, log, milliseconds(300'000)))
      << ReadFileOrEmpty(log);
  // The consumer found the installed package, not this build tree.
  EXPECT_NE(ReadFileOrEmpty(consumer + "/CMakeCache.txt").find("pacer_DIR:PATH=" + prefix),
            std::string::npos);

  const std::string port_file = dir.Sub("port.json");
  Subprocess pacerd = Subprocess::Start({prefix + "/bin/pacerd", "--data-dir", dir.Sub("data"),
                                         "--listen", "127.0.0.1:0", "--metrics-listen", "",
                                         "--port-file", port_file},
                                        {}, dir.Sub("pacerd.log"));
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(port_file) || !pacerd.running(); },
                      milliseconds(30'000)));
  std::smatch m;
  const std::string ports = ReadFileOrEmpty(port_file);
  ASSERT_TRUE(std::regex_search(ports, m, std::regex(R"("port":(\d+))"))) << ReadFileOrEmpty(dir.Sub("pacerd.log"));
  const std::string run_log = dir.Sub("consumer.log");
  EXPECT_TRUE(RunToEnd({consumer + "/pacer_consumer", "127.0.0.1:" + m[1].str(),
                   dir.Sub("data") + "/job.token", "100"},
                  run_log, milliseconds(60'000)))
      << ReadFileOrEmpty(run_log) << ReadFileOrEmpty(dir.Sub("pacerd.log"));
  EXPECT_NE(ReadFileOrEmpty(run_log).find("consumer ok: leased 100 records, dataset finished"),
            std::string::npos)
      << ReadFileOrEmpty(run_log);
  pacerd.Signal(SIGTERM);
  const int status = pacerd.Wait(milliseconds(30'000));
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << ReadFileOrEmpty(dir.Sub("pacerd.log"));
}

}  // namespace
}  // namespace pacer
