#include "sim/scenario.h"

#include "controller/policy_loader.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pacer::sim {
namespace {

// Walks one YAML document against the expected keys; the first error wins. Every message is
// "FILE:LINE:COL: field 'PATH': what".
class ScenarioParser {
 public:
  explicit ScenarioParser(std::string_view file) : file_(file) {}


  absl::StatusOr<Scenario> Parse(const YAML::Node& root) {
    if (!root.IsDefined() || root.IsNull()) return Error(root.Mark(), "", "the file is empty");
    if (!root.IsMap()) return Error(root.Mark(), "", "the top level must be a mapping");
    sc_.file = std::string(file_);
    Fields top = {
        {"name", [&](const YAML::Node& v, const std::string& p) { return Str(v, p, &sc_.name); }},
        {"description",
         [&](const YAML::Node& v, const std::string& p) { return Str(v, p, &sc_.description); }},
        {"suited", [&](const YAML::Node& v, const std::string& p) { return Str(v, p, &sc_.suited); }},
        {"seed", [&](const YAML::Node& v, const std::string& p) { return Seed(v, p); }},
        {"noise", [&](const YAML::Node& v, const std::string& p) {
           return Real(v, p, &sc_.noise, 0, 0.9);
         }},
        {"noise_dist", [&](const YAML::Node& v, const std::string& p) {
           if (!v.IsScalar()) return Error(v.Mark(), p, "must be uniform, lognormal or exponential");
           if (v.Scalar() == "uniform") sc_.noise_dist = NoiseDist::kUniform;
           else if (v.Scalar() == "lognormal") sc_.noise_dist = NoiseDist::kLognormal;
           else if (v.Scalar() == "exponential") sc_.noise_dist = NoiseDist::kExponential;
           else return Error(v.Mark(), p, "must be uniform, lognormal or exponential");
           return absl::OkStatus();
         }},
        {"job", [&](const YAML::Node& v, const std::string& p) { return Job(v, p); }},
        {"speeds", [&](const YAML::Node& v, const std::string& p) { return Speeds(v, p); }},
        {"events", [&](const YAML::Node& v, const std::string& p) { return Events(v, p); }},
        {"sim", [&](const YAML::Node& v, const std::string& p) { return Sim(v, p); }},
    };
    if (absl::Status s = Walk(root, "", top, {"name", "seed", "job", "speeds"}); !s.ok()) return s;
    if (absl::Status s = CrossChecks(root); !s.ok()) return s;
    return sc_;
  }

 private:
  using Handler = std::function<absl::Status(const YAML::Node&, const std::string&)>;
  using Fields = std::map<std::string, Handler>;

