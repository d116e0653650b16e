#!/usr/bin/env python3
"""Flag validation, as a table: every numeric flag a user can get wrong, on every binary, is
refused at start with exit 2 and a one-line message that names the flag. Nothing is served, no
file is written, nothing wraps (an unsigned "-1" is not 2^64 - 1) and nothing aborts.

Usage: flag_table_test.py BIN_DIR
"""
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]

# (binary, extra args, expected substring of stderr). Each row gets a fresh temp dir as its cwd.
ROWS = [
    # pacerd
    ("pacerd", ["--heartbeat-interval-ms", "-1"], "--heartbeat-interval-ms"),
    ("pacerd", ["--heartbeat-interval-ms", "0"], "--heartbeat-interval-ms"),
    ("pacerd", ["--reconcile-interval-ms", "-1"], "--reconcile-interval-ms"),
    ("pacerd", ["--lease-timeout-ms", "0"], "--lease-timeout-ms"),
    ("pacerd", ["--worker-timeout-ms", "-5"], "--worker-timeout-ms"),
    ("pacerd", ["--snapshot-every", "-1"], "--snapshot-every"),
    ("pacerd", ["--snapshot-every", "0"], "--snapshot-every"),
    ("pacerd", ["--restart-cost-s", "nan"], "--restart-cost-s"),
    ("pacerd", ["--restart-cost-s", "-5"], "--restart-cost-s"),
    ("pacerd", ["--restart-cost-s", "inf"], "--restart-cost-s"),
    ("pacerd", ["--tls-client-ca", "ca.pem"], "--tls-client-ca"),
    ("pacerd", ["--port-file", "/nonexistent/dir/p"], "--port-file"),
    ("pacerd", ["--tls-reload-s", "0"], "--tls-reload-s"),
    ("pacerd", ["--max-files", "0"], "--max-files"),
    ("pacerd", ["--max-workers", "70000"], "--max-workers"),
    ("pacerd", ["--max-dataset-bytes", "1000"], "--max-dataset-bytes"),
    ("pacerd", ["--max-datasets", "-1"], "--max-datasets"),
    # pacer-agent
    ("pacer-agent", ["--workers", "-1", "--", "true"], "--workers"),
    ("pacer-agent", ["--workers", "0", "--", "true"], "--workers"),
    ("pacer-agent", ["--worker-credentials", "maybe", "--", "true"], "--worker-credentials"),
    ("pacer-agent", ["--max-restarts", "-1", "--", "true"], "--max-restarts"),
    ("pacer-agent", ["--master-port", "70000", "--", "true"], "--master-port"),
    # pacer-consume
    ("pacer-consume", ["--register-records", "-1"], "--register-records"),
    ("pacer-consume", ["--epochs", "-1"], "--epochs"),
    ("pacer-consume", ["--batch", "0"], "--batch"),
    ("pacer-consume", ["--step-ms", "nan"], "--step-ms"),
    ("pacer-consume", ["--step-ms", "-3"], "--step-ms"),
    ("pacer-consume", ["--shard-size", "-10"], "--shard-size"),
    # pacer-sim
    ("pacer-sim", ["--scenario", "/dev/zero"], "larger than 1 MiB"),
    ("pacer-sim", ["--scenario", "two-docs.yaml"], "only one YAML document"),
    ("pacer-sim", ["--scenario", "ok.yaml", "--threads", "-1"], "--threads"),
    ("pacer-sim", ["--scenario", "ok.yaml", "--max-wall-s", "0"], "--max-wall-s"),
    ("pacer-sim", ["--scenario", "ok.yaml", "--max-wall-s", "nan"], "--max-wall-s"),
    # pacer-ps
    ("pacer-ps", ["--max-keys-per-request", "-1"], "--max-keys-per-request"),
    ("pacer-ps", ["--insecure-no-auth", "--tls-client-ca", "ca.pem"], "--tls-client-ca"),
    # pacerctl
    ("pacerctl", ["--timeout", "nan", "status"], "--timeout"),
]

OK_SCENARIO = """\
name: tiny
seed: 1
job: {mode: sync, workers: 4, workers_per_node: 2, global_batch: 64, total_samples: 6400,
      sync_cost_s: 0.02, restart_cost_s: 10, batch_cap: 64}
speeds: {median: 400, sigma: 0.05}
noise: 0.05
events: []
"""


def main():
    failures = []
    ran = 0
    for binary, args, expect in ROWS:
        path = os.path.join(BIN, binary)
        if not os.path.exists(path):
            failures.append(f"{binary}: not built at {path}")
            continue
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as cwd:
            with open(os.path.join(cwd, "two-docs.yaml"), "w") as f:
                f.write(OK_SCENARIO + "---\n" + OK_SCENARIO)
            with open(os.path.join(cwd, "ok.yaml"), "w") as f:
                f.write(OK_SCENARIO)
            env = dict(os.environ)
            for k in list(env):
                if k.startswith("PACER_"):
                    del env[k]
            try:
                p = subprocess.run([path] + args, cwd=cwd, env=env, capture_output=True, text=True,
                                   timeout=30)
            except subprocess.TimeoutExpired:
                failures.append(f"{binary} {' '.join(args)}: still running after 30 s (accepted?)")
                continue
            ran += 1
            line = (p.stderr.strip().splitlines() or [""])[-1]
            if expect is None:
                if p.returncode == 0:
                    failures.append(f"{binary} {' '.join(args)}: exit 0")
                continue
            if p.returncode != 2 or expect not in p.stderr:
                failures.append(f"{binary} {' '.join(args)}: exit {p.returncode}, stderr {p.stderr.strip()[-300:]!r}"
                                f" (want exit 2 naming {expect!r})")
            elif "terminate called" in p.stderr or "Aborted" in p.stderr:
                failures.append(f"{binary} {' '.join(args)}: aborted: {line}")
            leftover = sorted(set(os.listdir(cwd)) - {"two-docs.yaml", "ok.yaml"})
            if leftover:
                failures.append(f"{binary} {' '.join(args)}: wrote {leftover} although refused")
            print(f"ok   {binary:14s} {' '.join(args):48s} -> {line[:100]}")
    # pacer-sim's wall-clock limit holds: a large scenario is given up (exit 4) soon after it.
    large = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sim", "scenarios",
                         "large-mixed.yaml")
    p = subprocess.run([os.path.join(BIN, "pacer-sim"), "--scenario", large, "--max-wall-s", "1",
                        "--threads", "1"], capture_output=True, text=True, timeout=60)
    if p.returncode != 4 or "--max-wall-s" not in p.stderr:
        failures.append(f"pacer-sim --max-wall-s 1 on {large}: exit {p.returncode}, {p.stderr[-300:]!r}")
    else:
        print(f"ok   pacer-sim      --max-wall-s 1 on large-mixed.yaml -> exit 4: {p.stderr.strip()[:100]}")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"\n{ran} rows: every bad flag refused with exit 2 naming the flag")
    return 0


if __name__ == "__main__":
    sys.exit(main())
