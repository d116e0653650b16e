#!/usr/bin/env python3
"""ctest pacerctl_report: `pacerctl report --out DIR` on a job that is not the demo — three
pacer-train-mlp workers training alone (no all-reduce, no agent) against a real pacerd, w1
three times slower — while it runs and after it finished:
  - report.html and report.json are written; the timeline has samples of all three workers,
    the monitor's detection of w1 as a straggler, a one-line verdict naming the bound and w1;
  - no negative throughput or time; every chart has at least 4 labelled x ticks;
  - report.html renders its charts in headless Chromium (tests/demo/check_report.py; exit 77,
    skipped, when Chromium is absent and everything else passed).
  pacerctl_report_test.py BIN_DIR SOURCE_DIR CHECK_REPORT_PY
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pacerctl_support import Checks, start_pacerd  # noqa: E402  (puts tests/python on sys.path)
from pacerd_fixture import Children, wait_for  # noqa: E402


def check_report(c, out, label, check_py, tmp):
    html_path, json_path = os.path.join(out, "report.html"), os.path.join(out, "report.json")
    if not c.expect(os.path.exists(html_path) and os.path.exists(json_path), f"{label}: report.html and report.json written"):
        return None
    with open(json_path) as f:
        r = json.load(f)
    s = r["summary"]
    samples = r["samples"]
    c.expect(len(samples) >= 3, f"{label}: at least 3 timeline samples ({len(samples)})")
    c.expect(all(set(x.get("workers", {})) >= {"w0", "w1", "w2"} for x in samples[1:]),
             f"{label}: the samples carry the workers' speeds")
    c.expect(any(d["id"] == "w1" and d["current"] == "straggler" for d in r["detections"]),
             f"{label}: the detection of w1 as a straggler is in the history")
    c.expect(all(x["t_s"] >= 0 and x.get("throughput", 0) >= 0 for x in samples),
             f"{label}: no negative time or throughput")
    c.expect("balanced bound" in s["verdict"] and "w1" in s["verdict"] and 0 < s["throughput_vs_bound"] <= 1.5,
             f"{label}: verdict names the bound and the straggler: {s['verdict']!r}")
    with open(html_path) as f:
        page = f.read()
    c.expect(s["verdict"].replace("&", "&amp;") in page, f"{label}: the page shows the verdict")
    charts = re.findall(r"<svg class=\"chart\".*?</svg>", page, re.S)
    ticks = [len(re.findall(r'class="xtick"', ch)) for ch in charts]
    c.expect(len(charts) == 3 and min(ticks) >= 4, f"{label}: 3 charts with >= 4 x ticks each ({ticks})")
    p = subprocess.run([sys.executable, check_py, html_path, "--screenshot", os.path.join(tmp, label + ".png")],
                       capture_output=True, text=True, timeout=200)
    print(p.stdout.strip())
    c.expect(p.returncode in (0, 77), f"{label}: report.html renders in headless Chromium")
    return p.returncode


def main():
    bin_dir, src, check_py = (os.path.abspath(a) for a in sys.argv[1:4])
    c = Checks()
    procs = Children()
    with tempfile.TemporaryDirectory(prefix="pacerctl-report-", dir=os.environ.get("TEST_TMPDIR")) as tmp:
        try:
            _, addr, data = start_pacerd(procs, bin_dir, tmp, os.path.join(src, "policies", "demo-none.yaml"))
            token = os.path.join(data, "job.token")
            workers = []
            for w in range(3):
                env = dict(os.environ, PACER_ADDR=addr, PACER_WORKER_ID=f"w{w}")
                workers.append(procs.start([
                    os.path.join(bin_dir, "pacer-train-mlp"), "--token-file", token, "--collective", "none",
                    "--register-records", "60000", "--shard-size", "1000", "--batch", "32", "--hidden", "8",
                    "--eval-records", "100", "--step-ms", "30" if w == 1 else "8"],
                    env=env, log_path=os.path.join(tmp, f"w{w}.log")))
            ctl = [os.path.join(bin_dir, "pacerctl"), "--addr", addr, "--data-dir", data]

            def w1_flagged():
                p = subprocess.run([*ctl, "workers", "-o", "json"], capture_output=True, text=True, timeout=30)
                ws = {w["id"]: w for w in json.loads(p.stdout)["workers"]} if p.returncode == 0 else {}
                return ws.get("w1", {}).get("classification", {}).get("worker_class") == "WORKER_CLASS_STRAGGLER"
            wait_for(w1_flagged, 60, "the monitor to flag w1", period_s=0.2)
            # Three samples at least (one per monitor window): a report of the running job.
            def report_with_samples(out=os.path.join(tmp, "running")):
                p = subprocess.run([*ctl, "report", "--out", out, "-o", "json"], capture_output=True,
                                   text=True, timeout=30)
                return p.returncode == 0 and json.loads(p.stdout)["samples"] >= 3
            wait_for(report_with_samples, 30, "three timeline samples", period_s=0.3)
            rc_running = check_report(c, os.path.join(tmp, "running"), "running", check_py, tmp)
            for w in workers:
                wait_for(lambda w=w: w.poll() is not None, 120, "the workers to finish", period_s=0.2)
            c.expect(all(w.returncode == 0 for w in workers), f"workers exit 0 ({[w.returncode for w in workers]})")
            p = subprocess.run([*ctl, "report", "--out", os.path.join(tmp, "finished")], capture_output=True,
                               text=True, timeout=30)
            c.expect(p.returncode == 0 and "report.html" in p.stdout, f"report of the finished job: exit 0 ({p.stderr.strip()})")
            rc_finished = check_report(c, os.path.join(tmp, "finished"), "finished", check_py, tmp)
        finally:
            procs.close()
    rc = c.result()
    if rc == 0 and 77 in (rc_running, rc_finished):
        print("SKIP: the Chromium part (install chromium: scripts/install-deps.sh --chromium)")
        return 77
    return rc


if __name__ == "__main__":
    sys.exit(main())
