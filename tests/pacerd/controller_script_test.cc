// Controller scripts with golden output (tests/pacerd/testdata/*.txt): the controller's decisions
// as a whole pacerd makes them, on the simulated clock. (tests/controller/controller_decision_test.cc
// holds the cases a script cannot express: views made by hand, fed to the Controller alone.)
//
// Each file is a script for a real pacerd on a simulated clock (tests/testing/pacerd_harness.h)
// driving a job of scripted workers, and the decisions pacerd made, as a reader wants to see
// them. A file is a sequence of blocks:
//
//   # comments and blank lines are kept
//   <command>
//   ----
//   <what pacerd decided or answered>
//
// Commands:
//   start policy=NAME workers=N [batch=B] [honors-exclusion]   pacerd with tests/testing/policies/NAME.yaml
//   speed wI=F ...        worker speed factors (1 nominal, 0.5 half speed)
//   kill wI / revive wI   a worker stops / resumes stepping and heartbeating
//   run DURATION          e.g. 12s: steps every 100 ms, heartbeats every second, housekeeping
//                         after every step; prints every decision recorded meanwhile
//   status                every worker's batch in force and whether it is excluded
//   explain               the newest decision record in full: what it saw (inputs), its reason,
//                         the predicted gain and, once judged, the measured gain and whether it
//                         was rolled back
//   restart-pacerd        stop pacerd and start it again on the same data dir
//
// The output of `run` lists the audit records created meanwhile, in order: time since start,
// kind, target, outcome (and the veto), the action's detail and where it was dispatched.
//
// A changed decision fails the test with both outputs. After an intended change, rewrite the
// goldens and review the diff:  PACER_REWRITE_GOLDENS=1 build/bin/controller_script_test
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tests/testing/golden_scripts.h"
#include "tests/testing/pacerd_harness.h"

namespace pacer {
namespace {

using testing::HarnessOptions;
using testing::PacerdHarness;
using testing::ScriptedJob;

constexpr int64_t kStartMs = 1'700'000'000'000;

class ScriptRun {
 public:
  // Runs one command; returns its output (without a trailing newline).
  std::string Do(const std::string& line) {
    std::vector<std::string> args = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (args.empty()) return "error: empty command";
    const std::string cmd = args[0];
    std::map<std::string, std::string> kv;
    std::vector<std::string> flags;
    for (size_t i = 1; i < args.size(); ++i) {
      const size_t eq = args[i].find('=');
      if (eq == std::string::npos) flags.push_back(args[i]);
      else kv[args[i].substr(0, eq)] = args[i].substr(eq + 1);
    }
    if (cmd == "start") return Start(kv, flags);
    if (!harness_ || !harness_->ok()) return "error: no pacerd (start first)";
    if (cmd == "speed") {
      for (const auto& [w, f] : kv) job_->SetSpeed(w, std::stod(f));
      return "ok";
    }
    if (cmd == "kill" || cmd == "revive") {
      for (const auto& w : flags) cmd == "kill" ? job_->Kill(w) : job_->Revive(w);
      return "ok";
    }
    if (cmd == "run") {
      if (flags.size() != 1 || flags[0].back() != 's') return "error: run DURATIONs";
      const int64_t ms = static_cast<int64_t>(std::stod(flags[0].substr(0, flags[0].size() - 1)) * 1000);
      if (absl::Status s = job_->Run(ms); !s.ok()) return "error: " + std::string(s.message());
      return NewDecisions();
    }
    if (cmd == "status") {
      std::string out;
      for (auto& w : job_->workers()) {
        absl::StrAppendFormat(&out, "%s%s batch=%d plan=v%d%s", out.empty() ? "" : "\n", w->id(),
                              w->batch(), w->plan_version(), w->excluded() ? " excluded" : "");
      }
      return out;
    }
    if (cmd == "explain") return Explain();
    if (cmd == "restart-pacerd") {
      harness_->Restart();
      if (!harness_->ok()) return "error: pacerd did not start again";
      const ListActionsResponse a = harness_->Actions();
      // The restart's own records (the policy in force, restored) are not decisions.
      for (const auto& r : a.actions()) seen_ = std::max<uint64_t>(seen_, r.id());
      return absl::StrFormat("pacerd restarted: plan v%d in force, %d audit records", a.plan_version(),
                             a.actions_size());
    }
    return "error: unknown command '" + cmd + "'";
  }

