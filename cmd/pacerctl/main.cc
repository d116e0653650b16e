// pacerctl: the operator's command line for a running pacerd (kubectl / etcdctl conventions).
//
//   pacerctl [--addr HOST:PORT] [-o table|wide|json|yaml] [--watch] COMMAND ...
//
// The address comes from --addr, else $PACER_ADDR, else 127.0.0.1:7070. The admin token from
// --token-file, $PACER_TOKEN_FILE, $PACER_ADMIN_TOKEN, --token (visible in `ps`: avoid), else
// the admin.token of pacerd's data dir (--data-dir, $PACER_DATA_DIR, default pacer-data).
// Exit codes: see dial.h and --help.
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "cmd/pacerctl/commands.h"
#include "cmd/pacerctl/dial.h"
#include "cmd/pacerctl/output.h"
#include "cmd/pacerctl/report.h"
#include "common/auth.h"
#include "common/flags.h"
#include "controller/policy_loader.h"
#include "proto/pacer/agent.grpc.pb.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"

namespace po = boost::program_options;
using namespace pacer::ctl;

namespace {

constexpr char kUsage[] =
    "Usage: pacerctl [options] COMMAND\n\n"
    "Commands (every one takes -o table|wide|json|yaml; the read ones also --watch):\n"
    "  status                    summary: data, workers, stragglers, policy, plan, actions, agents\n"
    "  workers                   per-worker speed and straggler / leader classification\n"
    "  agents                    node agents and the worker processes they supervise\n"
    "  actions                   the controller's decisions: why, predicted and measured gain\n"
    "  datasets                  datasets, epochs, progress, quarantined ranges\n"
    "  datasets delete NAME      drop dataset NAME: its leases end, its progress and its\n"
    "                            position in every checkpoint go; the name can be registered\n"
    "                            again with any spec (admin token, audited)\n"
    "  datasets reset NAME       start NAME over at epoch 0 with the same spec: its leases end,\n"
    "                            its progress and checkpoint positions go (admin, audited)\n"
    "  policy show               the policy in force, every field (-o yaml: a policy file)\n"
    "  policy validate FILE      check a policy file (no server needed)\n"
    "  policy apply FILE         hot-reload the running policy (audited)\n"
    "  checkpoint save TAG       pin the data position to model checkpoint TAG\n"
    "  checkpoint restore TAG    go back to the data position of TAG\n"
    "  contention WORKER FACTOR  slow WORKER down FACTOR times with real CPU contention (its\n"
    "                            agent's switch); 'off' clears it. Waits until the agent has\n"
    "                            applied it (exit 1 when refused or not applied in 15 s)\n"
    "  report --out DIR          write DIR/report.html (per-worker speed, throughput vs the\n"
    "                            balanced bound, detections, actions) and DIR/report.json from\n"
    "                            pacerd's own history, for a running or finished job\n\n"
    "Environment: PACER_ADDR (--addr), PACER_TOKEN_FILE (--token-file), PACER_ADMIN_TOKEN (the\n"
    "token itself), PACER_DATA_DIR (--data-dir).\n"
    "Exit codes: 0 ok; 1 pacerd refused or could not do it; 2 bad usage; 3 cannot reach pacerd;\n"
    "4 token refused or missing; 5 pacerd too old for the command.";

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

[[noreturn]] void Usage(const std::string& message) {
  pacer::ExitWithError("pacerctl", message + " (see --help)", kExitUsage);
}

// Runs a read command once, or every `interval_s` until SIGINT / SIGTERM with --watch.
int RunRead(const Client& c, const ReadCommand& cmd, Format format, bool watch, double interval_s) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const bool tty = isatty(STDOUT_FILENO);
  for (bool first = true; !g_stop; first = false) {
    View view;
    std::string what;
    grpc::Status s = cmd(c, &view, &what);
    if (!s.ok()) {
      if (!watch) Fail(s, c.target, what);
      // While watching, an unreachable pacerd (a restart) is shown and the watch goes on.
      std::cerr << "pacerctl: " << Explain(s, c.target, what) << std::endl;
      if (ExitCodeFor(s) != kExitUnreachable) return ExitCodeFor(s);
    } else if (watch && (format == Format::kTable || format == Format::kWide)) {
      if (tty) std::cout << "\033[H\033[2J";  // clear the screen, like watch(1)
      else if (!first) std::cout << "\n";
      std::cout << "Every " << interval_s << " s, " << ClockTime(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::system_clock::now().time_since_epoch()).count())
                << "   (Ctrl-C to stop)\n\n"
                << Render(view, format);
    } else if (watch) {
      // A stream of documents: JSON lines, or YAML documents separated by ---.
      std::cout << (format == Format::kYaml ? "---\n" : "") << Render(view, format, /*compact=*/true);
    } else {
      std::cout << Render(view, format);
    }
    std::cout.flush();
    if (!watch) return kExitOk;
    // The watch period: a timer, woken early by a signal.
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000));
    while (!g_stop && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return kExitOk;
}

