#include "cmd/pacerctl/commands.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>

#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/operator.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"

namespace pacer::ctl {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Source(const DatasetSpec& spec) {
  switch (spec.source_case()) {
    case DatasetSpec::kNumRecords: return "records";
    case DatasetSpec::kFiles: return "files";
    case DatasetSpec::kStream: return "stream/" + std::to_string(spec.stream().partitions_size());
    default: return "?";
  }
}

std::string Percent(const DatasetInfo& d) {
  if (d.finished()) return "100.0";
  if (d.records_per_epoch() == 0) return "-";
  return Fixed(100.0 * d.records_done_current_epoch() / d.records_per_epoch(), 1);
}

std::string Epoch(const DatasetInfo& d) {
  std::string epoch = std::to_string(d.finished() ? d.completed_epochs() : d.current_epoch());
  if (d.spec().num_epochs() > 0) epoch += "/" + std::to_string(d.spec().num_epochs());
  return epoch;
}

std::string State(const DatasetInfo& d) {
  std::string state = d.failed() ? "FAILED: " + d.failure() : d.finished() ? "finished" : "active";
  if (!d.failed() && d.records_quarantined() > 0) {
    // on_poison: continue — the data ends (or will end) with records never trained on.
    state += " (hole: " + std::to_string(d.records_quarantined()) + " records quarantined)";
  }
  return state;
}

std::string ClassOf(const Classification& c) {
  return ClassText(c.worker_class(), c.persistence(), c.cause(), c.scope());
}

std::string ProcessState(int s) {
  std::string name = WorkerProcessState_Name(static_cast<WorkerProcessState>(s));
  if (name.rfind("WORKER_STATE_", 0) == 0) name = name.substr(13);
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  return name;
}

}  // namespace

std::string ClassText(int worker_class, int persistence, int cause, int scope) {
  std::string out;
  switch (worker_class) {
    case WORKER_CLASS_NORMAL: out = "normal"; break;
    case WORKER_CLASS_STRAGGLER: out = "STRAGGLER"; break;
    case WORKER_CLASS_LEADER: out = "leader"; break;
    default: return "unknown";
  }
  if (persistence == PERSISTENCE_PERSISTENT) out += " persistent";
  if (persistence == PERSISTENCE_TRANSIENT) out += " transient";
  if (cause == CAUSE_CONTENTION) out += " contention";
  if (cause == CAUSE_DETERMINISTIC) out += " hardware";
  if (scope == SCOPE_NODE) out += " node-level";
  if (scope == SCOPE_SERVER) out += " server-level";
  return out;
}

grpc::Status DatasetsView(const Client& c, View* view, std::string* what) {
  *what = "datasets (ListDatasets)";
  ListDatasetsResponse r;
  auto ctx = NewContext(c.target);
  grpc::Status s = ShardingService::NewStub(c.channel)->ListDatasets(ctx.get(), {}, &r);
  if (!s.ok()) return s;
  view->doc = ProtoToJson(r);
  Table t({{"DATASET"}, {"SOURCE"}, {"RECORDS/EPOCH"}, {"EPOCH"}, {"DONE%"}, {"LEASES"},
           {"REQUEUES"}, {"QUARANTINED"}, {"RECORDS DONE", true}, {"PENDING", true},
           {"FILES", true}, {"TAIL BACKUP", true}, {"STATE"}});
  for (const auto& d : r.datasets()) {
    std::string source = Source(d.spec());
    if (d.spec().source_case() == DatasetSpec::kFiles) source = std::to_string(d.num_files()) + " files";
    t.Add({d.spec().name(), source, std::to_string(d.records_per_epoch()), Epoch(d), Percent(d),
           std::to_string(d.active_leases()), std::to_string(d.requeues_total()),
           std::to_string(d.records_quarantined()), std::to_string(d.records_done_total()),
           std::to_string(d.pending_ranges()), std::to_string(d.num_files()),
           d.tail_backup() ? "on" : "off", State(d)});
  }
  view->table = t.Render(false);
  view->wide = t.Render(true) + "journal at update " + std::to_string(r.journal_seq()) + "\n";
  return s;
}

