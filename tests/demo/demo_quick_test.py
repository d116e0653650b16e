#!/usr/bin/env python3
"""ctest demo_quick: runs the shortened demo (--quick --json) in its own temp dir and asserts
the properties the demo exists to show -- not its timings, which a loaded 2-core machine
cannot promise:
  - the straggler was flagged by the monitor under both policies, after the contention began;
  - the mitigated run executed an ADJUST_BS plan that gave the straggler the smallest batch;
  - in both runs every record was counted done exactly once (sharding service count ==
    expected, ledgers: none twice, none missing), and the model learned (accuracy > 0.5);
  - the summary has the documented fields and a verdict line; no duration is negative;
    report.html shows the verdict, has readable axes (>= 4 x ticks per chart) and renders its
    charts in headless Chromium (skipped when Chromium is absent);
  - no process of the run is left behind.
  demo_quick_test.py DEMO_PY BIN_DIR [CHECK_REPORT_PY]
"""
import html
import json
import os
import re
import subprocess
import sys
import tempfile

from procs import procs_naming


def leftovers(out_dir):
    return procs_naming(out_dir, "demo_quick_test")


def main():
    demo, bin_dir = sys.argv[1], sys.argv[2]
    check = sys.argv[3] if len(sys.argv) > 3 else None
    failures = []

    def expect(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="pacer-demo-test-") as tmp:
        out = os.path.join(tmp, "out")
        p = subprocess.run([sys.executable, demo, "--quick", "--json", "--live", "lines",
                            "--bin", bin_dir, "--out", out], capture_output=True, text=True,
                           timeout=280)
        sys.stderr.write(p.stderr[-6000:])
        expect(p.returncode == 0, f"demo exits 0 (got {p.returncode})")
        if p.returncode != 0:
            return 1
        s = json.loads(p.stdout)
        for k in ("jct_s", "speedup", "bound_jct_s", "detect_s", "actions", "records_expected",
                  "records_done", "records_duplicated", "accuracy"):
            expect(k in s, f"summary has '{k}'")
        runs = s["runs"]
        expect(len(runs) == 2 and runs[0]["policy"] == "none", "two runs, 'none' first")
        for r in runs:
            name = r["policy"]
            expect(r["jct_s"] and r["jct_s"] > 0, f"{name}: job time measured")
            expect(r["detect_s"] is not None and r["detect_s"] >= -1.0,
                   f"{name}: straggler flagged after the contention began (detect_s {r['detect_s']})")
            expect(r["records_done"] == r["records_expected"],
                   f"{name}: records done {r['records_done']} == expected {r['records_expected']}")
            expect(r["records_duplicated"] == 0 and r["records_missing"] == 0 and r["exactly_once"],
                   f"{name}: ledgers: none counted twice, none missing")
            expect(r["accuracy"] is not None and r["accuracy"] > 0.5, f"{name}: accuracy {r['accuracy']} > 0.5")
        none, mit = runs
        expect(not [a for a in none["actions"] if a["outcome"] == "executed"], "none: no action executed")
        plans = [a for a in mit["actions"] if a["kind"] == "ADJUST_BS" and a["outcome"] == "executed"]
        expect(len(plans) >= 1, "mitigated: an ADJUST_BS plan was executed")
        # The speed plan the controller converged on (the last one; not the membership plans at
        # the end of the data, when finished workers drop out; an early plan may come from the
        # first noisy windows): the straggler gets the smallest local batch (m x k).
        strag = s["straggler"]
        speed_plans = [a for a in plans if not (a["reason"] or "").startswith("workers or global batch")]
        expect(len(speed_plans) >= 1, "mitigated: a speed-proportional plan was executed")
        if speed_plans:
            batches = {w: int(m) * int(k) for w, m, k in
                       re.findall(r"(\w+)=(\d+)x(\d+)", speed_plans[-1]["detail"] or "")}
            expect(batches and batches.get(strag) == min(batches.values()) and
                   batches[strag] < max(batches.values()),
                   f"mitigated: the last speed plan gives the straggler {strag} the smallest batch ({batches})")
        expect(s["records_duplicated"] == 0 and s["records_done"] == s["records_expected"],
               "summary: exactly once")
        # The report tells the truth plainly: a verdict line, no negative duration, readable axes.
        expect(isinstance(s.get("verdict"), str) and len(s["verdict"]) > 20, f"summary: a verdict ({s.get('verdict')!r})")
        durations = ("jct_s", "contention_s", "detect_s", "plan_s", "after_plan_s", "bound_jct_s", "last_5pct_s")
        negative = [f"{r['policy']}.{k}={r[k]}" for r in runs for k in durations if r.get(k) is not None and r[k] < 0]
        expect(not negative, f"no negative durations {negative}")
        report = os.path.join(out, "report.html")
        expect(os.path.exists(report), "report.html written")
        if os.path.exists(report):
            with open(report) as f:
                page = f.read()
            expect(f'id="verdict">{html.escape(s.get("verdict") or "")}<' in page, "report.html: the verdict line")
            ticks = [len(re.findall(r'class="xtick"', c)) for c in re.findall(r'<svg.*?</svg>', page, re.S)]
            expect(ticks and min(ticks) >= 4, f"report.html: every chart has >= 4 x ticks ({ticks})")
            expect(not re.search(r"<td>-\d", page), "report.html: no negative figure in the tables")
        if check and os.path.exists(report):
            c = subprocess.run([sys.executable, check, report, "--screenshot",
                                os.path.join(tmp, "report.png")], capture_output=True, text=True,
                               timeout=200)
            print(c.stdout.strip())
            expect(c.returncode in (0, 77), "report.html renders its charts in headless Chromium")
        left = leftovers(out)
        expect(not left, f"no process of the run left behind {left}")
    print("PASS" if not failures else f"{len(failures)} FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
