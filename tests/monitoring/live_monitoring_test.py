#!/usr/bin/env python3
"""Pacer's metrics, dashboard and alert rules against a live job and a real Prometheus.

    live_monitoring_test.py SOURCE_DIR metrics      promtool check metrics on a live pacerd
    live_monitoring_test.py SOURCE_DIR prometheus   a real Prometheus server scrapes it

Both start the same job on loopback: a real pacerd (gRPC and /metrics on ports the OS picks)
with the demo-dedicated policy (0.5 s windows) and three pacer-train-mlp workers, w2 four times
slower than the others, so the monitor flags a straggler and the controller plans for it.

`metrics`: once the monitor has closed windows, /metrics must pass `promtool check metrics`
with no finding, and every family it exports must be in docs/metrics.md's tables with the same
type and help text (those tables are the declared lists: metrics_doc_test), so nothing is
exported undeclared.

`prometheus`: Debian's prometheus server on a free loopback port (prometheus cannot take port
0: a free port is picked and the start retried when another process took it meanwhile),
scraping pacerd every second and loading deploy/monitoring/pacer-alerts.yml. Every PromQL
expression of deploy/monitoring/pacer-dashboard.json (panels, annotations, the instance
variable) and every rule Prometheus loaded is evaluated through the HTTP API: it must be
accepted, return a vector, and return data -- for an alert or annotation, its condition with
each comparison made a `bool` one, so that "no straggler now" still shows the series are
there -- with the labels its legend or annotations use. Every rule must evaluate without error.

Exits 77 (skipped) only when promtool / prometheus is not installed (scripts/install-deps.sh
installs Debian's `prometheus` package, so CI runs it). Every process started is reaped.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SKIP = 77
DEADLINE_S = 40  # for the job to show what the checks need (normally a few seconds)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


class Procs:
    """Child processes, each in its own process group, killed and reaped at exit."""

    def __init__(self):
        self.procs = []

    def start(self, argv, log_path, **kw):
        log = open(log_path, "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        log.close()
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def wait_for(what, cond, timeout=DEADLINE_S, poll=0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(poll)  # polling a condition with a deadline, not synchronisation by sleep
    fail("timed out after %d s waiting for %s" % (timeout, what))


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        return None, ""


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def start_job(procs, tmp, src, bin_dir):
    data = os.path.join(tmp, "data")
    port_file = os.path.join(tmp, "port.json")
    pacerd_log = os.path.join(tmp, "pacerd.log")
    procs.start([os.path.join(bin_dir, "pacerd"), "--data-dir", data, "--listen", "127.0.0.1:0",
                 "--metrics-listen", "127.0.0.1:0", "--port-file", port_file,
                 "--policy", os.path.join(src, "policies", "demo-dedicated.yaml")], pacerd_log)

    def ports():
        try:
            with open(port_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None
    p = wait_for("pacerd's port file (log:\n%s)" % tail(pacerd_log), ports, timeout=20)
    addr = "127.0.0.1:%d" % p["port"]
    for i, step_ms in enumerate([10, 10, 40]):
        procs.start([os.path.join(bin_dir, "pacer-train-mlp"), "--addr", addr, "--token-file",
                     os.path.join(data, "job.token"), "--worker-id", "w%d" % i, "--collective", "none",
                     "--register-records", "2000000", "--batch", "8", "--step-ms", str(step_ms),
                     "--epochs", "10"], os.path.join(tmp, "w%d.log" % i))
    return p["metrics_port"], pacerd_log


def scrape(metrics_port):
    status, text = http_get("http://127.0.0.1:%d/metrics" % metrics_port)
    return text if status == 200 else ""


def sample(text, series):
    m = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def job_ready(metrics_port):
    """The monitor closed windows on all three workers and flagged w2."""
    t = scrape(metrics_port)
    windows = sample(t, "pacer_monitor_windows_closed_total") or 0
    w2 = sample(t, 'pacer_monitor_worker_class{worker="w2"}')
    others = [sample(t, 'pacer_monitor_worker_class{worker="w%d"}' % i) for i in (0, 1)]
    if windows >= 3 and w2 == 2 and all(c is not None for c in others):
        return t
    return None


def documented_metrics(src):
    """name -> (type, help) from docs/metrics.md's generated tables."""
    out = {}
    with open(os.path.join(src, "docs", "metrics.md")) as f:
        for line in f:
            m = re.match(r"^\| `((?:pacer|exposer)_[a-z0-9_]+)` \| (counter|gauge|histogram|summary) \| [^|]* \| (.*) \|$", line.rstrip("\n"))
            if m:
                out[m.group(1)] = (m.group(2), m.group(3).replace("\\|", "|"))
    if not out:
        fail("no metric table found in docs/metrics.md")
    return out