grpc::Status WorkersView(const Client& c, View* view, std::string* what) {
  *what = "workers (ListWorkers)";
  ListWorkersResponse r;
  auto ctx = NewContext(c.target);
  grpc::Status s = Monitor::NewStub(c.channel)->ListWorkers(ctx.get(), {}, &r);
  if (!s.ok()) return s;
  view->doc = ProtoToJson(r);
  const int64_t now = NowMs();
  Table t({{"WORKER"}, {"NODE"}, {"SPEED/S"}, {"RELATIVE"}, {"BATCH"}, {"COMPUTE_S"},
           {"COMM_S", true}, {"DATA_WAIT_S", true}, {"WALL_S", true}, {"SMOOTHED", true},
           {"REPORTS", true}, {"LAST REPORT", true}, {"CONF"}, {"CLASS"}, {"EVIDENCE", true}});
  for (const auto& w : r.workers()) {
    t.Add({w.id(), w.node(), Fixed(w.speed(), 1), Fixed(w.relative_speed(), 2),
           std::to_string(w.local_batch()), Fixed(w.compute_s(), 4), Fixed(w.comm_s(), 4),
           Fixed(w.data_wait_s(), 4), Fixed(w.wall_s(), 4), Fixed(w.smoothed_speed(), 1),
           std::to_string(w.reports()), Ago(w.last_report_ms(), now),
           Fixed(w.classification().confidence(), 2), ClassOf(w.classification()),
           w.classification().evidence()});
  }
  for (const auto& sv : r.servers()) {
    t.Add({"ps:" + sv.id(), sv.node(), Fixed(sv.latency_ms(), 1) + " ms",
           Fixed(sv.relative_speed(), 2), "-", "-", "-", "-", "-", "-",
           std::to_string(sv.reports()), Ago(sv.last_report_ms(), now),
           Fixed(sv.classification().confidence(), 2), ClassOf(sv.classification()),
           sv.classification().evidence()});
  }
  view->table = t.Render(false);
  view->wide = t.Render(true);
  return s;
}

grpc::Status AgentsView(const Client& c, View* view, std::string* what) {
  *what = "agents (Operator.ListAgents)";
  ListAgentsResponse r;
  auto ctx = NewContext(c.target);
  grpc::Status s = Operator::NewStub(c.channel)->ListAgents(ctx.get(), {}, &r);
  if (!s.ok()) return s;
  view->doc = ProtoToJson(r);
  Table t({{"AGENT"}, {"NODE"}, {"STATE"}, {"WORKERS"}, {"LAST HEARTBEAT"}, {"RESTARTS"},
           {"INCARNATION", true}, {"HEARTBEATS", true}, {"PENDING CMDS", true}});
  Table workers({{"WORKER"}, {"AGENT"}, {"PID"}, {"STATE"}, {"RANK"}, {"RESTARTS"},
                 {"CPU CORES"}, {"CONTENTION"}, {"LAST EXIT", true}});
  for (const auto& a : r.agents()) {
    uint32_t restarts = 0;
    for (const auto& w : a.workers()) {
      restarts += w.restarts();
      std::string exit = w.last_signal() ? "signal " + std::to_string(w.last_signal())
                                         : std::to_string(w.last_exit_code());
      workers.Add({w.worker_id(), a.agent_id(), std::to_string(w.pid()), ProcessState(w.state()),
                   std::to_string(w.rank()), std::to_string(w.restarts()),
                   Fixed(w.cpu_cores(), 2),
                   w.contention_factor() > 0 ? "x" + Fixed(w.contention_factor(), 1) : "-", exit});
    }
    t.Add({a.agent_id(), a.node(), a.lost() ? "LOST" : a.leaving() ? "leaving" : "live",
           std::to_string(a.workers_size()), Ago(a.last_heartbeat_ms(), r.now_ms()),
           std::to_string(restarts), std::to_string(a.incarnation()),
           std::to_string(a.heartbeats()), std::to_string(a.pending_commands())});
  }
  view->table = t.Render(false) + (workers.size() ? "\n" + workers.Render(false) : "");
  view->wide = t.Render(true) + (workers.size() ? "\n" + workers.Render(true) : "");
  return s;
}

