#include "cmd/pacerctl/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "common/version.h"
#include "proto/pacer/controller.grpc.pb.h"
#include "proto/pacer/operator.grpc.pb.h"
#include "proto/pacer/sharding.grpc.pb.h"

namespace pacer::ctl {
namespace {

std::string Esc(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

// A "nice" tick step (1, 2 or 5 × 10^k) giving about `target` intervals over `span`.
double NiceStep(double span, int target) {
  if (!(span > 0)) return 1;
  const double raw = span / target;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10 * mag;
}

std::string Num(double v) {
  std::ostringstream o;
  if (std::fabs(v) >= 100 || v == std::floor(v)) o << std::fixed << std::setprecision(0) << v;
  else o << std::fixed << std::setprecision(std::fabs(v) >= 1 ? 1 : 2) << v;
  return o.str();
}

struct Series {
  std::string name;
  std::string colour;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
};
struct Marker {
  double t;
  std::string label;
  std::string colour;
};

const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                          "#e377c2", "#17becf"};

std::string SvgChart(const std::string& title, const std::vector<Series>& series,
                     std::vector<Marker> markers, double x_max, const std::string& y_label) {
  const int width = 860, height = 260, ml = 60, mr = 180, mt = 28, mb = 36;
  const int pw = width - ml - mr, ph = height - mt - mb;
  double y_max = 0;
  for (const auto& s : series)
    for (const auto& p : s.points) y_max = std::max(y_max, p.second);
  const double y_step = NiceStep(y_max > 0 ? y_max * 1.1 : 1, 5);
  y_max = y_step * std::ceil((y_max > 0 ? y_max * 1.05 : 1) / y_step);
  x_max = std::max(x_max, 1.0);
  const double x_step = NiceStep(x_max, 8);
  auto X = [&](double t) { return ml + pw * std::clamp(t / x_max, 0.0, 1.0); };
  auto Y = [&](double y) { return mt + ph - ph * std::clamp(y / y_max, 0.0, 1.0); };
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  o << "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width
    << "\" height=\"" << height << "\" role=\"img\" aria-label=\"" << Esc(title) << "\">\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height << "\" fill=\"#fff\"/>\n";
  o << "<text x=\"" << ml << "\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" << Esc(title) << "</text>\n";
  for (double y = 0; y <= y_max + 1e-9; y += y_step) {
    o << "<line x1=\"" << ml << "\" x2=\"" << ml + pw << "\" y1=\"" << Y(y) << "\" y2=\"" << Y(y)
      << "\" stroke=\"#e5e5e5\"/>\n";
    o << "<text x=\"" << ml - 6 << "\" y=\"" << Y(y) + 4 << "\" font-size=\"10\" text-anchor=\"end\">"
      << Num(y) << "</text>\n";
  }
  for (double t = 0; t <= x_max + 1e-9; t += x_step) {
    o << "<line x1=\"" << X(t) << "\" x2=\"" << X(t) << "\" y1=\"" << mt + ph << "\" y2=\"" << mt + ph + 4
      << "\" stroke=\"#999\"/>\n";
    o << "<text class=\"xtick\" x=\"" << X(t) << "\" y=\"" << mt + ph + 15
      << "\" font-size=\"10\" text-anchor=\"middle\">" << Num(t) << "</text>\n";
  }
  o << "<text x=\"" << ml + pw / 2 << "\" y=\"" << height - 4
    << "\" font-size=\"11\" text-anchor=\"middle\">seconds since the first sample</text>\n";
  o << "<text x=\"12\" y=\"" << mt + ph / 2 << "\" font-size=\"11\" transform=\"rotate(-90 12 "
    << mt + ph / 2 << ")\" text-anchor=\"middle\">" << Esc(y_label) << "</text>\n";
  o << "<rect x=\"" << ml << "\" y=\"" << mt << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#999\"/>\n";
  std::sort(markers.begin(), markers.end(), [](const Marker& a, const Marker& b) { return a.t < b.t; });
  for (size_t k = 0; k < markers.size(); ++k) {
    const auto& m = markers[k];
    o << "<line x1=\"" << X(m.t) << "\" x2=\"" << X(m.t) << "\" y1=\"" << mt << "\" y2=\"" << mt + ph
      << "\" stroke=\"" << m.colour << "\" stroke-dasharray=\"4 3\"/>\n";
    o << "<text x=\"" << X(m.t) + 3 << "\" y=\"" << mt + 10 + 11 * (k % 3) << "\" font-size=\"10\" fill=\""
      << m.colour << "\">" << Esc(m.label) << "</text>\n";
  }
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    if (s.points.size() >= 2) {
      o << "<polyline class=\"series\" fill=\"none\" stroke=\"" << s.colour << "\" stroke-width=\"2\""
        << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
      for (const auto& p : s.points) o << X(p.first) << "," << Y(p.second) << " ";
      o << "\"/>\n";
    }
    const int ly = mt + 14 * static_cast<int>(i) + 8;
    o << "<line x1=\"" << ml + pw + 10 << "\" x2=\"" << ml + pw + 30 << "\" y1=\"" << ly << "\" y2=\""
      << ly << "\" stroke=\"" << s.colour << "\" stroke-width=\"2\"/>\n";
    o << "<text x=\"" << ml + pw + 34 << "\" y=\"" << ly + 4 << "\" font-size=\"11\">" << Esc(s.name)
      << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace

int WriteReport(const Client& c, const std::string& dir, Format format) {
  GetTimelineResponse tl;
  ListActionsResponse actions;
  ListDatasetsResponse datasets;
  {
    auto ctx = NewContext(c.target);
    grpc::Status s = Operator::NewStub(c.channel)->GetTimeline(ctx.get(), {}, &tl);
    if (!s.ok()) Fail(s, c.target, "report (Operator.GetTimeline)");
  }
  {
    auto ctx = NewContext(c.target);
    grpc::Status s = ControllerService::NewStub(c.channel)->ListActions(ctx.get(), {}, &actions);
    if (!s.ok()) Fail(s, c.target, "report (ListActions)");
  }
  {
    auto ctx = NewContext(c.target);
    grpc::Status s = ShardingService::NewStub(c.channel)->ListDatasets(ctx.get(), {}, &datasets);
    if (!s.ok()) Fail(s, c.target, "report (ListDatasets)");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::cerr << "pacerctl: report: cannot create '" << dir << "': " << ec.message() << std::endl;
    return kExitFailed;
  }

  const auto& samples = tl.samples();
  const int64_t t0_ms = samples.empty() ? tl.started_ms() : samples[0].time_ms();
  auto T = [&](int64_t ms) { return (ms - t0_ms) / 1000.0; };
  const double span_s = samples.empty() ? 0 : T(samples[samples.size() - 1].time_ms());

  // Per-worker speed and batch; throughput between consecutive samples (records done by the
  // sharding service; a reset or deleted dataset makes a step back, which is not a rate).
  std::map<std::string, Series> speed, batch;
  Series tput{"throughput (records/s)", "#1f77b4", {}, false};
  Series bound{"Σ v_i balanced bound", "#7f7f7f", {}, true};
  double tput_sum = 0, bound_sum = 0, tput_n = 0;
  Json jsamples = Json::array();
  for (int i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    const double t = T(s.time_ms());
    Json js = {{"t_s", t}, {"records_done", s.records_done()}, {"bound", s.bound()},
                         {"plan_version", s.plan_version()}};
    for (const auto& w : s.workers()) {
      auto& sp = speed[w.id()];
      sp.name = w.id();
      sp.points.emplace_back(t, w.speed());
      auto& b = batch[w.id()];
      b.name = w.id();
      b.points.emplace_back(t, w.local_batch());
      js["workers"][w.id()] = {{"speed", w.speed()}, {"class", w.worker_class()},
                               {"persistent", w.persistent()}, {"local_batch", w.local_batch()}};
    }
    bound.points.emplace_back(t, s.bound());
    if (i > 0 && s.records_done() >= samples[i - 1].records_done()) {
      const double dt = T(s.time_ms()) - T(samples[i - 1].time_ms());
      if (dt > 0) {
        const double r = (s.records_done() - samples[i - 1].records_done()) / dt;
        tput.points.emplace_back(t, r);
        js["throughput"] = r;
        // The verdict's figure: samples where work was done, against the bound then.
        if (r > 0 && s.bound() > 0) {
          tput_sum += r;
          bound_sum += s.bound();
          ++tput_n;
        }
      }
    }
    jsamples.push_back(std::move(js));
  }
  int k = 0;
  std::set<std::string> stragglers;
  for (const auto& d : tl.detections()) {
    if (d.current() == "straggler") stragglers.insert(d.id());
  }
  for (auto& [id, s] : speed) {
    s.colour = kColours[k % 8];
    if (stragglers.count(id)) s.name += " (flagged)";
    batch[id].colour = kColours[k % 8];
    ++k;
  }
  std::vector<Marker> markers;
  for (const auto& d : tl.detections()) {
    if (d.current() == "straggler" && d.time_ms() >= t0_ms) {
      // The first flag, then the change to persistent (a class change of its own).
      const bool again = d.previous() == "straggler";
      if (!again || d.persistent()) {
        markers.push_back({T(d.time_ms()), d.id() + (again ? " persistent" : " flagged"), "#ff7f0e"});
      }
    }
  }
  Json jactions = Json::array();
  for (int i = actions.actions_size() - 1; i >= 0; --i) {  // oldest first
    const auto& a = actions.actions(i);
    jactions.push_back(ProtoToJson(a));
    if (a.outcome() == "executed" && a.time_ms() >= t0_ms) {
      markers.push_back({T(a.time_ms()), a.kind(), "#2ca02c"});
    }
  }

  // The verdict: one line that says what the figures show.
  std::string verdict;
  const double ratio = bound_sum > 0 ? tput_sum / bound_sum : 0;
  if (samples.size() < 3) {
    verdict = "Too little history to judge: " + std::to_string(samples.size()) +
              " sample(s) of the job so far (pacerd samples once per monitor window; a pacerd "
              "restart starts a new timeline).";
  } else if (tput_n == 0) {
    verdict = "No records were completed while workers reported speeds: nothing to compare "
              "with the balanced bound yet.";
  } else {
    std::ostringstream v;
    v << "Over " << Fixed(span_s, 0) << " s the job trained at " << Fixed(tput_sum / tput_n, 0)
      << " records/s, " << Fixed(100 * ratio, 0) << " % of the balanced bound Σ v_i ("
      << Fixed(bound_sum / tput_n, 0) << " records/s)";
    if (!stragglers.empty()) {
      v << "; straggler" << (stragglers.size() > 1 ? "s" : "") << " flagged: ";
      bool first = true;
      for (const auto& s : stragglers) { v << (first ? "" : ", ") << s; first = false; }
    } else {
      v << "; no straggler was flagged";
    }
    int executed = 0;
    for (const auto& a : actions.actions()) executed += a.outcome() == "executed" ? 1 : 0;
    v << "; " << executed << " action" << (executed == 1 ? "" : "s") << " executed.";
    verdict = v.str();
  }

  uint64_t done = 0;
  for (const auto& d : datasets.datasets()) done += d.records_done_total();
  Json summary = {
      {"addr", c.target.addr},
      {"verdict", verdict},
      {"samples", samples.size()},
      {"span_s", span_s},
      {"window_ms", tl.window_ms()},
      {"sample_every_windows", tl.sample_every_windows()},
      {"records_done", done},
      {"mean_throughput", tput_n ? tput_sum / tput_n : 0},
      {"mean_bound", tput_n ? bound_sum / tput_n : 0},
      {"throughput_vs_bound", ratio},
      {"policy", actions.policy_name()},
      {"plan_version", actions.plan_version()},
      {"stragglers", stragglers},
  };
  Json report = {{"summary", summary}, {"samples", jsamples},
                           {"detections", ProtoToJson(tl)["detections"]}, {"actions", jactions}};

  std::vector<Series> speed_series, batch_series;
  for (auto& [id, s] : speed) speed_series.push_back(s);
  for (auto& [id, s] : batch) batch_series.push_back(s);
  std::string charts =
      SvgChart("Per-worker speed v_i (samples per compute second)", speed_series, markers, span_s,
               "samples / compute s") +
      SvgChart("Job throughput (records done per second) vs the balanced bound Σ v_i",
               {tput, bound}, markers, span_s, "records / s") +
      SvgChart("Per-worker local batch (the batch plan in force)", batch_series, markers, span_s,
               "samples per step");

  std::ostringstream det;
  det << "<table><thead><tr><th>t (s)</th><th>worker</th><th>from</th><th>to</th>"
         "<th>relative speed</th><th>evidence</th></tr></thead><tbody>";
  for (const auto& d : tl.detections()) {
    det << "<tr><td>" << Fixed(T(d.time_ms()), 1) << "</td><td>" << Esc(d.id()) << "</td><td>"
        << Esc(d.previous()) << "</td><td>" << Esc(d.current()) << (d.persistent() ? " (persistent)" : "")
        << "</td><td>" << Fixed(d.relative_speed(), 2) << "</td><td>" << Esc(d.evidence())
        << "</td></tr>";
  }
  det << "</tbody></table>";
  std::ostringstream acts;
  acts << "<table><thead><tr><th>id</th><th>t (s)</th><th>kind</th><th>target</th><th>outcome</th>"
          "<th>predicted</th><th>measured</th><th>why</th><th>detail</th></tr></thead><tbody>";
  for (int i = actions.actions_size() - 1; i >= 0; --i) {
    const auto& a = actions.actions(i);
    acts << "<tr><td>" << a.id() << "</td><td>" << Fixed(T(a.time_ms()), 1) << "</td><td>"
         << Esc(a.kind()) << "</td><td>" << Esc(a.target()) << "</td><td>" << Esc(a.outcome())
         << (a.veto_reason().empty() ? "" : ": " + Esc(a.veto_reason())) << "</td><td>"
         << Fixed(100 * a.predicted_gain(), 1) << " %</td><td>"
         << (a.measured() ? Fixed(100 * a.measured_gain(), 1) + " %"
             : a.outcome() == "executed" ? "not yet" : "-")
         << "</td><td>"
         << Esc(a.reason()) << "</td><td>" << Esc(a.detail()) << "</td></tr>";
  }
  acts << "</tbody></table>";

  std::ostringstream html;
  html << R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Pacer job report</title>
<style>
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
table { border-collapse: collapse; margin: 12px 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.verdict { font-size: 18px; }
svg.chart { display: block; margin: 12px 0; border: 1px solid #eee; }
</style></head><body>
<h1>Pacer job report</h1>
)";
  html << "<p class=\"verdict\" id=\"verdict\">" << Esc(verdict) << "</p>\n";
  html << "<table><tbody>"
       << "<tr><th>pacerd</th><td>" << Esc(c.target.addr) << "</td></tr>"
       << "<tr><th>policy</th><td>" << Esc(actions.policy_name()) << " (" << Esc(actions.policy())
       << ")" << (actions.dry_run() ? " dry-run" : "") << ", batch plan version "
       << actions.plan_version() << "</td></tr>"
       << "<tr><th>records done</th><td>" << done << "</td></tr>"
       << "<tr><th>history</th><td>" << samples.size() << " samples over " << Fixed(span_s, 1)
       << " s, one per " << tl.sample_every_windows() << " monitor window(s) of " << tl.window_ms()
       << " ms</td></tr></tbody></table>\n";
  html << "<p>Σ v_i is the sum of the monitor's per-worker speeds (samples per compute second): "
          "the job's throughput if every worker computed all the time at its measured speed, "
          "with no waiting. Dashed vertical lines: orange, a worker flagged as a straggler; "
          "green, an action the controller executed.</p>\n";
  html << "<h2>Charts</h2>\n" << charts;
  html << "<h2>Detections (the monitor's classification changes)</h2>\n" << det.str();
  html << "<h2>Actions and why (pacerctl actions)</h2>\n" << acts.str();
  html << "<p>Generated by pacerctl report (" << Esc(PacerVersion()) << ") from pacerd's history; "
          "the figures are in report.json.</p>\n";
  html << R"(<script>
// Self-check for tests/demo/check_report.py (headless Chromium --dump-dom): a chart counts as
// rendered when every data line in it has a laid-out, non-empty bounding box.
(function () {
  var charts = document.querySelectorAll("svg.chart"), rendered = 0;
  charts.forEach(function (c) {
    var lines = c.querySelectorAll("polyline.series"), drawn = 0;
    lines.forEach(function (l) { var b = l.getBBox(); if (b.width > 0) drawn++; });
    if (lines.length > 0 && drawn === lines.length) rendered++;
  });
  document.body.setAttribute("data-charts", charts.length);
  document.body.setAttribute("data-charts-rendered", rendered);
})();
</script>
</body></html>
)";
  const std::string html_path = dir + "/report.html", json_path = dir + "/report.json";
  {
    std::ofstream out(html_path);
    out << html.str();
    if (!out) {
      std::cerr << "pacerctl: report: cannot write '" << html_path << "'" << std::endl;
      return kExitFailed;
    }
  }
  {
    std::ofstream out(json_path);
    out << report.dump(2) << "\n";
    if (!out) {
      std::cerr << "pacerctl: report: cannot write '" << json_path << "'" << std::endl;
      return kExitFailed;
    }
  }
  summary["html"] = html_path;
  summary["json"] = json_path;
  View v{summary, verdict + "\nreport: " + html_path + "\n", ""};
  std::cout << Render(v, format);
  return kExitOk;
}

}  // namespace pacer::ctl