def check_metrics(src, metrics_port):
    wait_for("the monitor to close windows and flag w2 (a straggler)", lambda: job_ready(metrics_port))

    def planned():
        t = scrape(metrics_port)
        executed = sample(t, 'pacer_controller_actions_total{kind="ADJUST_BS",outcome="executed"}') or 0
        version = sample(t, "pacer_controller_plan_version") or 0
        w2 = sample(t, 'pacer_controller_plan_worker_batch_samples{worker="w2"}')
        return t if executed >= 1 and version >= 1 and w2 is not None else None
    # The controller's series follow its decisions: the plan for the straggler is counted.
    text = wait_for("the controller to plan for w2 (pacer_controller_* series)", planned)
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    findings = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or findings:
        fail("promtool check metrics (exit %d):\n%s" % (r.returncode, findings))
    families = {}
    for m in re.finditer(r"^# HELP (\S+) (.*)$", text, re.M):
        families[m.group(1)] = {"help": m.group(2).replace("\\\\", "\\")}
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        families.setdefault(m.group(1), {})["type"] = m.group(2)
    docs = documented_metrics(src)
    for name, f in sorted(families.items()):
        if name not in docs:
            fail("%s is exported but not declared in a metric list / docs/metrics.md" % name)
        if docs[name][0] != f.get("type"):
            fail("%s: exported as a %s, documented as a %s" % (name, f.get("type"), docs[name][0]))
        if docs[name][1] != f.get("help"):
            fail("%s: exported help %r differs from the declared %r" % (name, f.get("help"), docs[name][1]))
    # The series an operator needs, on the live job.
    for series in ['pacer_sharding_records_done_total{dataset="train"}',
                   'pacer_sharding_leases_active{dataset="train"}',
                   'pacer_controller_actions_total{kind="ADJUST_BS",outcome="executed"}',
                   "pacer_monitor_job_throughput_samples_per_second",
                   "pacer_monitor_job_balanced_bound_samples_per_second",
                   'pacer_journal_fsync_seconds_count{journal="sharding"}',
                   'pacer_journal_healthy{journal="controller"}',
                   'pacer_sharding_oldest_lease_age_seconds{dataset="train"}']:
        if sample(text, series) is None:
            fail("no series %s in /metrics" % series)
    if sample(text, 'pacer_journal_fsync_seconds_count{journal="sharding"}') <= 0:
        fail("the journal fsync histogram counted no write")
    print("promtool check metrics: clean on %d families (%d lines); every family documented"
          % (len(families), text.count("\n")))


# ---- Prometheus -------------------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_prometheus(procs, tmp, src, metrics_port):
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "rule_files:\n  - %s\n"
                "scrape_configs:\n  - job_name: pacerd\n    static_configs:\n"
                "      - targets: ['127.0.0.1:%d']\n"
                % (os.path.join(src, "deploy", "monitoring", "pacer-alerts.yml"), metrics_port))
    for attempt in range(5):
        port = free_port()
        log = os.path.join(tmp, "prometheus-%d.log" % attempt)
        p = procs.start(["prometheus", "--config.file=" + config,
                         "--storage.tsdb.path=" + os.path.join(tmp, "tsdb-%d" % attempt),
                         "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"], log)
        base = "http://127.0.0.1:%d" % port

        def ready():
            if p.poll() is not None:
                return "exited"
            return "ready" if http_get(base + "/-/ready")[0] == 200 else None
        state = wait_for("prometheus to be ready (log:\n%s)" % tail(log), ready, timeout=30)
        if state == "ready":
            return base
        if "address already in use" not in tail(log):
            fail("prometheus exited:\n" + tail(log))
        # another process took the port between our probe and prometheus' bind: try another
    fail("prometheus could not bind a free port in 5 attempts")


def query(base, expr):
    status, body = http_get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {"status": "error", "error": body[:200]}
    if status != 200 or doc.get("status") != "success":
        return None, doc.get("error", "HTTP %s" % status)
    return doc["data"], None


def with_bool(expr):
    """The expression with every comparison (outside label matchers and strings) made `bool`."""
    out, depth, quote, i = [], 0, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < len(expr):
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = None
            i += 1
            continue
        if c in "\"'`":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            m = re.match(r"(==|!=|>=|<=|>|<)", expr[i:])
            if m:
                op = m.group(1)
                rest = expr[i + len(op):]
                out.append(op)
                i += len(op)
                if not re.match(r"\s*bool\b", rest):
                    out.append(" bool")
                continue
        out.append(c)
        i += 1
    return "".join(out)


GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m", "$instance": ".*"}