 private:
  std::string Start(const std::map<std::string, std::string>& kv, const std::vector<std::string>& flags) {
    HarnessOptions ho;
    if (auto it = kv.find("policy"); it != kv.end()) ho.policy = it->second;
    harness_ = std::make_unique<PacerdHarness>(ho);
    if (!harness_->ok()) return "error: pacerd did not start";
    ScriptedJob::Options jo;
    if (auto it = kv.find("workers"); it != kv.end()) jo.workers = std::stoi(it->second);
    if (auto it = kv.find("batch"); it != kv.end()) jo.batch = static_cast<uint32_t>(std::stoul(it->second));
    jo.honors_exclusion = std::find(flags.begin(), flags.end(), "honors-exclusion") != flags.end();
    job_ = std::make_unique<ScriptedJob>(*harness_, jo);
    if (absl::Status s = job_->Connect(); !s.ok()) return "error: " + std::string(s.message());
    const ListActionsResponse a = harness_->Actions();
    for (const auto& r : a.actions()) seen_ = std::max<uint64_t>(seen_, r.id());
    return absl::StrFormat("policy %s (%s), %d workers of batch %d", a.policy_name(), a.policy(),
                           jo.workers, jo.batch);
  }

  std::string NewDecisions() {
    const ListActionsResponse a = harness_->Actions();
    std::vector<const ActionRecord*> fresh;
    for (const auto& r : a.actions())
      if (r.id() > seen_) fresh.push_back(&r);
    std::sort(fresh.begin(), fresh.end(), [](auto* x, auto* y) { return x->id() < y->id(); });
    std::string out;
    for (const ActionRecord* r : fresh) {
      seen_ = std::max<uint64_t>(seen_, r->id());
      std::string line = absl::StrFormat("t=%.1fs %s", (r->time_ms() - kStartMs) / 1000.0, r->kind());
      if (!r->target().empty()) absl::StrAppend(&line, " ", r->target());
      absl::StrAppend(&line, " ", r->outcome());
      if (!r->veto_reason().empty()) absl::StrAppend(&line, " (", r->veto_reason(), ")");
      if (r->repeats() > 1) absl::StrAppend(&line, " x", r->repeats());
      if (!r->detail().empty()) absl::StrAppend(&line, ":", r->detail().front() == ' ' ? "" : " ", r->detail());
      if (!r->dispatch().empty()) absl::StrAppend(&line, " -> ", r->dispatch());
      if (r->kind() == "POLICY") line = absl::StrFormat("t=%.1fs POLICY: %s", (r->time_ms() - kStartMs) / 1000.0, r->reason());
      absl::StrAppend(&out, out.empty() ? "" : "\n", line);
    }
    return out.empty() ? "no decision" : out;
  }

  std::string Explain() {
    const ListActionsResponse a = harness_->Actions();
    const ActionRecord* newest = nullptr;
    for (const auto& r : a.actions())
      if (r.kind() != "POLICY" && (!newest || r.id() > newest->id())) newest = &r;
    if (!newest) return "no decision";
    const ActionRecord& r = *newest;
    std::string out = absl::StrFormat("t=%.1fs %s %s %s", (r.time_ms() - kStartMs) / 1000.0, r.kind(),
                                      r.target().empty() ? "-" : r.target(), r.outcome());
    absl::StrAppend(&out, "\ninputs: ", r.inputs(), "\nreason: ", r.reason());
    absl::StrAppendFormat(&out, "\npredicted gain %.3f", r.predicted_gain());
    if (r.measured()) {
      absl::StrAppendFormat(&out, ", measured gain %.3f%s", r.measured_gain(),
                            r.rolled_back() ? ", rolled back" : ", kept");
    } else {
      absl::StrAppend(&out, ", not judged yet");
    }
    return out;
  }

  std::unique_ptr<PacerdHarness> harness_;
  std::unique_ptr<ScriptedJob> job_;
  uint64_t seen_ = 0;
};

// Runs a script; returns the file as it should read with the actual outputs.
std::string RunScript(const std::string& text) {
  ScriptRun run;
  return testing_golden::RewriteScript(text, [&run](const std::string& line) { return run.Do(line); });
}

class ControllerScriptTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ControllerScriptTest, DecisionsMatchTheGolden) {
  const std::string path = std::string(PACER_TESTDATA_DIR) + "/" + GetParam();
  const std::string want = testing_golden::ReadScript(path);
  const std::string got = RunScript(want);
  if (testing_golden::RewriteIfAsked(path, got)) GTEST_SKIP() << "rewrote " << path;
  EXPECT_EQ(got, want) << "decisions differ from " << path << testing_golden::kRewriteHint;
}

INSTANTIATE_TEST_SUITE_P(Scripts, ControllerScriptTest,
                         ::testing::ValuesIn(testing_golden::ScriptNames(PACER_TESTDATA_DIR)),
                         testing_golden::TestNameOf);

}  // namespace
}  // namespace pacer
