#!/usr/bin/env python3
"""ctest pacerctl_table: pacerctl as an operator uses it, against a real pacerd on loopback
with a real job (a pacer-agent supervising two pacer-train-mlp workers, no all-reduce):
  - every command with -o json prints one JSON document; every number is a JSON number (no
    "journal_seq": "0"); -o yaml parses to the same document; -o table and -o wide work;
  - --version on every binary prints the same version string;
  - PACER_ADDR is honoured (and --addr wins over it), PACER_TOKEN_FILE too;
  - --watch streams documents until SIGINT, then exits 0;
  - bad usage exits 2; a missing or wrong token exits 4 naming where the token comes from;
  - a stopped pacerd gives "cannot reach pacerd at ADDR: connection refused — is it running?
    (--addr, PACER_ADDR)" and exit 3.
  pacerctl_table_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pacerctl_support import Checks, start_pacerd  # noqa: E402  (puts tests/python on sys.path)
from pacerd_fixture import Children, wait_for  # noqa: E402

try:
    import yaml
except ImportError:  # python3-yaml: the YAML checks are skipped without it
    yaml = None

BINARIES = ["pacerd", "pacerctl", "pacer-agent", "pacer-ps", "pacer-sim", "pacer-policy",
            "pacer-consume", "pacer-ledger-check", "pacer-train-mlp", "pacer-train-ctr"]
NUMERIC = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")


def numeric_strings(doc, path=""):
    """Paths of string values that are numbers in disguise."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += numeric_strings(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += numeric_strings(v, f"{path}[{i}]")
    elif isinstance(doc, str) and NUMERIC.match(doc):
        out.append(f"{path}={doc!r}")
    return out


def main():
    bin_dir, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    ctl = os.path.join(bin_dir, "pacerctl")
    c = Checks()
    procs = Children()
    tmp_root = os.environ.get("TEST_TMPDIR")
    with tempfile.TemporaryDirectory(prefix="pacerctl-table-", dir=tmp_root) as tmp:
        try:
            return run(c, procs, bin_dir, src, ctl, tmp)
        finally:
            procs.close()