void PrintDone(Format format, const Json& doc, const std::string& text) {
  View v{doc, text + "\n", ""};
  std::cout << Render(v, format) << std::flush;
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr, token, token_file, data_dir, output = "table", out_dir;
  bool json = false, watch = false;
  double interval_s = 2, timeout_s = 10;
  po::options_description desc("Options");
  desc.add_options()
      ("addr", po::value(&addr), "pacerd HOST:PORT (default $PACER_ADDR, else 127.0.0.1:7070)")
      ("output,o", po::value(&output)->default_value(output), "output format: table, wide (more columns), json or yaml")
      ("json", po::bool_switch(&json), "the same as -o json (kept for scripts)")
      ("watch,w", po::bool_switch(&watch), "repeat a read command every --interval seconds until Ctrl-C")
      ("interval", po::value(&interval_s)->default_value(interval_s), "--watch period in seconds (0.2 to 3600)")
      ("timeout", po::value(&timeout_s)->default_value(timeout_s), "deadline of one call to pacerd in seconds (0.1 to 600)")
      ("token-file", po::value(&token_file), "file holding the admin token (default $PACER_TOKEN_FILE)")
      ("token", po::value(&token), "the admin token itself; visible in `ps`: prefer --token-file or $PACER_ADMIN_TOKEN")
      ("data-dir", po::value(&data_dir), "pacerd's data dir: its admin.token is used when no token is given (default $PACER_DATA_DIR, else pacer-data)")
      ("out", po::value(&out_dir), "report: the folder to write report.html and report.json to");
  pacer::TlsClientOptions tls;
  pacer::AddTlsClientFlags(desc, &tls);  // --tls-ca/--tls-cert/--tls-key/--tls-server-name/--allow-insecure
  auto flags = pacer::ParseFlagsOrExit(argc, argv, kUsage, desc, /*allow_positional=*/true);
  const auto& args = flags.positional;
  if (json) output = "json";
  std::optional<Format> format = ParseFormat(output);
  if (!format) Usage("-o must be table, wide, json or yaml, not '" + output + "'");
  if (!(interval_s >= 0.2 && interval_s <= 3600)) Usage("--interval must be in [0.2, 3600] seconds");
  if (!(timeout_s >= 0.1 && timeout_s <= 600)) Usage("--timeout must be in [0.1, 600] seconds");
  if (args.empty()) Usage("missing command");
  const std::string& cmd = args[0];
  auto need_args = [&](size_t n, const std::string& usage) {
    if (args.size() != n) Usage("usage: pacerctl " + usage);
  };

  ReadCommand read;
  if (cmd == "status") { need_args(1, "status"); read = StatusView; }
  else if (cmd == "workers") { need_args(1, "workers"); read = WorkersView; }
  else if (cmd == "agents") { need_args(1, "agents"); read = AgentsView; }
  else if (cmd == "actions") { need_args(1, "actions"); read = ActionsView; }
  else if (cmd == "datasets" && args.size() == 1) { read = DatasetsView; }
  else if (cmd == "policy" && args.size() == 2 && args[1] == "show") { read = PolicyView; }
  else if (cmd != "datasets" && cmd != "policy" && cmd != "checkpoint" && cmd != "contention" &&
           cmd != "report") {
    Usage("unknown command '" + cmd + "'");
  }
  if (watch && !read) Usage("--watch repeats a read command (status, workers, agents, actions, datasets, policy show), not '" + cmd + "'");

  if (cmd == "policy" && args.size() >= 2 && args[1] == "validate") {
    need_args(3, "policy validate FILE");
    auto policy = pacer::LoadPolicyFile(args[2]);
    if (!policy.ok()) {
      std::cerr << "pacerctl: " << policy.status().message() << std::endl;
      return kExitFailed;
    }
    PrintDone(*format, {{"file", args[2]}, {"ok", true}, {"name", policy->name},
                        {"policy", policy->policy}, {"dry_run", policy->dry_run}},
              args[2] + ": ok (policy '" + policy->name + "', decision function " +
                  policy->policy + (policy->dry_run ? ", dry-run" : "") + ")");
    return kExitOk;
  }

  Client c;
  c.target.addr = !addr.empty() ? addr : !Env("PACER_ADDR").empty() ? Env("PACER_ADDR") : "127.0.0.1:7070";
  c.target.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  if (token_file.empty()) token_file = Env("PACER_TOKEN_FILE");
  if (token.empty() && token_file.empty()) token = Env("PACER_ADMIN_TOKEN");
  if (token.empty()) {
    if (data_dir.empty()) data_dir = !Env("PACER_DATA_DIR").empty() ? Env("PACER_DATA_DIR") : "pacer-data";
    const std::string file = token_file.empty() ? data_dir + "/admin.token" : token_file;
    auto t = pacer::LoadToken(file, false);
    if (!t.ok()) {
      pacer::ExitWithError("pacerctl", std::string(t.status().message()) +
                                           "; give the admin token with --token-file, "
                                           "PACER_TOKEN_FILE, PACER_ADMIN_TOKEN or --data-dir",
                           kExitUnauthorized);
    }
    token = *t;
  }
  c.target.token = token;
  tls.FillFromEnvironment();
  c.target.tls = tls;
  c.channel = Dial(c.target);

  if (read) return RunRead(c, read, *format, watch, interval_s);

  if (cmd == "report") {
    need_args(1, "report --out DIR");
    if (out_dir.empty()) Usage("report needs --out DIR");
    return WriteReport(c, out_dir, *format);
  }
  if (cmd == "datasets") {
    if (args.size() != 3 || (args[1] != "delete" && args[1] != "reset")) {
      Usage("usage: pacerctl datasets [delete|reset NAME]");
    }
    const std::string& name = args[2];
    auto stub = pacer::ShardingService::NewStub(c.channel);
    auto ctx = NewContext(c.target);
    if (args[1] == "delete") {
      pacer::DeleteDatasetRequest req;
      req.set_dataset(name);
      pacer::DeleteDatasetResponse resp;
      grpc::Status s = stub->DeleteDataset(ctx.get(), req, &resp);
      if (!s.ok()) Fail(s, c.target, "datasets delete " + name);
      PrintDone(*format, ProtoToJson(resp),
                "dataset '" + name + "' deleted (" + std::to_string(resp.leases_ended()) +
                    " active leases ended, " + std::to_string(resp.records_done_dropped()) +
                    " records done dropped)");
    } else {
      pacer::ResetDatasetRequest req;
      req.set_dataset(name);
      pacer::ResetDatasetResponse resp;
      grpc::Status s = stub->ResetDataset(ctx.get(), req, &resp);
      if (!s.ok()) Fail(s, c.target, "datasets reset " + name);
      PrintDone(*format, ProtoToJson(resp),
                "dataset '" + name + "' reset to epoch 0 (" + std::to_string(resp.leases_ended()) +
                    " active leases ended, " + std::to_string(resp.records_done_dropped()) +
                    " records done dropped)");
    }
    return kExitOk;
  }
  if (cmd == "policy") {
    if (args.size() != 3 || args[1] != "apply") {
      Usage("usage: pacerctl policy show | policy validate FILE | policy apply FILE");
    }
    std::ifstream in(args[2]);
    if (!in) pacer::ExitWithError("pacerctl", "cannot read '" + args[2] + "'", kExitFailed);
    std::stringstream text;
    text << in.rdbuf();
    pacer::ApplyPolicyRequest req;
    req.set_yaml(text.str());
    req.set_file_name(args[2]);
    pacer::ApplyPolicyResponse resp;
    auto ctx = NewContext(c.target);
    grpc::Status s = pacer::ControllerService::NewStub(c.channel)->ApplyPolicy(ctx.get(), req, &resp);
    if (!s.ok()) Fail(s, c.target, "policy apply " + args[2]);
    PrintDone(*format, ProtoToJson(resp),
              "policy '" + resp.policy_name() + "' (" + resp.policy() + ") in force");
    return kExitOk;
  }
  if (cmd == "checkpoint") {
    if (args.size() != 3 || (args[1] != "save" && args[1] != "restore")) {
      Usage("usage: pacerctl checkpoint save|restore TAG");
    }
    pacer::CheckpointRequest req;
    req.set_tag(args[2]);
    pacer::CheckpointResponse resp;
    auto stub = pacer::ShardingService::NewStub(c.channel);
    auto ctx = NewContext(c.target);
    grpc::Status s = args[1] == "save" ? stub->SaveCheckpoint(ctx.get(), req, &resp)
                                       : stub->RestoreCheckpoint(ctx.get(), req, &resp);
    if (!s.ok()) Fail(s, c.target, "checkpoint " + args[1] + " " + args[2]);
    PrintDone(*format, {{"ok", true}, {"tag", args[2]}, {"op", args[1]}},
              "checkpoint " + args[2] + (args[1] == "save" ? " saved" : " restored"));
    return kExitOk;
  }
  // contention WORKER FACTOR|off
  double factor = 0;
  if (args.size() != 3 || (args[2] != "off" && !(std::istringstream(args[2]) >> factor))) {
    Usage("usage: pacerctl contention WORKER FACTOR|off");
  }
  auto sw = pacer::ContentionSwitch::NewStub(c.channel);
  pacer::ContentionRequest req;
  req.set_worker_id(args[1]);
  req.set_factor(args[2] == "off" ? 0 : factor);
  pacer::ContentionReply reply;
  {
    auto ctx = NewContext(c.target);
    grpc::Status s = sw->SetContention(ctx.get(), req, &reply);
    if (!s.ok()) Fail(s, c.target, "contention " + args[1]);
  }
  // Wait (bounded) for the agent to execute it: the command rides the next agent heartbeat.
  pacer::GetCommandRequest get;
  get.set_command_id(reply.command_id());
  pacer::GetCommandReply state;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  for (;;) {
    auto ctx = NewContext(c.target);
    grpc::Status s = sw->GetCommand(ctx.get(), get, &state);
    if (!s.ok()) Fail(s, c.target, "contention " + args[1]);
    if (state.state() != "pending" || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling period
  }
  PrintDone(*format, ProtoToJson(state),
            "contention " + args[2] + " on " + args[1] + " (node " + reply.node() +
                "): " + state.state() + (state.reason().empty() ? "" : " (" + state.reason() + ")"));
  return state.state() == "done" ? kExitOk : kExitFailed;
}
