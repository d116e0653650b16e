#include "cmd/pacerd/operator_service.h"

#include <algorithm>
#include <sstream>

#include "common/grpc_unary.h"
#include "controller/policy_fields.h"

namespace pacer {
namespace {

std::string ClassName(WorkerClass c) {
  switch (c) {
    case WORKER_CLASS_NORMAL: return "normal";
    case WORKER_CLASS_STRAGGLER: return "straggler";
    case WORKER_CLASS_LEADER: return "leader";
    default: return "unknown";
  }
}

const char* TypeName(PolicyField::Type t) {
  switch (t) {
    case PolicyField::Type::kBool: return "bool";
    case PolicyField::Type::kInt: return "int";
    case PolicyField::Type::kDouble: return "double";
    case PolicyField::Type::kString: return "string";
    case PolicyField::Type::kEnum: return "enum";
  }
  return "string";
}

std::string FieldValue(const PolicyField& f, PolicyConfig& config) {
  std::ostringstream out;
  switch (f.type) {
    case PolicyField::Type::kBool: out << (*f.boolean(config) ? "true" : "false"); break;
    case PolicyField::Type::kInt: out << *f.integer(config); break;
    case PolicyField::Type::kDouble: out << *f.real(config); break;
    case PolicyField::Type::kString:
    case PolicyField::Type::kEnum: out << *f.str(config); break;
  }
  return out.str();
}

}  // namespace

OperatorService::OperatorService(AgentRegistry* agents, MonitorServiceImpl* monitor,
                                 ShardingServiceImpl* sharding, Reconciler* reconciler,
                                 const Authenticator* auth, const Clock* clock)
    : agents_(agents), monitor_(monitor), sharding_(sharding), reconciler_(reconciler),
      auth_(auth), clock_(clock), timeline_(clock->NowMs()) {}

void OperatorService::Agents(ListAgentsResponse* resp) const {
  for (const AgentView& a : agents_->Agents()) {
    AgentInfo* info = resp->add_agents();
    info->set_agent_id(a.agent_id);
    info->set_node(a.node);
    info->set_job(a.job);
    info->set_incarnation(a.incarnation);
    info->set_registered_ms(a.registered_ms);
    info->set_last_heartbeat_ms(a.last_heartbeat_ms);
    info->set_lost(a.lost);
    info->set_leaving(a.leaving);
    info->set_heartbeats(a.heartbeats);
    info->set_registrations(a.registrations);
    for (const auto& w : a.workers) *info->add_workers() = w;
    info->set_pending_commands(static_cast<uint32_t>(a.pending_commands));
  }
  resp->set_now_ms(clock_->NowMs());
}

void OperatorService::Policy(GetPolicyResponse* resp) const {
  PolicyConfig config = reconciler_->Policy();
  resp->set_name(config.name);
  resp->set_policy(config.policy);
  resp->set_dry_run(config.dry_run);
  for (const PolicyField& f : PolicyFields()) {
    PolicyFieldValue* v = resp->add_fields();
    v->set_path(std::string(f.path));
    v->set_type(TypeName(f.type));
    v->set_value(FieldValue(f, config));
  }
}

void OperatorService::Timeline(const GetTimelineRequest& req, GetTimelineResponse* resp) const {
  timeline_.Fill(req, resp);
  resp->set_window_ms(window_ms_.load());
  resp->set_now_ms(clock_->NowMs());
}

void OperatorService::Sample() {
  // Twice per monitor window is enough to see each window close; a listing costs O(workers).
  const int64_t now = clock_->NowMs();
  if (now - last_poll_ms_ < std::max<int64_t>(window_ms_.load() / 2, 100)) return;
  last_poll_ms_ = now;
  ListWorkersRequest wreq;
  wreq.set_events_after_seq(last_event_seq_);
  wreq.set_max_events(1024);
  ListWorkersResponse workers;
  if (!monitor_->ListWorkers(wreq, &workers).ok()) return;
  window_ms_ = workers.window_ms();
  for (const ClassificationEvent& e : workers.events()) {
    last_event_seq_ = std::max(last_event_seq_, e.seq());
    DetectionEvent d;
    d.set_time_ms(e.time_ms());
    d.set_id(e.id());
    d.set_previous(ClassName(e.previous().worker_class()));
    d.set_current(ClassName(e.current().worker_class()));
    d.set_persistent(e.current().persistence() == PERSISTENCE_PERSISTENT);
    d.set_relative_speed(e.relative_speed());
    d.set_evidence(e.current().evidence());
    timeline_.AddDetection(std::move(d));
  }
  if (workers.window() < 0 || workers.window() <= timeline_.last_window()) return;
  TimelineSample s;
  s.set_time_ms(clock_->NowMs());
  s.set_window(workers.window());
  double bound = 0;
  for (const WorkerStatus& w : workers.workers()) {
    TimelineWorker* t = s.add_workers();
    t->set_id(w.id());
    t->set_speed(w.speed());
    t->set_worker_class(ClassName(w.classification().worker_class()));
    t->set_persistent(w.classification().persistence() == PERSISTENCE_PERSISTENT);
    t->set_local_batch(w.local_batch());
    bound += w.speed();
  }
  s.set_bound(bound);
  ListDatasetsResponse datasets;
  sharding_->ListDatasets(ListDatasetsRequest(), &datasets, [](absl::Status) {});  // inline
  uint64_t done = 0;
  for (const DatasetInfo& d : datasets.datasets()) done += d.records_done_total();
  s.set_records_done(done);
  ListActionsRequest areq;
  areq.set_limit(1);
  ListActionsResponse actions;
  reconciler_->ListActions(areq, &actions);
  s.set_plan_version(actions.plan_version());
  timeline_.Add(std::move(s));
}

grpc::ServerUnaryReactor* OperatorService::ListAgents(grpc::CallbackServerContext* ctx,
                                                      const ListAgentsRequest*,
                                                      ListAgentsResponse* resp) {
  return AnswerNow(ctx, *resp, "ListAgents", auth_->RequireToken(ctx->client_metadata(), "list agents"),
                   [&] { Agents(resp); });
}

grpc::ServerUnaryReactor* OperatorService::GetPolicy(grpc::CallbackServerContext* ctx,
                                                     const GetPolicyRequest*,
                                                     GetPolicyResponse* resp) {
  return AnswerNow(ctx, *resp, "GetPolicy", auth_->RequireToken(ctx->client_metadata(), "get policy"),
                   [&] { Policy(resp); });
}

grpc::ServerUnaryReactor* OperatorService::GetServer(grpc::CallbackServerContext* ctx,
                                                     const GetServerRequest*, GetServerResponse* resp) {
  return AnswerNow(ctx, *resp, "GetServer", auth_->RequireToken(ctx->client_metadata(), "get server"), [&] {
    resp->set_journal("rocksdb");
    if (server_info_) server_info_(resp);
  });
}

grpc::ServerUnaryReactor* OperatorService::GetTimeline(grpc::CallbackServerContext* ctx,
                                                       const GetTimelineRequest* req,
                                                       GetTimelineResponse* resp) {
  return AnswerNow(ctx, *resp, "GetTimeline", auth_->RequireToken(ctx->client_metadata(), "get timeline"),
                   [&] { Timeline(*req, resp); });
}

}  // namespace pacer
