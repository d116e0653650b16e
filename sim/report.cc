#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pacer::sim {
namespace {

bool IsBaseline(const PolicyRun& r) {
  return r.policy == "none" || r.policy == "backup-workers" || r.policy == "lb-bsp" ||
         r.policy == "timeout-relaunch";
}

std::string Duration(double s) {
  if (!std::isfinite(s)) return "DNF";
  if (s >= 3600) return absl::StrFormat("%.2fh", s / 3600);
  if (s >= 60) return absl::StrFormat("%.1fm", s / 60);
  return absl::StrFormat("%.1fs", s);
}

double Finite(double x) { return std::isfinite(x) ? x : -1; }

struct Verdict {
  int suited = -1, best_baseline = -1;
  double ratio = 0;  // suited JCT / best baseline JCT
};

Verdict Judge(const Comparison& c) {
  Verdict v;
  v.suited = FindRun(c, c.scenario->suited);
  for (size_t i = 0; i < c.runs.size(); ++i) {
    if (!IsBaseline(c.runs[i])) continue;
    if (v.best_baseline < 0 || c.runs[i].jct_s < c.runs[v.best_baseline].jct_s)
      v.best_baseline = static_cast<int>(i);
  }
  if (v.suited >= 0 && v.best_baseline >= 0)
    v.ratio = c.runs[v.suited].jct_s / c.runs[v.best_baseline].jct_s;
  return v;
}

}  // namespace

int FindRun(const Comparison& c, const std::string& name) {
  for (size_t i = 0; i < c.runs.size(); ++i)
    if (c.runs[i].name == name) return static_cast<int>(i);
  for (size_t i = 0; i < c.runs.size(); ++i)
    if (c.runs[i].policy == name) return static_cast<int>(i);
  return -1;
}

double Efficiency(const Comparison& c, const PolicyRun& r) {
  if (!r.finished || !std::isfinite(c.bound.jct_s)) return 0;
  return c.bound.jct_s / r.jct_s;
}

double SpeedupVsNone(const Comparison& c, const PolicyRun& r) {
  const int none = FindRun(c, "none");
  if (none < 0 || !r.finished || !c.runs[none].finished) return 0;
  return c.runs[none].jct_s / r.jct_s;
}

std::string FormatTable(const Comparison& c) {
  const Scenario& sc = *c.scenario;
  std::string out = absl::StrFormat(
      "scenario %s (%s, %d workers on %d nodes%s, %d samples, seed %d)\n", sc.name,
      sc.job.mode == SimJobMode::kSync ? "sync all-reduce" : "async PS", sc.job.workers,
      sc.nodes(), sc.job.servers > 0 ? absl::StrCat(", ", sc.job.servers, " servers") : "",
      sc.job.total_samples, sc.seed);
  absl::StrAppendFormat(&out, "balanced bound: %s\n", Duration(c.bound.jct_s));
  absl::StrAppendFormat(&out, "%-18s %9s %6s %8s %6s %8s %6s %7s %9s %5s\n", "policy", "JCT", "eff",
                        "vs none", "plans", "restarts", "migr", "other", "lost/dup", "fail");
  for (const auto& r : c.runs) {
    const double eff = Efficiency(c, r);
    absl::StrAppendFormat(&out, "%-18s %9s %5.3f%s %7.2fx %6d %8d %6d %7d %4d/%-4d %5d\n", r.name,
                          Duration(r.jct_s), eff, eff > 1 ? "*" : " ", SpeedupVsNone(c, r), r.plans,
                          r.restarts, r.migrations,
                          r.server_actions + r.reallocations + r.exclusions, r.records_lost,
                          r.records_duplicated, r.failures);
  }
  const Verdict v = Judge(c);
  if (v.suited >= 0 && v.best_baseline >= 0) {
    absl::StrAppendFormat(&out, "suited preset %s vs best baseline %s: JCT ratio %.3f (%s)\n",
                          c.runs[v.suited].name, c.runs[v.best_baseline].name, v.ratio,
                          v.ratio <= 1.02 ? "no worse, within 2%" : "WORSE than the baseline");
  }
  bool beat = false;
  for (const auto& r : c.runs) beat = beat || Efficiency(c, r) > 1;
  if (beat)
    out += "* beats the balanced bound: relaunches moved work off slow nodes/servers the bound "
           "keeps (see docs/simulator.md)\n";
  absl::StrAppendFormat(&out, "wall %.2fs, %d model events (%.0f events/s); per policy:", c.wall_s,
                        c.model_events, c.wall_s > 0 ? static_cast<double>(c.model_events) / c.wall_s : 0);
  for (const auto& r : c.runs)
    absl::StrAppendFormat(&out, " %s %.2fs (cpu %.2fs)", r.name, r.wall_s, r.cpu_s);
  out += "\n";
  return out;
}