def run(c, procs, bin_dir, src, ctl, tmp):
    # --version everywhere: one version string.
    versions = {}
    for b in BINARIES:
        p = subprocess.run([os.path.join(bin_dir, b), "--version"], capture_output=True, text=True,
                           timeout=30)
        line = p.stdout.strip()
        ok = p.returncode == 0 and line.startswith(b + " ") and re.search(r"\d+\.\d+\.\d+", line)
        c.expect(bool(ok), f"{b} --version: exit 0 and '{b} X.Y.Z...' (got rc {p.returncode}, {line!r})")
        versions[b] = line[len(b) + 1:]
    # The project version is one for all; the git part can differ in a dev tree where CMake
    # reconfigured (a new commit) and only some binaries were relinked since.
    c.expect(len({v.split(" ")[0] for v in versions.values()}) == 1,
             f"one project version in every binary ({set(versions.values())})")

    pacerd, addr, data = start_pacerd(procs, bin_dir, tmp, os.path.join(src, "policies", "demo-none.yaml"))
    env = dict(os.environ)
    env.pop("PACER_ADDR", None)
    env.pop("PACER_TOKEN_FILE", None)
    env.pop("PACER_ADMIN_TOKEN", None)

    def pctl(*args, extra_env=None, timeout=30):
        e = dict(env)
        e.update(extra_env or {})
        return subprocess.run([ctl, *args], capture_output=True, text=True, timeout=timeout,
                              env=e, cwd=tmp)

    base = ["--addr", addr, "--data-dir", data]
    # A job: one agent, two workers that train alone (no collective), a lot of data.
    trainer = [os.path.join(bin_dir, "pacer-train-mlp"), "--collective", "none",
               "--register-records", "2000000", "--shard-size", "2000", "--batch", "32",
               "--hidden", "8", "--step-ms", "5", "--eval-records", "100"]
    procs.start([os.path.join(bin_dir, "pacer-agent"), "--addr", addr, "--token-file",
                 os.path.join(data, "job.token"), "--node", "n0", "--workers", "2",
                 "--world-size", "2", "--heartbeat-ms", "300", "--metrics-ms", "300",
                 "--restart-scope", "worker", "--", *trainer], log_path=os.path.join(tmp, "agent.log"))

    def workers_reporting():
        p = pctl(*base, "workers", "-o", "json")
        return p.returncode == 0 and len(json.loads(p.stdout)["workers"]) == 2
    wait_for(workers_reporting, 60, "two workers reporting to the monitor", period_s=0.2)
    wait_for(lambda: json.loads(pctl(*base, "agents", "-o", "json").stdout)["agents"], 30, "the agent")

    policy_file = os.path.join(src, "policies", "demo-none.yaml")
    reads = [["status"], ["workers"], ["agents"], ["actions"], ["datasets"], ["policy", "show"]]
    for cmd in reads:
        name = " ".join(cmd)
        p = pctl(*base, *cmd, "-o", "json")
        c.expect(p.returncode == 0, f"{name} -o json: exit 0 ({p.stderr.strip()})")
        try:
            doc = json.loads(p.stdout)
        except ValueError as e:
            c.expect(False, f"{name} -o json parses ({e})")
            continue
        c.expect(isinstance(doc, dict) and doc, f"{name} -o json: one non-empty JSON object")
        bad = numeric_strings(doc)
        c.expect(not bad, f"{name} -o json: every number is a JSON number {bad[:5]}")
        if yaml:
            y = pctl(*base, *cmd, "-o", "yaml")
            c.expect(y.returncode == 0 and yaml.safe_load(y.stdout) is not None,
                     f"{name} -o yaml: exit 0 and parses")
        for fmt in ("table", "wide"):
            t = pctl(*base, *cmd, "-o", fmt)
            c.expect(t.returncode == 0 and t.stdout.strip(), f"{name} -o {fmt}: exit 0, prints")
    # Typed fields where protobuf's printer wrote strings.
    ds = json.loads(pctl(*base, "datasets", "-o", "json").stdout)
    c.expect(isinstance(ds["journal_seq"], int) and ds["journal_seq"] > 0, "datasets: journal_seq is an integer")
    c.expect(all(isinstance(d["records_done_total"], int) for d in ds["datasets"]), "datasets: records_done_total integers")
    ws = json.loads(pctl(*base, "workers", "-o", "json").stdout)
    c.expect(all(isinstance(w["reports"], int) and isinstance(w["last_report_ms"], int) for w in ws["workers"]),
             "workers: reports and last_report_ms integers")
    st = json.loads(pctl(*base, "status", "-o", "json").stdout)
    c.expect(st["workers"]["count"] == 2 and st["agents"]["count"] == 1 and "policy" in st and "plan" in st,
             f"status: workers, agents, policy and plan ({st.get('workers')}, {st.get('agents')})")
    pol = json.loads(pctl(*base, "policy", "show", "-o", "json").stdout)
    c.expect(pol.get("name") == "demo-baseline-none" and pol["detection"]["window_s"] == 0.5,
             "policy show: the policy in force, fields typed and nested as in the file")
    legacy = json.loads(pctl(*base, "--json", "datasets").stdout)  # the demo's and scripts' flag
    c.expect(legacy.keys() == ds.keys() and isinstance(legacy["journal_seq"], int), "--json is -o json")

    # Mutating commands with -o json.
    for cmd in (["checkpoint", "save", "t1"], ["checkpoint", "restore", "t1"],
                ["policy", "validate", policy_file], ["policy", "apply", policy_file],
                ["contention", "w0", "off"], ["report", "--out", os.path.join(tmp, "report")]):
        p = pctl(*base, *cmd, "-o", "json", timeout=60)
        ok = p.returncode == 0
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            doc, ok = None, False
        c.expect(ok and isinstance(doc, dict) and not numeric_strings(doc),
                 f"{' '.join(cmd[:2])} -o json: exit 0, JSON, numbers as numbers ({p.stderr.strip()})")

    # The environment.
    p = pctl("--data-dir", data, "status", "-o", "json", extra_env={"PACER_ADDR": addr})
    c.expect(p.returncode == 0 and json.loads(p.stdout)["addr"] == addr, "PACER_ADDR honoured")
    p = pctl(*base, "status", "-o", "json", extra_env={"PACER_ADDR": "127.0.0.1:1"})
    c.expect(p.returncode == 0 and json.loads(p.stdout)["addr"] == addr, "--addr wins over PACER_ADDR")
    p = pctl("--addr", addr, "datasets", "-o", "json",
             extra_env={"PACER_TOKEN_FILE": os.path.join(data, "admin.token")})
    c.expect(p.returncode == 0, f"PACER_TOKEN_FILE honoured ({p.stderr.strip()})")
    p = pctl("--addr", addr, "datasets")  # cwd has no pacer-data/admin.token
    c.expect(p.returncode == 4 and "PACER_TOKEN_FILE" in p.stderr,
             f"no token: exit 4 naming PACER_TOKEN_FILE (rc {p.returncode}, {p.stderr.strip()})")
    p = pctl("--addr", addr, "datasets", extra_env={"PACER_ADMIN_TOKEN": "0" * 64})
    c.expect(p.returncode == 4 and "refused the token" in p.stderr,
             f"a wrong token: exit 4, 'refused the token' (rc {p.returncode}, {p.stderr.strip()})")
    p = pctl(*base, "status", "-o", "xml")
    c.expect(p.returncode == 2 and "-o must be" in p.stderr, f"-o xml: exit 2 ({p.stderr.strip()})")
    p = pctl(*base, "frobnicate")
    c.expect(p.returncode == 2 and "unknown command" in p.stderr, "unknown command: exit 2")
    p = pctl(*base, "checkpoint", "save", "t2", "--watch")
    c.expect(p.returncode == 2, "--watch on a command that changes something: exit 2")

    # --watch: a stream of JSON documents until SIGINT.
    w = subprocess.Popen([ctl, *base, "status", "--watch", "--interval", "0.2", "-o", "json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    lines = []
    deadline = time.monotonic() + 30
    while len(lines) < 2 and time.monotonic() < deadline:
        r, _, _ = select.select([w.stdout], [], [], 1.0)
        if r:
            line = w.stdout.readline()
            if not line:
                break
            lines.append(line)
    w.send_signal(signal.SIGINT)
    try:
        rc = w.wait(timeout=10)
    except subprocess.TimeoutExpired:
        w.kill()
        rc = w.wait()
    docs = [json.loads(x) for x in lines if x.strip()]
    c.expect(len(docs) == 2 and all(d["addr"] == addr for d in docs), f"--watch -o json: one document per line ({len(docs)})")
    c.expect(rc == 0, f"--watch stops on SIGINT with exit 0 (rc {rc})")

    # A stopped pacerd.
    procs.stop(pacerd)
    p = pctl(*base, "status")
    want = f"cannot reach pacerd at {addr}: connection refused — is it running? (--addr, PACER_ADDR)"
    c.expect(p.returncode == 3 and want in p.stderr,
             f"stopped pacerd: exit 3 and '{want}' (rc {p.returncode}, {p.stderr.strip()})")
    p = pctl(*base, "status", "--timeout", "0.1", "-o", "json")
    c.expect(p.returncode == 3 and not p.stdout, "stopped pacerd, -o json: exit 3, nothing on stdout")
    return c.result()


if __name__ == "__main__":
    sys.exit(main())