grpc::Status ActionsView(const Client& c, View* view, std::string* what) {
  *what = "actions (ListActions)";
  ListActionsResponse r;
  auto ctx = NewContext(c.target);
  grpc::Status s = ControllerService::NewStub(c.channel)->ListActions(ctx.get(), {}, &r);
  if (!s.ok()) return s;
  view->doc = ProtoToJson(r);
  std::ostringstream head;
  head << "policy '" << r.policy_name() << "' (" << r.policy() << ")"
       << (r.dry_run() ? " dry-run" : "") << ", batch plan version " << r.plan_version() << "\n";
  Table t({{"ID"}, {"TIME"}, {"KIND"}, {"TARGET"}, {"OUTCOME"}, {"PREDICTED"}, {"MEASURED"},
           {"REASON"}, {"DETAIL", true}, {"DISPATCH", true}});
  for (const auto& a : r.actions()) {
    std::string reason = a.reason();
    if (!a.veto_reason().empty()) reason += " [vetoed: " + a.veto_reason() + "]";
    if (a.repeats() > 0) reason += " (x" + std::to_string(a.repeats() + 1) + ")";
    t.Add({std::to_string(a.id()), ClockTime(a.time_ms()), a.kind(),
           a.target().empty() ? "-" : a.target(), a.outcome() + (a.rolled_back() ? "*" : ""),
           Fixed(100 * a.predicted_gain(), 1) + "%",
           a.measured() ? Fixed(100 * a.measured_gain(), 1) + "%" : "-", reason,
           a.detail().empty() ? "-" : a.detail(), a.dispatch().empty() ? "-" : a.dispatch()});
  }
  view->table = head.str() + t.Render(false);
  view->wide = head.str() + t.Render(true);
  return s;
}

grpc::Status PolicyView(const Client& c, View* view, std::string* what) {
  *what = "policy show (Operator.GetPolicy)";
  GetPolicyResponse r;
  auto ctx = NewContext(c.target);
  grpc::Status s = Operator::NewStub(c.channel)->GetPolicy(ctx.get(), {}, &r);
  if (!s.ok()) return s;
  // The document has the shape of a policy file: `pacerctl policy show -o yaml > p.yaml` can
  // be edited and applied again.
  Json doc = Json::object();
  Table t({{"FIELD"}, {"VALUE"}, {"TYPE", true}});
  for (const auto& f : r.fields()) {
    Json value = f.value();
    if (f.type() == "bool") value = f.value() == "true";
    else if (f.type() == "int") value = Json::parse(f.value(), nullptr, false);
    else if (f.type() == "double") value = Json::parse(f.value(), nullptr, false);
    if (value.is_discarded()) value = f.value();
    Json* node = &doc;
    std::string path = f.path();
    for (size_t dot; (dot = path.find('.')) != std::string::npos; path = path.substr(dot + 1)) {
      node = &(*node)[path.substr(0, dot)];
    }
    (*node)[path] = value;
    t.Add({f.path(), f.value().empty() ? "\"\"" : f.value(), f.type()});
  }
  view->doc = doc;
  std::string head = "policy '" + r.name() + "' (" + r.policy() + ")" +
                     (r.dry_run() ? " dry-run" : "") + " in force\n";
  view->table = head + t.Render(false);
  view->wide = head + t.Render(true);
  return s;
}