std::string FormatJson(const Comparison& c) {
  nlohmann::ordered_json j;
  const Scenario& sc = *c.scenario;
  j["scenario"] = sc.name;
  j["seed"] = sc.seed;
  j["workers"] = sc.job.workers;
  j["mode"] = sc.job.mode == SimJobMode::kSync ? "sync" : "async";
  j["wall_s"] = c.wall_s;
  j["model_events"] = c.model_events;
  j["events_per_s"] = c.wall_s > 0 ? static_cast<double>(c.model_events) / c.wall_s : 0;
  j["bound_jct_s"] = Finite(c.bound.jct_s);
  j["suited"] = sc.suited;
  const Verdict v = Judge(c);
  if (v.best_baseline >= 0) j["best_baseline"] = c.runs[v.best_baseline].name;
  if (v.suited >= 0 && v.best_baseline >= 0) j["suited_vs_best_baseline"] = v.ratio;
  auto& arr = j["policies"] = nlohmann::ordered_json::array();
  for (const auto& r : c.runs) {
    nlohmann::ordered_json p;
    p["name"] = r.name;
    p["policy"] = r.policy;
    p["finished"] = r.finished;
    p["jct_s"] = Finite(r.jct_s);
    p["efficiency"] = Efficiency(c, r);
    p["speedup_vs_none"] = SpeedupVsNone(c, r);
    p["records_lost"] = r.records_lost;
    p["records_duplicated"] = r.records_duplicated;
    p["backup_overlap"] = r.backup_overlap;
    p["wasted_samples"] = r.wasted_samples;
    p["state_ledger_mismatch"] = r.state_done_mismatch;
    p["actions"] = {{"plans", r.plans},           {"restarts", r.restarts},
                    {"migrations", r.migrations}, {"server_actions", r.server_actions},
                    {"reallocations", r.reallocations}, {"exclusions", r.exclusions},
                    {"rollbacks", r.rollbacks},   {"invalid_plans", r.invalid_plans}};
    p["failures"] = r.failures;
    p["fenced_reports"] = r.fenced_reports;
    p["wall_s"] = r.wall_s;
    p["cpu_s"] = r.cpu_s;
    p["model_events"] = r.model_events;
    p["sharding_updates"] = r.sharding_updates;
    p["monitor_reports"] = r.monitor_reports;
    p["reconciles"] = r.reconciles;
    arr.push_back(std::move(p));
  }
  return j.dump(2) + "\n";
}

std::string FormatSvg(const Comparison& c) {
  const double W = 960, H = 420, L = 70, R = 180, T = 30, Bm = 50;
  double tmax = std::isfinite(c.bound.jct_s) ? c.bound.jct_s : 0, ymax = 0;
  for (const auto& r : c.runs) {
    if (!r.throughput.empty()) tmax = std::max(tmax, r.throughput.back().first);
    for (const auto& p : r.throughput) ymax = std::max(ymax, p.second);
  }
  for (const auto& p : c.bound.rate) ymax = std::max(ymax, p.second);
  if (tmax <= 0) tmax = 1;
  if (ymax <= 0) ymax = 1;
  ymax *= 1.08;
  auto X = [&](double t) { return L + (W - L - R) * std::min(t, tmax) / tmax; };
  auto Y = [&](double v) { return H - Bm - (H - T - Bm) * v / ymax; };
  static const char* kColors[] = {"#888888", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      W, H);
  absl::StrAppendFormat(&s, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%s: throughput (samples/s) over time</text>\n", L,
                        c.scenario->name);
  absl::StrAppendFormat(&s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, H - Bm, W - R, H - Bm);
  absl::StrAppendFormat(&s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, T, L, H - Bm);
  for (int i = 0; i <= 5; ++i) {
    const double t = tmax * i / 5, v = ymax * i / 5;
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", X(t), H - Bm + 16, Duration(t));
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L - 4, Y(v) + 4, v);
  }
  // At most ~600 points per line: bucket by time and average.
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, bool step, const char* color,
                      const char* dash) {
    std::string d;
    const size_t stride = std::max<size_t>(1, pts.size() / 600);
    for (size_t i = 0; i < pts.size(); i += stride) {
      double sum = 0;
      size_t n = 0;
      for (size_t k = i; k < std::min(pts.size(), i + stride); ++k, ++n) sum += pts[k].second;
      const double v = sum / static_cast<double>(n);
      if (step && !d.empty()) absl::StrAppendFormat(&d, "%.1f,%.1f ", X(pts[i].first), Y(v));
      absl::StrAppendFormat(&d, "%.1f,%.1f ", X(pts[i].first), Y(v));
    }
    if (step && !pts.empty()) absl::StrAppendFormat(&d, "%.1f,%.1f", X(tmax), Y(pts.back().second));
    absl::StrAppendFormat(&s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" %s points=\"%s\"/>\n", color, dash, d);
  };
  polyline(c.bound.rate, true, "black", "stroke-dasharray=\"6,4\"");
  absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\">balanced bound</text>\n", W - R + 10, T + 10.0);
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const char* color = kColors[i % 10];
    polyline(c.runs[i].throughput, false, color, "");
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%s</text>\n", W - R + 10,
                          T + 28.0 + 18.0 * static_cast<double>(i), color, c.runs[i].name);
    // Actions: short ticks under the axis (plans small, relaunches and failures taller).
    std::map<long, int> seen;
    for (const auto& a : c.runs[i].actions) {
      const long px = std::lround(X(a.t_s));
      if (seen[px]++ > 0) continue;
      const bool big = a.kind != "ADJUST_BS" && a.kind != "REALLOCATE";
      const double y0 = H - Bm + 20 + 3.0 * static_cast<double>(i);
      absl::StrAppendFormat(&s, "<line x1=\"%ld\" y1=\"%.1f\" x2=\"%ld\" y2=\"%.1f\" stroke=\"%s\"><title>%s %s</title></line>\n",
                            px, y0, px, y0 + (big ? 8.0 : 3.0), color, a.kind, a.target);
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace pacer::sim
