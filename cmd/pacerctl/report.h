// pacerctl report --out DIR: an HTML report of the job from pacerd's own history — the
// timeline pacerd samples once per monitor window (Operator.GetTimeline: records done, Σ v_i,
// per-worker speed, class and batch), the monitor's detections and the controller's audit
// trail (ListActions) — for any job, running or finished, not only the demo's.
//
// Writes DIR/report.html (self-contained: inline SVG, no network) and DIR/report.json (the
// same figures). The page follows the demo report's conventions (svg.chart, polyline.series,
// the data-charts self-check on <body>), so tests/demo/check_report.py checks both in headless
// Chromium.
#pragma once

#include <string>

#include "cmd/pacerctl/commands.h"

namespace pacer::ctl {

// Exit code (dial.h); prints where the files went (or, -o json, the report's summary).
int WriteReport(const Client& c, const std::string& dir, Format format);

}  // namespace pacer::ctl
