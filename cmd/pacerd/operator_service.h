// OperatorService: the read-only views pacerctl needs beyond the other services
// (proto/pacer/operator.proto): the agents and their workers, the policy in force field by
// field, and the job's timeline for `pacerctl report`.
//
// Sample() is pacerd's housekeeping step: once per closed monitor window it adds a timeline
// sample built from the monitor (speeds, classes), the sharding service (records done) and the
// reconciler (the plan in force), and records the monitor's new classification events as
// detections. Tests call the same Sample().
//
// Its calls need the job or admin token (pacerctl holds the admin token), not a credential: a
// worker has no use for the job's agents, policy or timeline.
//
// Owns the JobTimeline; the services it reads must outlive it. Thread-safe: handlers finish
// inline, Sample() runs on the housekeeping thread; no lock of its own is held while it calls
// the other services.
#pragma once

#include <functional>

#include <atomic>

#include "agent/agent_registry.h"
#include "cmd/pacerd/job_timeline.h"
#include "common/auth.h"
#include "common/clock.h"
#include "controller/reconciler.h"
#include "monitor/monitor_service.h"
#include "proto/pacer/operator.grpc.pb.h"
#include "sharding_service/sharding_service.h"

namespace pacer {

class OperatorService final : public Operator::CallbackService {
 public:
  OperatorService(AgentRegistry* agents, MonitorServiceImpl* monitor,
                  ShardingServiceImpl* sharding, Reconciler* reconciler,
                  const Authenticator* auth, const Clock* clock);

  grpc::ServerUnaryReactor* ListAgents(grpc::CallbackServerContext* ctx,
                                       const ListAgentsRequest* req,
                                       ListAgentsResponse* resp) override;
  grpc::ServerUnaryReactor* GetPolicy(grpc::CallbackServerContext* ctx,
                                      const GetPolicyRequest* req,
                                      GetPolicyResponse* resp) override;
  grpc::ServerUnaryReactor* GetTimeline(grpc::CallbackServerContext* ctx,
                                        const GetTimelineRequest* req,
                                        GetTimelineResponse* resp) override;
  grpc::ServerUnaryReactor* GetServer(grpc::CallbackServerContext* ctx, const GetServerRequest* req,
                                      GetServerResponse* resp) override;
  // What GetServer answers (pacerd sets it; unset: "rocksdb").
  void set_server_info(std::function<void(GetServerResponse*)> fn) { server_info_ = std::move(fn); }

  // The service layer behind the handlers (no auth).
  void Agents(ListAgentsResponse* resp) const;
  void Policy(GetPolicyResponse* resp) const;
  void Timeline(const GetTimelineRequest& req, GetTimelineResponse* resp) const;
  // Housekeeping: samples the window the monitor closed last, if not sampled yet.
  void Sample();

 private:
  AgentRegistry* agents_;
  MonitorServiceImpl* monitor_;
  ShardingServiceImpl* sharding_;
  Reconciler* reconciler_;
  const Authenticator* auth_;
  const Clock* clock_;
  std::function<void(GetServerResponse*)> server_info_;
  JobTimeline timeline_;
  std::atomic<int64_t> window_ms_{0};
  uint64_t last_event_seq_ = 0;  // the housekeeping thread only
  int64_t last_poll_ms_ = 0;      // the housekeeping thread only
};

}  // namespace pacer