def substitute(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return expr


def check_expression(base, where, expr, labels_used):
    data, err = query(base, expr)
    if err:
        fail("%s: %r refused by Prometheus: %s" % (where, expr, err))
    if data["resultType"] not in ("vector", "scalar"):
        fail("%s: %r returns a %s, not an instant vector" % (where, expr, data["resultType"]))
    probe = with_bool(expr)
    pdata, err = query(base, probe)
    if err:
        fail("%s: %r refused by Prometheus: %s" % (where, probe, err))
    result = data["result"] if data["result"] else pdata["result"]
    if data["resultType"] == "vector" and not result:
        fail("%s: %r (and %r) returned no data" % (where, expr, probe))
    for series in result if data["resultType"] == "vector" else []:
        missing = [l for l in labels_used if l not in series["metric"]]
        if missing:
            fail("%s: %r returned %s without the label(s) %s its legend / annotations use"
                 % (where, expr, series["metric"], missing))
    return len(result) if data["resultType"] == "vector" else 1


def legend_labels(fmt):
    return [l for l in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", fmt or "")]


def dashboard_expressions(src):
    with open(os.path.join(src, "deploy", "monitoring", "pacer-dashboard.json")) as f:
        dash = json.load(f)
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            out.append(("panel '%s' %s" % (panel["title"], t["refId"]), t["expr"], legend_labels(t.get("legendFormat"))))
    for a in dash["annotations"]["list"]:
        if "expr" in a:
            used = legend_labels(a.get("titleFormat")) + legend_labels(a.get("textFormat"))
            used += [k for k in a.get("tagKeys", "").split(",") if k]
            out.append(("annotation '%s'" % a["name"], a["expr"], used))
    variables = []
    for v in dash["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            variables.append((v["name"], q["query"]))
    return out, variables


def check_prometheus(procs, tmp, src, metrics_port):
    wait_for("the monitor to flag w2", lambda: job_ready(metrics_port))
    base = start_prometheus(procs, tmp, src, metrics_port)

    def scraped():
        d, _ = query(base, 'count_over_time(pacer_pacerd_start_time_seconds{job="pacerd"}[1m])')
        w, _ = query(base, "pacer_monitor_worker_class")
        return d and d["result"] and float(d["result"][0]["value"][1]) >= 4 and w and len(w["result"]) == 3
    wait_for("prometheus to scrape pacerd 4 times", scraped)

    def rules():
        status, body = http_get(base + "/api/v1/rules")
        if status != 200:
            return None
        groups = json.loads(body)["data"]["groups"]
        rs = [r for g in groups for r in g["rules"]]
        return rs if rs and all(r.get("lastEvaluation", "").startswith("20") and
                                not r["lastEvaluation"].startswith("0001") for r in rs) else None
    loaded = wait_for("every rule to be evaluated", rules)
    checked = 0
    exprs, variables = dashboard_expressions(src)
    for where, expr, used in exprs:
        n = check_expression(base, where, substitute(expr), used)
        print("  ok %-55s %3d series" % (where[:55], n))
        checked += 1
    for name, q in variables:
        m = re.match(r"label_values\((\w+),\s*(\w+)\)", q)
        if not m:
            fail("variable %s: query %r is not label_values(metric, label)" % (name, q))
        status, body = http_get(base + "/api/v1/label/%s/values?%s" % (
            m.group(2), urllib.parse.urlencode({"match[]": m.group(1)})))
        if status != 200 or not json.loads(body)["data"]:
            fail("variable %s: %r has no values" % (name, q))
        print("  ok variable %-46s %3d values" % (name, len(json.loads(body)["data"])))
        checked += 1
    for r in loaded:
        if r.get("health") != "ok" or r.get("lastError"):
            fail("rule %s: health %s, error %r" % (r.get("name"), r.get("health"), r.get("lastError")))
        used = []
        for text in r.get("annotations", {}).values():
            used += re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", text)
        n = check_expression(base, "rule '%s'" % r["name"], r["query"], used)
        print("  ok rule %-50s %3d series" % (r["name"][:50], n))
        checked += 1
    print("prometheus: %d dashboard and rule expressions return data of the expected shape" % checked)


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("metrics", "prometheus"):
        print(__doc__)
        return 2
    src, mode = sys.argv[1], sys.argv[2]
    need = ["promtool"] + (["prometheus"] if mode == "prometheus" else [])
    missing = [b for b in need if shutil.which(b) is None]
    if missing:
        print("SKIP: %s not installed (Debian package 'prometheus'; scripts/install-deps.sh "
              "installs it)" % ", ".join(missing))
        return SKIP
    bin_dir = os.environ.get("PACER_BIN_DIR") or fail("PACER_BIN_DIR is not set")
    tmp = tempfile.mkdtemp(prefix="monitoring-", dir=os.environ.get("TEST_TMPDIR"))
    procs = Procs()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # ctest's timeout: reap on the way out
    started = time.monotonic()
    try:
        metrics_port, pacerd_log = start_job(procs, tmp, src, bin_dir)
        if mode == "metrics":
            check_metrics(src, metrics_port)
        else:
            check_prometheus(procs, tmp, src, metrics_port)
    except SystemExit:
        for name in sorted(os.listdir(tmp)):
            if name.endswith(".log"):
                print("---- %s (last lines; kept in %s)\n%s" % (name, tmp, tail(os.path.join(tmp, name), 15)))
        raise
    finally:
        procs.stop_all()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS in %.1f s" % (time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