grpc::Status StatusView(const Client& c, View* view, std::string* what) {
  View datasets, workers, actions, agents;
  grpc::Status s = DatasetsView(c, &datasets, what);
  if (s.ok()) s = WorkersView(c, &workers, what);
  if (s.ok()) s = ActionsView(c, &actions, what);
  if (!s.ok()) return s;
  std::string agents_what;
  const bool have_agents = AgentsView(c, &agents, &agents_what).ok();  // older pacerd: none
  GetServerResponse server;
  bool have_server = false;  // older pacerd: no GetServer
  {
    auto ctx = NewContext(c.target);
    have_server = Operator::NewStub(c.channel)->GetServer(ctx.get(), {}, &server).ok();
  }

  Json doc;
  doc["addr"] = c.target.addr;
  // Data.
  const auto& ds = datasets.doc["datasets"];
  uint64_t done = 0, leases = 0, total = 0;
  bool all_finished = !ds.empty();
  Json dlist = Json::array();
  for (const auto& d : ds) {
    done += d["records_done_total"].get<uint64_t>();
    leases += d["active_leases"].get<uint64_t>();
    const uint64_t epochs = d["spec"].value("num_epochs", 0u);
    total += d["records_per_epoch"].get<uint64_t>() * std::max<uint64_t>(epochs, 1);
    all_finished = all_finished && d["finished"].get<bool>();
    dlist.push_back({{"name", d["spec"].value("name", "")},
                     {"records_done_total", d["records_done_total"]},
                     {"current_epoch", d["current_epoch"]},
                     {"finished", d["finished"]},
                     {"failed", d["failed"]}});
  }
  doc["data"] = {{"datasets", dlist}, {"records_done", done}, {"records_total", total},
                 {"active_leases", leases}, {"finished", all_finished},
                 {"journal_seq", datasets.doc["journal_seq"]}};
  // Workers and stragglers.
  double bound = 0;
  Json stragglers = Json::array(), leaders = Json::array();
  int64_t classified = 0;
  for (const auto& w : workers.doc["workers"]) {
    bound += w["speed"].get<double>();
    const auto& cl = w["classification"];
    const std::string cls = cl.value("worker_class", "");
    if (cls != "WORKER_CLASS_UNKNOWN") ++classified;
    Json e = {{"id", w["id"]}, {"node", w["node"]},
                        {"relative_speed", w["relative_speed"]},
                        {"persistent", cl.value("persistence", "") == "PERSISTENCE_PERSISTENT"},
                        {"cause", cl.value("cause", "")}, {"since_ms", w["class_since_ms"]}};
    if (cls == "WORKER_CLASS_STRAGGLER") stragglers.push_back(e);
    if (cls == "WORKER_CLASS_LEADER") leaders.push_back(e);
  }
  doc["workers"] = {{"count", workers.doc["workers"].size()},
                    {"servers", workers.doc["servers"].size()},
                    {"classified", classified},
                    {"median_speed", workers.doc["median_speed"]},
                    {"bound", bound},
                    {"stragglers", stragglers},
                    {"leaders", leaders}};
  // Policy, plan, actions.
  const auto& acts = actions.doc["actions"];
  int64_t executed = 0, vetoed = 0;
  Json last_plan, last_action;
  for (const auto& a : acts) {  // newest first
    const std::string outcome = a["outcome"].get<std::string>();
    if (outcome == "executed") ++executed;
    if (outcome == "vetoed") ++vetoed;
    if (outcome == "policy") continue;
    if (last_action.is_null()) last_action = a;
    if (last_plan.is_null() && a["kind"] == "ADJUST_BS" && outcome == "executed") last_plan = a;
  }
  doc["policy"] = {{"name", actions.doc["policy_name"]}, {"policy", actions.doc["policy"]},
                   {"dry_run", actions.doc["dry_run"]}};
  doc["plan"] = {{"version", actions.doc["plan_version"]}};
  if (!last_plan.is_null()) {
    doc["plan"]["time_ms"] = last_plan["time_ms"];
    doc["plan"]["detail"] = last_plan["detail"];
    doc["plan"]["predicted_gain"] = last_plan["predicted_gain"];
  }
  doc["actions"] = {{"executed", executed}, {"vetoed", vetoed}, {"kept", acts.size()}};
  if (!last_action.is_null()) doc["actions"]["last"] = last_action;
  if (have_agents) {
    int64_t lost = 0;
    for (const auto& a : agents.doc["agents"]) lost += a["lost"].get<bool>() ? 1 : 0;
    doc["agents"] = {{"count", agents.doc["agents"].size()}, {"lost", lost}};
  }
  if (have_server) doc["server"] = ProtoToJson(server);
  view->doc = doc;

  std::ostringstream out;
  out << "pacerd       " << c.target.addr << ", journal at update " << doc["data"]["journal_seq"]
      << "\n";
  if (have_server && server.journal() == "etcd") {
    out << "leader       " << server.leader() << " (journal in etcd under " << server.etcd_prefix()
        << ", fencing revision " << server.fencing_revision() << ", lease "
        << Fixed(static_cast<double>(server.lease_remaining_ms()) / 1000.0, 1) << " s); standbys: ";
    if (server.standbys().empty()) out << "none";
    for (int i = 0; i < server.standbys_size(); ++i) {
      const ServerStandby& sb = server.standbys(i);
      out << (i ? ", " : "") << sb.address();
      if (sb.hot()) out << " (hot, " << sb.behind() << " updates behind)";
    }
    out << "\n";
  }
  out << "data         " << ds.size() << " dataset" << (ds.size() == 1 ? "" : "s") << ", " << done;
  if (total > 0) out << " of " << total;
  out << " records done, " << leases << " active leases"
      << (all_finished ? " — finished" : "") << "\n";
  for (const auto& d : ds) {
    out << "             " << d["spec"].value("name", "") << ": epoch "
        << d["current_epoch"].get<uint64_t>() << ", "
        << (d["failed"].get<bool>() ? "FAILED" : d["finished"].get<bool>() ? "finished" : "active")
        << "\n";
  }
  out << "workers      " << workers.doc["workers"].size() << " reporting";
  if (!workers.doc["servers"].empty()) out << ", " << workers.doc["servers"].size() << " PS servers";
  out << ", median " << Fixed(workers.doc["median_speed"].get<double>(), 1)
      << " samples/s, bound Σv " << Fixed(bound, 1) << " samples/s\n";
  out << "stragglers   ";
  if (stragglers.empty()) out << "none";
  for (size_t i = 0; i < stragglers.size(); ++i) {
    const auto& e = stragglers[i];
    out << (i ? ", " : "") << e["id"].get<std::string>() << " ("
        << Fixed(e["relative_speed"].get<double>(), 2) << "x"
        << (e["persistent"].get<bool>() ? ", persistent" : ", transient")
        << (e["cause"] == "CAUSE_CONTENTION" ? ", contention"
            : e["cause"] == "CAUSE_DETERMINISTIC" ? ", hardware" : "")
        << ")";
  }
  out << "\n";
  out << "policy       '" << actions.doc["policy_name"].get<std::string>() << "' ("
      << actions.doc["policy"].get<std::string>() << ")"
      << (actions.doc["dry_run"].get<bool>() ? ", dry-run" : "") << "\n";
  out << "plan         ";
  if (last_plan.is_null()) {
    out << "none";
  } else {
    out << "version " << actions.doc["plan_version"] << " since "
        << ClockTime(last_plan["time_ms"].get<int64_t>()) << ": "
        << last_plan["detail"].get<std::string>();
  }
  out << "\n";
  out << "actions      " << executed << " executed, " << vetoed << " vetoed";
  if (!last_action.is_null()) {
    out << "; last " << last_action["kind"].get<std::string>() << " "
        << last_action["outcome"].get<std::string>() << " at "
        << ClockTime(last_action["time_ms"].get<int64_t>()) << ": "
        << last_action["reason"].get<std::string>();
  }
  out << "\n";
  if (have_agents) {
    out << "agents       " << doc["agents"]["count"] << " (" << doc["agents"]["lost"] << " lost)\n";
  }
  view->table = out.str();
  view->wide = "";
  return grpc::Status::OK;
}

}  // namespace pacer::ctl