  absl::Status Error(const YAML::Mark& mark, const std::string& path, const std::string& what) {
    const std::string msg = path.empty() ? what : absl::StrCat("field '", path, "': ", what);
    if (mark.line < 0) return absl::InvalidArgumentError(absl::StrCat(file_, ": ", msg));
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ":", mark.line + 1, ":", mark.column + 1, ": ", msg));
  }

  absl::Status Walk(const YAML::Node& map, const std::string& path, const Fields& fields,
                    const std::vector<std::string>& required) {
    if (!map.IsMap()) return Error(map.Mark(), path, "must be a mapping");
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: `it->` is a temporary proxy
      if (!key.IsScalar()) return Error(key.Mark(), path, "keys must be plain names");
      const std::string name = key.Scalar();
      const std::string full = path.empty() ? name : absl::StrCat(path, ".", name);
      if (!seen.insert(name).second) return Error(key.Mark(), full, "appears twice");
      auto f = fields.find(name);
      if (f == fields.end()) {
        std::vector<std::string> known;
        for (const auto& [k, h] : fields) known.push_back(k);
        return Error(key.Mark(), full,
                     absl::StrCat("unknown field; known here: ", absl::StrJoin(known, ", ")));
      }
      marks_[full] = it->second.Mark();
      if (absl::Status s = f->second(it->second, full); !s.ok()) return s;
    }
    for (const auto& r : required)
      if (!seen.count(r))
        return Error(map.Mark(), path.empty() ? r : absl::StrCat(path, ".", r), "is required");
    return absl::OkStatus();
  }

  absl::Status Str(const YAML::Node& v, const std::string& p, std::string* out) {
    if (!v.IsScalar()) return Error(v.Mark(), p, "must be a string");
    *out = v.Scalar();
    if (out->size() > 256) return Error(v.Mark(), p, "longer than 256 characters");
    return absl::OkStatus();
  }
  absl::Status Real(const YAML::Node& v, const std::string& p, double* out, double lo, double hi) {
    if (!v.IsScalar() || v.Tag() == "!") return Error(v.Mark(), p, "must be a number");
    double d = 0;
    try {
      d = v.as<double>();
    } catch (const std::exception&) {
      return Error(v.Mark(), p, absl::StrCat("must be a number, got '", v.Scalar(), "'"));
    }
    if (!std::isfinite(d) || d < lo || d > hi)
      return Error(v.Mark(), p, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v.Scalar()));
    *out = d;
    return absl::OkStatus();
  }
  absl::Status Int(const YAML::Node& v, const std::string& p, int64_t* out, int64_t lo, int64_t hi) {
    if (!v.IsScalar() || v.Tag() == "!") return Error(v.Mark(), p, "must be an integer");
    int64_t i = 0;
    try {
      i = v.as<int64_t>();
    } catch (const std::exception&) {
      return Error(v.Mark(), p, absl::StrCat("must be an integer, got '", v.Scalar(), "'"));
    }
    if (i < lo || i > hi)
      return Error(v.Mark(), p, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v.Scalar()));
    *out = i;
    return absl::OkStatus();
  }
  absl::Status Bool(const YAML::Node& v, const std::string& p, bool* out) {
    if (!v.IsScalar() || v.Tag() == "!") return Error(v.Mark(), p, "must be true or false");
    try {
      *out = v.as<bool>();
    } catch (const std::exception&) {
      return Error(v.Mark(), p, absl::StrCat("must be true or false, got '", v.Scalar(), "'"));
    }
    return absl::OkStatus();
  }
  absl::Status Seed(const YAML::Node& v, const std::string& p) {
    int64_t s = 0;
    if (absl::Status st = Int(v, p, &s, 0, INT64_MAX); !st.ok()) return st;
    sc_.seed = static_cast<uint64_t>(s);
    return absl::OkStatus();
  }

  absl::Status Job(const YAML::Node& node, const std::string& path) {
    ScenarioJob& j = sc_.job;
    const int64_t kMaxWorkers = 65536;
    Fields f = {
        {"mode",
         [&](const YAML::Node& v, const std::string& p) -> absl::Status {
           if (!v.IsScalar()) return Error(v.Mark(), p, "must be sync or async");
           if (v.Scalar() == "sync") j.mode = SimJobMode::kSync;
           else if (v.Scalar() == "async") j.mode = SimJobMode::kAsync;
           else return Error(v.Mark(), p, absl::StrCat("must be sync or async, got '", v.Scalar(), "'"));
           return absl::OkStatus();
         }},
        {"workers", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &j.workers, 1, kMaxWorkers); }},
        {"workers_per_node", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &j.workers_per_node, 1, 1024); }},
        {"servers", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &j.servers, 0, 4096); }},
        {"global_batch", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &j.global_batch, 1, int64_t{1} << 30); }},
        {"total_samples", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &j.total_samples, 1, int64_t{1} << 50); }},
        {"sync_cost_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &j.sync_cost_s, 0, 3600); }},
        {"restart_cost_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &j.restart_cost_s, 0, 86400); }},
        {"migrate_cost_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &j.migrate_cost_s, 0, 86400); }},
        {"batch_cap", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &j.batch_cap, 0, int64_t{1} << 30); }},
        {"spare_nodes", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &j.spare_nodes, 0, kMaxWorkers); }},
    };
    return Walk(node, path, f, {"mode", "workers", "global_batch", "total_samples"});
  }

  absl::Status Speeds(const YAML::Node& node, const std::string& path) {
    ScenarioSpeeds& s = sc_.speeds;
    Fields f = {
        {"median", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &s.median, 1e-6, 1e9); }},
        {"sigma", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &s.sigma, 0, 2); }},
        {"groups", [&](const YAML::Node& v, const std::string& p) -> absl::Status {
           if (!v.IsSequence()) return Error(v.Mark(), p, "must be a list of {fraction, factor}");
           for (size_t i = 0; i < v.size(); ++i) {
             SpeedGroup g;
             const std::string gp = absl::StrCat(p, "[", i, "]");
             Fields gf = {
                 {"fraction", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &g.fraction, 0, 1); }},
                 {"factor", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &g.factor, 0.001, 100); }},
             };
             if (absl::Status st = Walk(v[i], gp, gf, {"fraction", "factor"}); !st.ok()) return st;
             s.groups.push_back(g);
           }
           return absl::OkStatus();
         }},
    };
    return Walk(node, path, f, {"median"});
  }

  absl::Status Events(const YAML::Node& v, const std::string& p) {
    if (!v.IsSequence()) return Error(v.Mark(), p, "must be a list of events");
    for (size_t i = 0; i < v.size(); ++i) {
      ScenarioEvent e;
      e.line = v[i].Mark().line + 1;
      const std::string ep = absl::StrCat(p, "[", i, "]");
      bool contention_given = false;
      Fields f = {
          {"at_s", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &e.at_s, 0, 1e9); }},
          {"kind", [&](const YAML::Node& x, const std::string& q) -> absl::Status {
             static const std::map<std::string, EventKind> kKinds = {
                 {"slowdown", EventKind::kSlowdown}, {"transient", EventKind::kTransient},
                 {"node_contention", EventKind::kNodeContention}, {"failure", EventKind::kFailure},
                 {"hot_server", EventKind::kHotServer}};
             auto k = x.IsScalar() ? kKinds.find(x.Scalar()) : kKinds.end();
             if (k == kKinds.end())
               return Error(x.Mark(), q, absl::StrCat("must be one of slowdown, transient, node_contention, failure, hot_server; got '",
                                                      x.IsScalar() ? x.Scalar() : "?", "'"));
             e.kind = k->second;
             return absl::OkStatus();
           }},
          {"worker", [&](const YAML::Node& x, const std::string& q) { return Int(x, q, &e.worker, 0, 65535); }},
          {"node", [&](const YAML::Node& x, const std::string& q) { return Int(x, q, &e.node, 0, 65535); }},
          {"server", [&](const YAML::Node& x, const std::string& q) { return Int(x, q, &e.server, 0, 4095); }},
          {"fraction", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &e.fraction, 0, 1); }},
          {"factor", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &e.factor, 0.001, 100); }},
          {"duration_s", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &e.duration_s, 0, 1e9); }},
          {"rate_per_worker_hour", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &e.rate_per_worker_hour, 0, 3600); }},
          {"mean_duration_s", [&](const YAML::Node& x, const std::string& q) { return Real(x, q, &e.mean_duration_s, 0.001, 1e7); }},
          {"contention", [&](const YAML::Node& x, const std::string& q) {
             contention_given = true;
             return Bool(x, q, &e.contention);
           }},
      };
      if (absl::Status s = Walk(v[i], ep, f, {"at_s", "kind"}); !s.ok()) return s;
      if (absl::Status s = CheckEvent(e, v[i], ep); !s.ok()) return s;
      (void)contention_given;
      sc_.events.push_back(e);
    }
    return absl::OkStatus();
  }

  absl::Status CheckEvent(const ScenarioEvent& e, const YAML::Node& n, const std::string& p) {
    const int targets = (e.worker >= 0) + (e.node >= 0) + (e.server >= 0) + (e.fraction > 0);
    auto need = [&](bool ok, const std::string& what) {
      return ok ? absl::OkStatus() : Error(n.Mark(), p, what);
    };
    switch (e.kind) {
      case EventKind::kSlowdown:
        return need(targets == 1 && e.node < 0 && e.server < 0,
                    "a slowdown needs exactly one of 'worker' or 'fraction'");
      case EventKind::kTransient:
        return need(e.rate_per_worker_hour > 0 && e.node < 0 && e.server < 0 && e.worker < 0,
                    "a transient needs 'rate_per_worker_hour' > 0 (and optionally 'fraction' of workers)");
      case EventKind::kNodeContention:
        return need(targets == 1 && e.worker < 0 && e.server < 0,
                    "a node_contention needs exactly one of 'node' or 'fraction'");
      case EventKind::kFailure:
        return need((e.worker >= 0) != (e.rate_per_worker_hour > 0) && e.node < 0 && e.server < 0,
                    "a failure needs exactly one of 'worker' or 'rate_per_worker_hour'");
      case EventKind::kHotServer:
        return need(e.server >= 0 && e.worker < 0 && e.node < 0 && e.fraction == 0,
                    "a hot_server needs 'server'");
    }
    return absl::OkStatus();
  }

  absl::Status Sim(const YAML::Node& node, const std::string& path) {
    SimSettings& s = sc_.sim;
    Fields f = {
        {"tick_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &s.tick_s, 0.01, 3600); }},
        {"report_interval_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &s.report_interval_s, 0.1, 3600); }},
        {"progress_interval_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &s.progress_interval_s, 0, 3600); }},
        {"shard_size", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &s.shard_size, 0, int64_t{1} << 32); }},
        {"max_sim_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &s.max_sim_s, 0, 1e8); }},
        {"reconcile_s", [&](const YAML::Node& v, const std::string& p) { return Real(v, p, &s.reconcile_s, 0, 3600); }},
        {"decision_heartbeats", [&](const YAML::Node& v, const std::string& p) { return Int(v, p, &s.decision_heartbeats, 0, 1); }},
        {"step_deadline", [&](const YAML::Node& v, const std::string& p) { return Bool(v, p, &s.step_deadline); }},
        {"trainer_deadline", [&](const YAML::Node& v, const std::string& p) { return Bool(v, p, &s.trainer_deadline); }},
    };
    return Walk(node, path, f, {});
  }

  // Checks that need more than one field; located at the field that is wrong.
  absl::Status CrossChecks(const YAML::Node& root) {
    absl::Status s = ValidateScenario(sc_);
    if (s.ok()) return s;
    // ValidateScenario's message starts with "field 'PATH'": locate it.
    const std::string msg(s.message());
    const size_t a = msg.find('\''), b = msg.find('\'', a + 1);
    const std::string path = (a != std::string::npos && b != std::string::npos) ? msg.substr(a + 1, b - a - 1) : "";
    auto it = marks_.find(path);
    const YAML::Mark mark = it == marks_.end() ? root.Mark() : it->second;
    if (mark.line < 0) return absl::InvalidArgumentError(absl::StrCat(file_, ": ", msg));
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ":", mark.line + 1, ":", mark.column + 1, ": ", msg));
  }

  std::string file_;
  Scenario sc_;
  std::map<std::string, YAML::Mark> marks_;
};

}  // namespace

