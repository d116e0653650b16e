#!/usr/bin/env python3
"""ctest demo_ps_quick: runs the shortened parameter-server demo (--mode ps --quick --json) in
its own temp dir and asserts the properties the demo exists to show -- not its timings or its
speed-up, which a loaded 2-core machine cannot promise (and which, for an asynchronous job, are
small: docs/demo.md):
  - both runs (policy none, then the non-dedicated preset) finished: every worker wrote its
    result and the job time was measured;
  - in both runs every record was counted done exactly once (sharding service count ==
    expected; ledgers: none counted twice, none missing);
  - the model learned: every worker's held-out AUC reached the demo's target;
  - the monitor flagged the straggler under both policies, after the contention began;
  - the controller acted only in the mitigated run, through the sharding service (REALLOCATE)
    or the agent (RESTART), and never under `none`;
  - the summary has the documented fields and report.html was written;
  - no process of the run is left behind.
  demo_ps_quick_test.py DEMO_PY BIN_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from procs import procs_naming


def main():
    demo, bin_dir = sys.argv[1], sys.argv[2]
    failures = []

    def expect(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="pacer-demo-ps-test-") as tmp:
        out = os.path.join(tmp, "out")
        p = subprocess.run([sys.executable, demo, "--mode", "ps", "--quick", "--json", "--live", "lines",
                            "--bin", bin_dir, "--out", out], capture_output=True, text=True,
                           timeout=200)
        sys.stderr.write(p.stderr[-6000:])
        expect(p.returncode == 0, f"demo exits 0 (got {p.returncode})")
        left = procs_naming(out, "demo_ps_quick_test")
        expect(not left, f"no process of the run left behind {left}")
        if p.returncode != 0:
            return 1
        s = json.loads(p.stdout)
        expect(s.get("mode") == "ps", "summary is of mode ps")
        for k in ("jct_s", "speedup", "bound_jct_s", "detect_s", "actions", "records_expected",
                  "records_done", "records_duplicated", "accuracy", "auc", "auc_target",
                  "all_runs_finished", "all_runs_exactly_once"):
            expect(k in s, f"summary has '{k}'")
        runs = s["runs"]
        expect(len(runs) == 2 and runs[0]["policy"] == "none" and runs[1]["policy"] == "non-dedicated",
               "two runs: 'none', then 'non-dedicated'")
        for r in runs:
            name = r["policy"]
            expect(r["jct_s"] and r["jct_s"] > 0 and r["workers_finished"] == 4,
                   f"{name}: finished (job time {r['jct_s']}, {r['workers_finished']} of 4 results)")
            expect(r["records_done"] == r["records_expected"],
                   f"{name}: records done {r['records_done']} == expected {r['records_expected']}")
            expect(r["records_duplicated"] == 0 and r["records_missing"] == 0 and r["exactly_once"],
                   f"{name}: ledgers: none counted twice ({r['records_duplicated']}), "
                   f"none missing ({r['records_missing']})")
            expect(r["auc_target_reached"] and r["auc"] >= r["auc_target"],
                   f"{name}: held-out AUC {r['auc']} >= target {r['auc_target']} on every worker")
            expect(r["detect_s"] is not None and r["detect_s"] >= -1.0,
                   f"{name}: straggler {s['straggler']} flagged after the contention began "
                   f"(detect_s {r['detect_s']})")
        none, mit = runs
        expect(not [a for a in none["actions"] if a["outcome"] == "executed"], "none: no action executed")
        acted = [a for a in mit["actions"] if a["outcome"] == "executed"
                 and a["kind"] in ("REALLOCATE", "RESTART")]
        expect(len(acted) >= 1, "non-dedicated: a REALLOCATE or RESTART was executed")
        expect(all(a["dispatch"] and "failed" not in a["dispatch"] for a in acted),
               f"non-dedicated: every executed action was dispatched ({[a['dispatch'] for a in acted]})")
        expect(s["all_runs_finished"] and s["all_runs_exactly_once"], "summary: finished, exactly once")
        expect(os.path.exists(os.path.join(out, "report.html")), "report.html written")
    print("PASS" if not failures else f"{len(failures)} FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
