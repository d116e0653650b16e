// The C API (worker_sdk/c_api.h) from a C translation unit (c_api_scenario.c) against an
// in-process pacerd on loopback: bad input as codes + messages, exactly-once reading, and an
// unreachable pacerd reported within a short connect budget.
#include <gtest/gtest.h>

#include "cmd/pacerd/pacerd.h"
#include "tests/testing/test_util.h"
#include "worker_sdk/c_api.h"

extern "C" int pacer_c_api_scenario(const char* address, const char* token, char* log, size_t log_len);

namespace pacer {
namespace {

TEST(CApiTest, ScenarioFromC) {
  testing::TempDir dir;
  PacerdOptions o;
  o.data_dir = dir.Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.sharding.heartbeat_interval_ms = 100;
  auto d = Pacerd::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  char log[2048] = "";
  EXPECT_EQ(pacer_c_api_scenario((*d)->address().c_str(), (*d)->job_token().c_str(), log, sizeof log), 0) << log;
}

TEST(CApiTest, UnreachablePacerdIsUnavailable) {
  pacer_client_options o{};
  o.address = "127.0.0.1:1";
  o.token = "t";
  o.worker_id = "w";
  o.connect_budget_ms = 500;
  pacer_client* c = nullptr;
  pacer_error err;
  EXPECT_EQ(pacer_client_connect(&o, &c, &err), PACER_UNAVAILABLE) << err.message;
  EXPECT_EQ(err.code, PACER_UNAVAILABLE);
  EXPECT_NE(std::string(err.message).find("127.0.0.1:1"), std::string::npos) << err.message;
  EXPECT_EQ(c, nullptr);
  pacer_client_destroy(nullptr, 0);  // no-op
}

}  // namespace
}  // namespace pacer
