// pacerctl: the operator's command line for a running pacerd.
//
//   pacerctl [--addr HOST:PORT] [--token T | --token-file F | --data-dir D] [--json] COMMAND
//   COMMAND: status | datasets [delete|reset NAME] | workers | actions |
//            policy validate|apply FILE | checkpoint save|restore TAG | contention WORKER FACTOR|off
//
// Human tables by default, --json for machines. Exits 1 with the server's message on an RPC
// error, 2 on bad usage.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/auth.h"
#include "common/flags.h"
#include "controller/policy_loader.h"
#include "proto/pacer/agent.grpc.pb.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"

namespace po = boost::program_options;

namespace {

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

[[noreturn]] void Fail(const grpc::Status& s) {
  std::cerr << "pacerctl: " << s.error_message() << " (gRPC code " << s.error_code() << ")"
            << std::endl;
  std::exit(1);
}

std::string Source(const pacer::DatasetSpec& spec) {
  switch (spec.source_case()) {
    case pacer::DatasetSpec::kNumRecords: return "records";
    case pacer::DatasetSpec::kFiles: return std::to_string(spec.files().files_size()) + " files";
    case pacer::DatasetSpec::kStream:
      return "stream/" + std::to_string(spec.stream().partitions_size());
    default: return "?";
  }
}

void PrintDatasets(const pacer::ListDatasetsResponse& r) {
  std::cout << std::left << std::setw(20) << "DATASET" << std::setw(12) << "SOURCE"
            << std::setw(14) << "RECORDS/EPOCH" << std::setw(8) << "EPOCH" << std::setw(10)
            << "DONE%" << std::setw(8) << "LEASES" << std::setw(10) << "REQUEUES"
            << std::setw(12) << "QUARANTINED" << "STATE\n";
  for (const auto& d : r.datasets()) {
    std::ostringstream pct;
    if (d.finished()) {
      pct << "100.0";
    } else if (d.records_per_epoch() > 0) {
      pct << std::fixed << std::setprecision(1)
          << 100.0 * d.records_done_current_epoch() / d.records_per_epoch();
    } else {
      pct << "-";
    }
    std::string epoch = std::to_string(d.finished() ? d.completed_epochs() : d.current_epoch());
    if (d.spec().num_epochs() > 0) epoch += "/" + std::to_string(d.spec().num_epochs());
    std::string state = d.failed() ? "FAILED: " + d.failure() : d.finished() ? "finished" : "active";
    if (!d.failed() && d.records_quarantined() > 0) {
      // on_poison: continue — the data ends (or will end) with records never trained on.
      state += " (hole: " + std::to_string(d.records_quarantined()) + " records quarantined)";
    }
    std::cout << std::left << std::setw(20) << d.spec().name() << std::setw(12)
              << Source(d.spec()) << std::setw(14) << d.records_per_epoch() << std::setw(8)
              << epoch << std::setw(10) << pct.str() << std::setw(8) << d.active_leases()
              << std::setw(10) << d.requeues_total() << std::setw(12) << d.records_quarantined()
              << state << "\n";
  }
}

std::string ClassName(const pacer::Classification& c) {
  std::string out;
  switch (c.worker_class()) {
    case pacer::WORKER_CLASS_NORMAL: out = "normal"; break;
    case pacer::WORKER_CLASS_STRAGGLER: out = "STRAGGLER"; break;
    case pacer::WORKER_CLASS_LEADER: out = "leader"; break;
    default: return "unknown";
  }
  if (c.persistence() == pacer::PERSISTENCE_PERSISTENT) out += " persistent";
  if (c.persistence() == pacer::PERSISTENCE_TRANSIENT) out += " transient";
  if (c.cause() == pacer::CAUSE_CONTENTION) out += " contention";
  if (c.cause() == pacer::CAUSE_DETERMINISTIC) out += " hardware";
  if (c.scope() == pacer::SCOPE_NODE) out += " node-level";
  if (c.scope() == pacer::SCOPE_SERVER) out += " server-level";
  return out;
}

void PrintWorkers(const pacer::ListWorkersResponse& r) {
  std::cout << std::left << std::setw(16) << "WORKER" << std::setw(12) << "NODE" << std::setw(12)
            << "SPEED/S" << std::setw(10) << "RELATIVE" << std::setw(8) << "BATCH" << std::setw(11)
            << "COMPUTE_S" << std::setw(8) << "CONF" << "CLASS\n";
  std::cout << std::fixed;
  for (const auto& w : r.workers()) {
    std::cout << std::left << std::setw(16) << w.id() << std::setw(12) << w.node()
              << std::setw(12) << std::setprecision(1) << w.speed() << std::setw(10)
              << std::setprecision(2) << w.relative_speed() << std::setw(8) << w.local_batch()
              << std::setw(11) << std::setprecision(4) << w.compute_s() << std::setw(8)
              << std::setprecision(2) << w.classification().confidence()
              << ClassName(w.classification()) << "\n";
  }
  for (const auto& s : r.servers()) {
    std::cout << std::left << std::setw(16) << ("ps:" + s.id()) << std::setw(12) << s.node()
              << std::setw(12) << std::setprecision(1) << s.latency_ms() << std::setw(10)
              << std::setprecision(2) << s.relative_speed() << std::setw(8) << "-" << std::setw(11)
              << "-" << std::setw(8) << s.classification().confidence()
              << ClassName(s.classification()) << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr = "127.0.0.1:7070", token, token_file, data_dir = "pacer-data";
  bool json = false;
  po::options_description desc("Options");
  desc.add_options()
      ("addr", po::value(&addr)->default_value(addr), "pacerd address")
      ("token", po::value(&token), "admin token (or env PACER_ADMIN_TOKEN)")
      ("token-file", po::value(&token_file), "file holding the admin token")
      ("data-dir", po::value(&data_dir)->default_value(data_dir), "pacerd's data dir: its admin.token is used when no token is given")
      ("json", po::bool_switch(&json), "print JSON");
  auto flags = pacer::ParseFlagsOrExit(
      argc, argv,
      "Usage: pacerctl [options] COMMAND\n\nCommands:\n"
      "  status                    job summary\n"
      "  workers                   per-worker speed and straggler / leader classification\n"
      "  actions                   the controller's decisions: why, predicted and measured gain\n"
      "  policy validate FILE      check a policy file (no server needed)\n"
      "  policy apply FILE         hot-reload the running policy (audited)\n"
      "  datasets                  datasets, epochs, progress, quarantined ranges\n"
      "  datasets delete NAME      drop dataset NAME: its leases end, its progress and its\n"
      "                            position in every checkpoint go; the name can be registered\n"
      "                            again with any spec (admin token, audited)\n"
      "  datasets reset NAME       start NAME over at epoch 0 with the same spec: its leases end,\n"
      "                            its progress and checkpoint positions go (admin, audited)\n"
      "  checkpoint save TAG       pin the data position to model checkpoint TAG\n"
      "  checkpoint restore TAG    go back to the data position of TAG\n"
      "  contention WORKER FACTOR  slow WORKER down FACTOR times with real CPU contention (its\n"
      "                            agent's switch); 'off' clears it. Waits until the agent has\n"
      "                            applied it (exit 1 when refused or not applied in 15 s)",
      desc, /*allow_positional=*/true);
  const auto& args = flags.positional;
  if (args.empty()) pacer::ExitWithError("pacerctl", "missing command (see --help)");
  if (args[0] == "policy" && args.size() == 3 && args[1] == "validate") {
    auto policy = pacer::LoadPolicyFile(args[2]);
    if (!policy.ok()) {
      std::cerr << "pacerctl: " << policy.status().message() << std::endl;
      return 1;
    }
    std::cout << args[2] << ": ok (policy '" << policy->name << "', decision function "
              << policy->policy << (policy->dry_run ? ", dry-run" : "") << ")" << std::endl;
    return 0;
  }
  if (token.empty() && std::getenv("PACER_ADMIN_TOKEN")) token = std::getenv("PACER_ADMIN_TOKEN");
  if (token.empty()) {
    auto t = pacer::LoadToken(token_file.empty() ? data_dir + "/admin.token" : token_file, false);
    if (!t.ok()) {
      pacer::ExitWithError("pacerctl", std::string(t.status().message()) +
                                           "; give --token, --token-file or --data-dir");
    }
    token = *t;
  }
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = pacer::ShardingService::NewStub(channel);
  auto context = [&]() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    pacer::AttachToken(ctx.get(), token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  };

  const std::string& cmd = args[0];
  if (cmd == "datasets" && args.size() > 1) {
    if (args.size() != 3 || (args[1] != "delete" && args[1] != "reset")) {
      pacer::ExitWithError("pacerctl", "usage: datasets [delete|reset NAME]");
    }
    const std::string& name = args[2];
    auto ctx = context();
    std::string text;
    if (args[1] == "delete") {
      pacer::DeleteDatasetRequest req;
      req.set_dataset(name);
      pacer::DeleteDatasetResponse resp;
      grpc::Status s = stub->DeleteDataset(ctx.get(), req, &resp);
      if (!s.ok()) Fail(s);
      if (json) {
        text = ToJson(resp);
      } else {
        text = "dataset '" + name + "' deleted (" + std::to_string(resp.leases_ended()) +
               " active leases ended)";
      }
    } else {
      pacer::ResetDatasetRequest req;
      req.set_dataset(name);
      pacer::ResetDatasetResponse resp;
      grpc::Status s = stub->ResetDataset(ctx.get(), req, &resp);
      if (!s.ok()) Fail(s);
      if (json) {
        text = ToJson(resp);
      } else {
        text = "dataset '" + name + "' reset to epoch 0 (" + std::to_string(resp.leases_ended()) +
               " active leases ended, " + std::to_string(resp.records_done_dropped()) +
               " records done dropped)";
      }
    }
    std::cout << text << std::endl;
    return 0;
  }
  if (cmd == "datasets" || cmd == "status") {
    pacer::ListDatasetsResponse resp;
    auto ctx = context();
    grpc::Status s = stub->ListDatasets(ctx.get(), pacer::ListDatasetsRequest(), &resp);
    if (!s.ok()) Fail(s);
    if (json) {
      std::cout << ToJson(resp) << std::endl;
    } else if (cmd == "status") {
      uint64_t leases = 0;
      for (const auto& d : resp.datasets()) leases += d.active_leases();
      std::cout << "pacerd " << addr << ": " << resp.datasets_size() << " datasets, " << leases
                << " active leases, journal at update " << resp.journal_seq() << "\n";
    } else {
      PrintDatasets(resp);
    }
    return 0;
  }
  if (cmd == "workers") {
    auto monitor = pacer::Monitor::NewStub(channel);
    pacer::ListWorkersResponse resp;
    auto ctx = context();
    grpc::Status s = monitor->ListWorkers(ctx.get(), pacer::ListWorkersRequest(), &resp);
    if (!s.ok()) Fail(s);
    if (json) {
      std::cout << ToJson(resp) << std::endl;
    } else {
      PrintWorkers(resp);
    }
    return 0;
  }
  if (cmd == "actions") {
    auto ctl = pacer::ControllerService::NewStub(channel);
    pacer::ListActionsResponse resp;
    auto ctx = context();
    grpc::Status s = ctl->ListActions(ctx.get(), pacer::ListActionsRequest(), &resp);
    if (!s.ok()) Fail(s);
    if (json) {
      std::cout << ToJson(resp) << std::endl;
      return 0;
    }
    std::cout << "policy '" << resp.policy_name() << "' (" << resp.policy() << ")"
              << (resp.dry_run() ? " dry-run" : "") << ", batch plan version " << resp.plan_version()
              << "\n";
    std::cout << std::left << std::setw(6) << "ID" << std::setw(10) << "TIME" << std::setw(12)
              << "KIND" << std::setw(12) << "TARGET" << std::setw(10) << "OUTCOME" << std::setw(10)
              << "PREDICTED" << std::setw(10) << "MEASURED" << "REASON / DETAIL\n";
    for (const auto& a : resp.actions()) {
      std::time_t t = a.time_ms() / 1000;
      char when[16];
      std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&t));
      std::ostringstream pred, meas;
      pred << std::fixed << std::setprecision(1) << 100 * a.predicted_gain() << "%";
      if (a.measured()) meas << std::fixed << std::setprecision(1) << 100 * a.measured_gain() << "%";
      else meas << "-";
      std::string outcome = a.outcome() + (a.rolled_back() ? "*" : "");
      std::cout << std::left << std::setw(6) << a.id() << std::setw(10) << when << std::setw(12)
                << a.kind() << std::setw(12) << (a.target().empty() ? "-" : a.target())
                << std::setw(10) << outcome << std::setw(10) << pred.str() << std::setw(10)
                << meas.str() << a.reason();
      if (!a.veto_reason().empty()) std::cout << " [vetoed: " << a.veto_reason() << "]";
      if (a.repeats() > 0) std::cout << " (x" << a.repeats() + 1 << ")";
      std::cout << "\n";
      if (!a.detail().empty()) std::cout << std::setw(6) << "" << "  " << a.detail() << "\n";
      if (!a.dispatch().empty()) std::cout << std::setw(6) << "" << "  -> " << a.dispatch() << "\n";
    }
    return 0;
  }
  if (cmd == "policy") {
    if (args.size() != 3 || args[1] != "apply") {
      pacer::ExitWithError("pacerctl", "usage: policy validate FILE | policy apply FILE");
    }
    std::ifstream in(args[2]);
    if (!in) pacer::ExitWithError("pacerctl", "cannot read '" + args[2] + "'", 1);
    std::stringstream text;
    text << in.rdbuf();
    auto ctl = pacer::ControllerService::NewStub(channel);
    pacer::ApplyPolicyRequest req;
    req.set_yaml(text.str());
    req.set_file_name(args[2]);
    pacer::ApplyPolicyResponse resp;
    auto ctx = context();
    grpc::Status s = ctl->ApplyPolicy(ctx.get(), req, &resp);
    if (!s.ok()) Fail(s);
    std::cout << "policy '" << resp.policy_name() << "' (" << resp.policy() << ") in force" << std::endl;
    return 0;
  }
  if (cmd == "checkpoint") {
    if (args.size() != 3 || (args[1] != "save" && args[1] != "restore")) {
      pacer::ExitWithError("pacerctl", "usage: checkpoint save|restore TAG");
    }
    pacer::CheckpointRequest req;
    req.set_tag(args[2]);
    pacer::CheckpointResponse resp;
    auto ctx = context();
    grpc::Status s = args[1] == "save" ? stub->SaveCheckpoint(ctx.get(), req, &resp)
                                       : stub->RestoreCheckpoint(ctx.get(), req, &resp);
    if (!s.ok()) Fail(s);
    std::cout << (json ? "{\"ok\": true}" : "ok") << std::endl;
    return 0;
  }
  if (cmd == "contention") {
    double factor = 0;
    if (args.size() != 3 || (args[2] != "off" && !(std::istringstream(args[2]) >> factor))) {
      pacer::ExitWithError("pacerctl", "usage: contention WORKER FACTOR|off");
    }
    auto sw = pacer::ContentionSwitch::NewStub(channel);
    pacer::ContentionRequest req;
    req.set_worker_id(args[1]);
    req.set_factor(args[2] == "off" ? 0 : factor);
    pacer::ContentionReply reply;
    {
      auto ctx = context();
      grpc::Status s = sw->SetContention(ctx.get(), req, &reply);
      if (!s.ok()) Fail(s);
    }
    // Wait (bounded) for the agent to execute it: the command rides the next agent heartbeat.
    pacer::GetCommandRequest get;
    get.set_command_id(reply.command_id());
    pacer::GetCommandReply state;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    for (;;) {
      auto ctx = context();
      grpc::Status s = sw->GetCommand(ctx.get(), get, &state);
      if (!s.ok()) Fail(s);
      if (state.state() != "pending" || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling period
    }
    if (json) {
      std::cout << ToJson(state) << std::endl;  // int64 fields print as strings
    } else {
      std::cout << "contention " << args[2] << " on " << args[1] << " (node " << reply.node()
                << "): " << state.state()
                << (state.reason().empty() ? "" : " (" + state.reason() + ")") << std::endl;
    }
    return state.state() == "done" ? 0 : 1;
  }
  pacer::ExitWithError("pacerctl", "unknown command '" + cmd + "' (see --help)");
}