const char* EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kSlowdown: return "slowdown";
    case EventKind::kTransient: return "transient";
    case EventKind::kNodeContention: return "node_contention";
    case EventKind::kFailure: return "failure";
    case EventKind::kHotServer: return "hot_server";
  }
  return "?";
}

absl::Status ValidateScenario(const Scenario& sc) {
  auto bad = [](const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("field '", path, "': ", what));
  };
  if (sc.name.empty()) return bad("name", "must not be empty");
  const ScenarioJob& j = sc.job;
  if (j.workers < 1) return bad("job.workers", "must be at least 1");
  if (j.mode == SimJobMode::kSync && j.servers != 0)
    return bad("job.servers", "a sync (all-reduce) job has no parameter servers");
  if (j.mode == SimJobMode::kAsync && j.servers < 1)
    return bad("job.servers", "an async (PS) job needs at least one server");
  if (j.global_batch < j.workers)
    return bad("job.global_batch", absl::StrCat("must be at least one sample per worker (", j.workers, ")"));
  if (j.total_samples < j.global_batch)
    return bad("job.total_samples", "must be at least one global batch");
  if (j.mode == SimJobMode::kAsync && j.batch_cap > 0 && j.batch_cap * j.workers < j.global_batch)
    return bad("job.batch_cap", "async local batches (global_batch / workers) exceed the cap");
  double fractions = 0;
  for (size_t i = 0; i < sc.speeds.groups.size(); ++i) fractions += sc.speeds.groups[i].fraction;
  if (fractions > 1 + 1e-9) return bad("speeds.groups", "fractions add up to more than 1");
  for (size_t i = 0; i < sc.events.size(); ++i) {
    const ScenarioEvent& e = sc.events[i];
    const std::string p = absl::StrCat("events[", i, "]");
    if (e.worker >= j.workers) return bad(p + ".worker", absl::StrCat("no worker ", e.worker, " (workers: ", j.workers, ")"));
    if (e.node >= sc.nodes()) return bad(p + ".node", absl::StrCat("no node ", e.node, " (nodes: ", sc.nodes(), ")"));
    if (e.server >= 0 && e.server >= j.servers) return bad(p + ".server", absl::StrCat("no server ", e.server, " (servers: ", j.servers, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Scenario> ParseScenario(std::string_view yaml_text, std::string_view file_name) {
  if (yaml_text.size() > kMaxScenarioBytes)
    return absl::InvalidArgumentError(absl::StrCat(std::string(file_name), ": larger than 1 MiB"));
  try {
    // YAML::Load reads the first document (not LoadAll: it can loop forever in yaml-cpp 0.7).
    const std::string text(yaml_text);
    YAML::Node root = YAML::Load(text);
    if (auto second = SecondYamlDocument(text)) {  // refused, as in policy files
      return absl::InvalidArgumentError(absl::StrCat(std::string(file_name), ":", second->first, ":",
                                                     second->second,
                                                     ": only one YAML document is allowed"));
    }
    ScenarioParser parser(file_name);
    return parser.Parse(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(file_name), ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": malformed YAML: ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(file_name), ": ", e.what()));
  } catch (...) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(file_name), ": unreadable scenario"));
  }
}

absl::StatusOr<Scenario> LoadScenarioFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the scenario file"));
  // At most one byte past the limit is read, so /dev/zero or a huge file cannot exhaust memory.
  std::string text(kMaxScenarioBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return ParseScenario(text, path);
}

}  // namespace pacer::sim
