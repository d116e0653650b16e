// AgentServer: pacerd's agent side (an AgentRegistry behind GrpcAgentService) on a loopback port,
// for the multi-process tests of pacer-agent. Header-only; one per test, used from the test's
// thread (the registry itself is thread-safe).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "agent/agent_registry.h"
#include "agent/grpc_agent_service.h"
#include "common/auth.h"
#include "common/clock.h"
#include "tests/testing/test_util.h"

namespace pacer::testing {

inline constexpr char kToken[] = "job-token-for-tests";

// An AgentService on loopback. `port` 0 lets the OS choose; a later server may take the same
// port again (pacerd restarting).
class AgentServer {
 public:
  explicit AgentServer(int port = 0) : auth_(kToken, "admin-token") {
    AgentRegistryOptions o;
    o.heartbeat_interval_ms = 200;
    o.agent_timeout_ms = 3000;
    registry_ = std::make_unique<AgentRegistry>(o, RealClock::Get());
    service_ = std::make_unique<GrpcAgentService>(registry_.get(), &auth_);
    // The old port may still be held for a moment after a restart: retry with a deadline.
    WaitFor([&] {
      grpc::ServerBuilder b;
      b.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(), &port_);
      b.RegisterService(service_.get());
      server_ = b.BuildAndStart();
      return server_ && port_ != 0;
    }, std::chrono::seconds(10), std::chrono::milliseconds(100));
  }
  ~AgentServer() { Stop(); }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
  }
  int port() const { return port_; }
  AgentRegistry& registry() { return *registry_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  Authenticator auth_;
  std::unique_ptr<AgentRegistry> registry_;
  std::unique_ptr<GrpcAgentService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace pacer::testing
