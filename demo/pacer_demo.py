#!/usr/bin/env python3
"""pacer-demo: Pacer beats a real straggler, end to end, on one machine.

Runs the same job twice -- first under the `none` policy (observe only), then under a mitigating
preset -- with only real parts: pacerd with its RocksDB journal, two pacer-agent processes with
two workers each, all on loopback. Two modes:
  --mode allreduce (default): pacer-train-mlp workers (Gloo all-reduce, world size 4), the
      AntDT-DD preset (speed-proportional batches, ADJUST_BS);
  --mode ps: two pacer-ps parameter servers and pacer-train-ctr workers (asynchronous sparse CTR
      training), the AntDT-ND preset (speed-weighted shards and tail backups, REALLOCATE, and
      RESTART when the cost model says it pays).
After a warm-up the demo turns on the agent's contention switch for one worker (`pacerctl
contention`: a cgroup v1 CPU quota where it is writable, else a pinned busy process), so the
straggler is real CPU starvation, not a sleep.

While a run goes, one live line per phase shows progress, throughput and who is flagged. At
the end: a summary table (job time of both runs, speed-up, the balanced bound, time to detect,
actions and why, accuracy, records expected / done / duplicated), `report.html` (inline SVG
charts; no network) and, with --json, the same summary as JSON on stdout.

Everything it learns comes from the control plane's own answers (`pacerctl --json datasets |
workers | actions`), the trainers' result files and their exactly-once ledgers
(`pacer-ledger-check`). Every process it starts leads its own process group and is stopped
(SIGTERM, then SIGKILL) on exit, on error and on SIGINT / SIGTERM / SIGHUP.

Why Python (standard library only) and not C++: the demo is orchestration and reporting --
starting processes, polling `pacerctl --json`, writing HTML/SVG. It adds no control-plane
logic, needs no compile step, and reading it shows exactly what an operator would run.
"""

import argparse
import html
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

WORLD = 4
NODES = (("n0", 0), ("n1", 2))  # (node, first rank): two agents, two workers each
STRAGGLER_CLASS = "WORKER_CLASS_STRAGGLER"


class Stop(Exception):
    """Raised by the signal handler: unwinds to the cleanup in main()."""


# ----------------------------------------------------------------------------------------------
# Processes: each leads its own process group; all are stopped by Processes.stop_all().


class Processes:
    def __init__(self):
        self.procs = []  # (name, Popen)

    def spawn(self, name, argv, log_path, env=None):
        log = open(log_path, "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
        log.close()
        self.procs.append((name, p))
        return p

    @staticmethod
    def _signal_group(p, sig):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, p, grace_s=5.0):
        """SIGTERM to the group, SIGKILL after grace_s; reaps."""
        if p.poll() is None:
            self._signal_group(p, signal.SIGTERM)
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(p, signal.SIGKILL)  # stragglers left in the group
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self):
        # Agents first (they stop their workers: SIGTERM, SIGKILL after their grace), pacerd last.
        for name, p in self.procs:
            if name.startswith("agent"):
                self.stop(p)
        for name, p in self.procs:
            if name != "pacerd":
                self.stop(p)
        for name, p in self.procs:
            self.stop(p)
        self.procs = []


OUR_BINARIES = ("pacerd", "pacer-agent", "pacer-train-mlp", "pacer-train-ctr", "pacer-ps", "pacerctl",
                "pacer-ledger-check")
TRAINER = {"allreduce": "pacer-train-mlp", "ps": "pacer-train-ctr"}
# What the mitigated run's controller does about the straggler, per mode.
MITIGATIONS = {"allreduce": ("ADJUST_BS",), "ps": ("REALLOCATE", "RESTART", "MIGRATE")}
PS_SERVERS = 2
# --mode ps job (pacer-train-ctr): records per epoch (full / --quick), shard size, batch.
PS_DEFAULTS = {"records": 300000, "records_quick": 100000, "shard_size": 4096, "batch": 256, "hidden": 1024,
               "warmup_fraction": 0.15, "straggler_cores": 0.15}


def kill_leftovers(run_dir):
    """SIGKILLs any of our binaries whose command line names this run's directory (a worker
    that left its group, say). The path is unique to this run and the program must be one the
    demo starts, so nothing else is touched (not a `timeout` or shell wrapping the demo)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        prog = os.path.basename(argv[0].decode(errors="replace"))
        if prog in OUR_BINARIES and run_dir in b" ".join(argv).decode(errors="replace"):
            found.append(int(pid))
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    return found


def wait_for(predicate, timeout_s, what, period_s=0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(period_s)


# ----------------------------------------------------------------------------------------------
# One run of the job under one policy.


class Run:
    def __init__(self, args, label, policy_file, run_dir, procs, live):
        self.args, self.label, self.policy_file = args, label, policy_file
        self.dir, self.procs, self.live = run_dir, procs, live
        self.data = os.path.join(run_dir, "data")
        self.addr = None
        self.samples = []      # {t, done, workers: {id: {speed, cls, batch}}, sum_speed}
        self.actions = []
        self.contention_t = None  # seconds since launch when the agent applied it
        self.detect_t = None      # when the monitor flagged the straggler (its class_since)
        self.plan_t = None        # first executed mitigation (ADJUST_BS; ps: REALLOCATE, RESTART)
        self.ps_addrs = []
        self.jct_s = None
        self.results = []
        self.ledger = {}
        self.dataset = {}

    def ctl(self, *cmd, timeout=15):
        out = subprocess.run([self.args.bin + "/pacerctl", "--addr", self.addr, "--data-dir",
                              self.data, "--json", *cmd], capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"pacerctl {' '.join(cmd)}: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def start(self):
        a = self.args
        os.makedirs(self.data)
        port_file = os.path.join(self.dir, "port.json")
        self.procs.spawn("pacerd", [
            a.bin + "/pacerd", "--data-dir", self.data, "--listen", "127.0.0.1:0",
            "--metrics-listen", "127.0.0.1:0", "--port-file", port_file,
            "--policy", self.policy_file, "--job-mode", "async" if a.mode == "ps" else "sync",
            # The sync demo's workers heartbeat every 0.25 s: the straggler's running step (its
            # compute so far) reaches the monitor's 0.5 s windows fresh (docs/demo.md, item 7).
            "--heartbeat-interval-ms", "500" if a.mode == "ps" else "250",
            "--reconcile-interval-ms", "1000",
        ], os.path.join(self.dir, "pacerd.log"))
        wait_for(lambda: os.path.exists(port_file), 30, "pacerd to listen")
        with open(port_file) as f:
            self.addr = "127.0.0.1:%d" % json.load(f)["port"]
        if a.mode == "ps":
            trainer = self.start_ps()
        else:
            trainer = self.mlp_trainer()
        self.t0 = time.monotonic()
        self.t0_unix_ms = time.time() * 1000
        for node, first in NODES:
            self.procs.spawn("agent-" + node, [
                a.bin + "/pacer-agent", "--addr", self.addr, "--token-file",
                os.path.join(self.data, "job.token"), "--node", node, "--workers", "2",
                "--first-rank", str(first), "--world-size", str(WORLD), "--heartbeat-ms", "500",
                "--metrics-ms", "500", "--max-restarts", "0",
                # async workers restart alone; a synchronous group restarts together (the default)
                "--restart-scope", "worker" if a.mode == "ps" else "group",
                "--worker-cpu-limit", str(a.worker_cores), "--", *trainer,
            ], os.path.join(self.dir, f"agent-{node}.log"))

    def start_ps(self):
        """Starts the parameter servers (they check the job token pacerd wrote) and returns
        the CTR trainer's command line."""
        a = self.args
        token = os.path.join(self.data, "job.token")
        wait_for(lambda: os.path.exists(token), 30, "pacerd's job token")
        for i in range(PS_SERVERS):
            port_file = os.path.join(self.dir, f"ps{i}.port")
            p = self.procs.spawn(f"ps{i}", [
                a.bin + "/pacer-ps", "--server-id", f"ps{i}", "--listen", "127.0.0.1:0",
                "--token-file", token, "--port-file", port_file,
            ], os.path.join(self.dir, f"ps{i}.log"))

            def ready(port_file=port_file, p=p):
                if p.poll() is not None:
                    raise RuntimeError(f"pacer-ps ps{i} exited with {p.returncode} (log in {self.dir})")
                try:
                    with open(port_file) as f:
                        return json.load(f).get("port")
                except (OSError, ValueError):
                    return None
            self.ps_addrs.append("127.0.0.1:%d" % wait_for(ready, 30, f"pacer-ps ps{i} to listen"))
        return [
            a.bin + "/pacer-train-ctr", "--ps", ",".join(self.ps_addrs),
            "--register-records", str(a.records), "--epochs", str(a.epochs),
            "--shard-size", str(a.shard_size), "--batch", str(a.batch), "--hidden", str(a.hidden),
            "--result-file", os.path.join(self.dir, "result-{worker_id}.json"),
            "--ledger", os.path.join(self.dir, "ledger-{worker_id}"),
        ]

    def mlp_trainer(self):
        a = self.args
        return [
            a.bin + "/pacer-train-mlp", "--store-dir", os.path.join(self.dir, "gloo"),
            "--rank", "{rank}", "--world-size", str(WORLD),
            "--register-records", str(a.records), "--epochs", str(a.epochs),
            "--shard-size", str(a.shard_size), "--batch", str(a.batch), "--hidden", str(a.hidden),
            "--result-file", os.path.join(self.dir, "result-{worker_id}.json"),
            "--ledger", os.path.join(self.dir, "ledger-{worker_id}"),
        ]

    def now(self):
        return time.monotonic() - self.t0

    def unix_ms_to_t(self, ms):
        return (float(ms) - self.t0_unix_ms) / 1000.0

    def agents_running(self):
        return [p for n, p in self.procs.procs if n.startswith("agent") and p.poll() is None]

    def poll(self):
        ds = self.ctl("datasets").get("datasets", [])
        done = sum(int(d.get("records_done_total", 0)) for d in ds)
        ws = self.ctl("workers")
        workers = {}
        for w in ws.get("workers", []):
            workers[w["id"]] = {
                "speed": float(w.get("speed", 0)),
                "cls": w.get("classification", {}).get("worker_class", ""),
                "persistence": w.get("classification", {}).get("persistence", ""),
                "since": float(w.get("class_since_ms", 0) or 0),
                "batch": int(w.get("local_batch", 0)),
                # step-time breakdown of the last closed window (profile: where the time goes)
                "compute_s": float(w.get("compute_s", 0)), "comm_s": float(w.get("comm_s", 0)),
                "data_wait_s": float(w.get("data_wait_s", 0)), "wall_s": float(w.get("wall_s", 0)),
            }
        s = {"t": self.now(), "done": done, "workers": workers,
             "sum_speed": sum(w["speed"] for w in workers.values())}
        self.samples.append(s)
        if ds:
            self.dataset = ds[0]
        return s

    def throughput_at(self, i):
        """Records/s between sample i-1 and i (sharding service counts)."""
        if i == 0:
            return 0.0
        a, b = self.samples[i - 1], self.samples[i]
        return (b["done"] - a["done"]) / max(b["t"] - a["t"], 1e-6)

    def print_live(self, final=False):
        if not self.samples:
            return
        s = self.samples[-1]
        expected = self.args.records * self.args.epochs
        frac = min(1.0, s["done"] / expected)
        bar = "#" * int(frac * 24) + "." * (24 - int(frac * 24))
        # throughput over the last ~3 s
        j = len(self.samples) - 1
        k = max(0, j - 3)
        a = self.samples[k]
        tput = (s["done"] - a["done"]) / max(s["t"] - a["t"], 1e-6) if j > k else 0.0
        flagged = [f"{w}" + ("*" if v["persistence"] == "PERSISTENCE_PERSISTENT" else "")
                   for w, v in sorted(s["workers"].items()) if v["cls"] == STRAGGLER_CLASS]
        if self.args.mode == "ps":
            per_worker = "speeds " + "/".join(f"{v['speed']:.0f}" for _, v in sorted(s["workers"].items()))
        else:
            per_worker = "batches " + "/".join(str(v["batch"]) for _, v in sorted(s["workers"].items()))
        phase = ("contention on " + self.args.straggler) if self.contention_t is not None else "warm-up"
        if self.plan_t is not None:
            phase = "plan applied" if self.args.mode == "allreduce" else "reallocated"
        line = (f"[{self.label:>13}] {bar} {100 * frac:5.1f}% {s['t']:5.1f}s {tput:7.0f} rec/s "
                f"| {phase:<22} | flagged: {','.join(flagged) or '-':<6} | {per_worker}")
        if self.live == "tty":
            sys.stderr.write("\r" + line[:160].ljust(160) + ("\n" if final else ""))
            sys.stderr.flush()
        elif self.live == "lines" and (final or len(self.samples) % 2 == 0):
            sys.stderr.write(line + "\n")

    def note(self, msg):
        if self.live == "tty":
            sys.stderr.write("\r" + " " * 160 + "\r")
        if self.live != "off":
            sys.stderr.write(f"[{self.label:>13}] {self.now():5.1f}s {msg}\n")

    def watch(self):
        a = self.args
        expected = a.records * a.epochs
        deadline = self.t0 + a.run_timeout_s
        next_poll = 0.0
        while self.agents_running():
            if time.monotonic() > deadline:
                raise RuntimeError(f"run '{self.label}' did not finish in {a.run_timeout_s} s")
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + a.poll_s
                try:
                    s = self.poll()
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                    self.note(f"poll: {e}")
                    continue
                if (self.contention_t is None and s["done"] >= a.warmup_fraction * expected
                        and len(s["workers"]) == WORLD):
                    self.apply_contention()
                if self.contention_t is not None and self.detect_t is None:
                    w = s["workers"].get(a.straggler, {})
                    if w.get("cls") == STRAGGLER_CLASS:
                        since = self.unix_ms_to_t(w["since"]) if w.get("since") else s["t"]
                        if since >= self.contention_t:
                            self.detect_t = since
                        elif w.get("persistence") == "PERSISTENCE_PERSISTENT":
                            # Flagged (by noise) before the contention and still flagged: count
                            # the first poll that sees it persistent, a conservative time.
                            self.detect_t = s["t"]
                    if self.detect_t is not None:
                        self.note(f"monitor flags {a.straggler} as a straggler "
                                  f"{self.detect_t - self.contention_t:.1f} s after the contention began")
                if self.contention_t is not None and self.plan_t is None and len(self.samples) % 2 == 0:
                    self.refresh_actions()
                self.print_live()
            time.sleep(0.05)  # a loop period: agents' exit is noticed within 50 ms
        self.jct_s = self.now()
        for _, p in self.procs.procs:
            if p.poll() is not None and p.returncode not in (0, None):
                raise RuntimeError(f"run '{self.label}': a process exited with {p.returncode} "
                                   f"(logs in {self.dir})")
        self.poll()  # after the end: what it counts was done by jct_s (see crossing_time)
        self.refresh_actions()
        self.print_live(final=True)
        with open(os.path.join(self.dir, "samples.json"), "w") as f:  # the time series, for profiles
            json.dump(self.samples, f)

    def trainer_pid(self, worker):
        """The pid of this run's trainer `worker` (its command line holds the run folder and
        the result file the agent named after it)."""
        tag = os.path.join(self.dir, f"result-{worker}.json")
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if os.path.basename(argv[0].decode(errors="replace")) == TRAINER[self.args.mode] and \
                    tag.encode() in argv:
                return int(pid)
        return None

    @staticmethod
    def cpu_seconds(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def contention_factor(self):
        """--contention-factor, or with --straggler-cores C the factor that leaves the worker
        C cores. Under a worker CPU limit L (--worker-cores) the agent's quota is L / factor,
        so the factor is L / C: exactly C cores in both runs, whatever the background load.
        Without a limit the agent's quota is (the CPU the worker used lately) / factor, and what
        a worker uses on a shared 2-core machine swings with the background load, so a fixed
        factor would give the two runs different stragglers: measured here over 1 s (at
        least 2x slower)."""
        a = self.args
        if not a.straggler_cores:
            return a.contention_factor
        if a.worker_cores > 0:
            return round(min(100.0, max(1.01, a.worker_cores / a.straggler_cores)), 4)
        pid = self.trainer_pid(a.straggler)
        if pid is None:
            return a.contention_factor
        try:
            c0, t0 = self.cpu_seconds(pid), time.monotonic()
            time.sleep(1.0)  # a measurement interval, not synchronisation
            used = (self.cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        except (OSError, ValueError, IndexError):
            return a.contention_factor
        return round(min(100.0, max(2.0, used / a.straggler_cores)), 2)

    def apply_contention(self):
        a = self.args
        factor = self.contention_factor()
        try:
            r = self.ctl("contention", a.straggler, str(factor), timeout=30)
        except RuntimeError as e:
            if not self.agents_running() or self.trainer_pid(a.straggler) is None:
                raise RuntimeError(f"{e} -- {a.straggler} had already finished: the job is too short "
                                   f"for the warm-up (--records, --warmup-fraction)") from None
            raise
        if r.get("state") != "done":
            raise RuntimeError(f"contention on {a.straggler} not applied: {r}")
        # The agent applies the command as soon as a heartbeat reply carries it (delivered_ms);
        # its acknowledgement rides the next heartbeat, up to one interval later.
        start_ms = r.get("delivered_ms") or r.get("acked_ms")
        self.contention_t = self.unix_ms_to_t(start_ms) if start_ms else self.now()
        self.factor = factor
        self.note(f"contention x{factor:g} on {a.straggler} "
                  f"(agent's switch: cgroup CPU quota or a pinned busy process)")

    def refresh_actions(self):
        try:
            r = self.ctl("actions")
        except (RuntimeError, subprocess.TimeoutExpired, ValueError):
            return
        self.actions = sorted(r.get("actions", []), key=lambda x: int(x.get("id", 0)))
        if self.plan_t is None and self.contention_t is not None:
            for x in self.actions:
                t = self.unix_ms_to_t(x.get("time_ms", 0))
                if (x.get("kind") in MITIGATIONS[self.args.mode] and x.get("outcome") == "executed"
                        and t >= self.contention_t):
                    self.plan_t = t
                    self.note(f"controller: {x.get('kind')} -- {x.get('reason', '')}")
                    break

    def collect(self):
        """Trainer results, the contention the agent applied, and the exactly-once ledger
        check, after the run ended."""
        a = self.args
        self.quota = None
        for node, _ in NODES:
            try:
                with open(os.path.join(self.dir, f"agent-{node}.log")) as f:
                    for line in f:
                        m = re.search(r"contention on worker (\S+) .*by (\S+) \(quota ([0-9.]+) cores of ([0-9.]+)\)", line)
                        if m and m.group(1) == a.straggler:
                            self.quota = {"method": m.group(2), "cores": float(m.group(3)),
                                          "baseline_cores": float(m.group(4))}
            except OSError:
                pass
        for w in range(WORLD):
            path = os.path.join(self.dir, f"result-w{w}.json")
            if os.path.exists(path):
                with open(path) as f:
                    self.results.append(json.loads(f.readline()))
        ledgers = [os.path.join(self.dir, f"ledger-w{w}") for w in range(WORLD)]
        out = subprocess.run([a.bin + "/pacer-ledger-check", "--records", str(a.records),
                              "--epochs", str(a.epochs), *ledgers], capture_output=True, text=True)
        once = missing = twice = 0
        for m in re.finditer(r"(\d+) records counted once, (\d+) missing, (\d+) counted twice", out.stdout):
            once += int(m.group(1)); missing += int(m.group(2)); twice += int(m.group(3))
        self.ledger = {"ok": out.returncode == 0, "once": once, "missing": missing,
                       "twice": twice, "output": out.stdout.strip()}
        if a.mode == "ps":
            # pacer-ledger-check reads the ledgers together and counts a tail-backup pair once
            # (examples/consumer/ledger.h, ReadLedgers); the shard view below only reports how
            # many pairs there were and how many records both copies trained.
            pair = shard_counts(ledgers, a.records, a.epochs)
            self.ledger.update(backup_pairs=pair["backup_pairs"],
                               acked_by_both_copies=pair["acked_by_both_copies"], ledger_check_twice=twice)

    def summary(self):
        a = self.args
        expected = a.records * a.epochs
        done = int(self.dataset.get("records_done_total", 0))
        # Throughput vs the bound is measured over polls while the contention is on, up to 95 %
        # of the data (the epoch tail and shutdown are left out of both sides), starting 2 s
        # (the plan's effective step, then one monitor window) after the last batch plan that
        # leaves at least 3 s to measure -- the plan the controller converged on; the same from
        # the first plan is reported beside it. Without a plan: from the contention on.
        end_i = next((i for i, s in enumerate(self.samples) if s["done"] >= 0.95 * expected),
                     len(self.samples) - 1)
        end_t = self.samples[end_i]["t"] if self.samples else 0
        plan_ts = [self.unix_ms_to_t(x.get("time_ms", 0)) for x in self.actions
                   if x.get("kind") in MITIGATIONS[a.mode] and x.get("outcome") == "executed"
                   and self.contention_t is not None
                   and self.unix_ms_to_t(x.get("time_ms", 0)) >= self.contention_t]
        settle = 2.0

        def measure(start):
            win = [i for i, s in enumerate(self.samples)
                   if start is not None and s["t"] >= start and i <= end_i]
            if len(win) < 2:
                return None, None
            s0, s1 = self.samples[win[0]], self.samples[win[-1]]
            tput = (s1["done"] - s0["done"]) / max(s1["t"] - s0["t"], 1e-6)
            bound = sum(self.samples[i]["sum_speed"] for i in win[1:]) / (len(win) - 1)
            return tput, bound

        def wall_bound(start):
            # Σ of each worker's own rate, samples per wall second of its steps (compute + its
            # PS pulls and push waits): what an asynchronous job reaches with no idle worker.
            win = [s for i, s in enumerate(self.samples)
                   if start is not None and s["t"] >= start and i <= end_i and s["workers"]][1:]
            per = [sum(w["speed"] * w["compute_s"] / w["wall_s"] for w in s["workers"].values() if w["wall_s"] > 0)
                   for s in win]
            return sum(per) / len(per) if per else None

        def sync_seconds(start):
            # The all-reduce itself: in each window, the worker that reached the collective last
            # waited for nobody, so its communication time is the collective's cost (the sync
            # cost of the balanced bound in the simulator's sense, docs/design.md §7).
            win = [s for i, s in enumerate(self.samples)
                   if start is not None and s["t"] >= start and i <= end_i and s["workers"]]
            per = [min(w["comm_s"] for w in s["workers"].values()) for s in win]
            return sum(per) / len(per) if per else None

        usable = [t for t in plan_ts if t + settle + 3.0 <= end_t]
        first_tput, first_bound = measure(plan_ts[0] + settle if plan_ts else None)
        start = None
        if usable:
            start = usable[-1] + settle
        elif self.contention_t is not None and not plan_ts:
            start = self.contention_t + settle
        elif plan_ts:
            start = plan_ts[0] + settle
        tput, bound = measure(start)
        sync_s = sync_seconds(start) if a.mode == "allreduce" else None
        wall_b = wall_bound(start) if a.mode == "ps" else None
        # ps: the share of a step's wall time spent pulling / waiting for pushes (Σ v_i counts
        # compute seconds only, so this is the part of the gap to the bound that is PS traffic).
        ps_comm = [w["comm_s"] / w["wall_s"] for s in self.samples
                   if start is not None and start <= s["t"] <= end_t
                   for w in s["workers"].values() if w["wall_s"] > 0]
        ps_comm_share = sum(ps_comm) / len(ps_comm) if a.mode == "ps" and ps_comm else None
        global_batch = a.batch * WORLD
        # Σ v_i with the measured all-reduce time added to every perfectly balanced step.
        bound_sync = (global_batch / (global_batch / bound + sync_s)) if bound and sync_s is not None else None
        # Balanced bound of the job time: the same warm-up, then from the moment the contention
        # began the job at throughput Σ v_i (perfect balance at the measured speeds).
        bound_jct = None
        if self.contention_t is not None and bound:
            before = [s for s in self.samples if s["t"] <= self.contention_t]
            done_at = before[-1]["done"] if before else 0
            bound_jct = self.contention_t + (expected - done_at) / bound
        # The job's tail: from 95 % of the records done to the end (an asynchronous job's straggler
        # costs its lost capacity and this tail: its last leases, which nobody else may take
        # without tail backups).
        # The last poll comes after the job ended: what it counts was done by the end, so the
        # tail is measured against the end (jct_s, records done then), never past it.
        before_end = [s for s in self.samples if s["t"] <= self.jct_s]
        if self.samples:
            before_end.append({"t": self.jct_s, "done": self.samples[-1]["done"]})
        t95 = crossing_time(before_end, 0.95 * expected)
        last5_s = max(0.0, self.jct_s - t95) if t95 is not None and self.jct_s else None
        acc = [r.get("accuracy", 0.0) for r in self.results]
        auc = [r["auc"] for r in self.results if "auc" in r]
        return {
            "policy": self.label, "policy_file": self.policy_file,
            "jct_s": round(self.jct_s, 2) if self.jct_s else None,
            "contention_s": round(self.contention_t, 2) if self.contention_t is not None else None,
            "contention_factor": getattr(self, "factor", None),
            "straggler_quota": getattr(self, "quota", None),
            "detect_s": round(max(0.0, self.detect_t - self.contention_t), 2)
            if self.detect_t is not None and self.contention_t is not None else None,
            "plan_s": round(max(0.0, self.plan_t - self.contention_t), 2)
            if self.plan_t is not None and self.contention_t is not None else None,
            # how long the job ran on after its first mitigation (the verdict's figure)
            "after_plan_s": round(max(0.0, self.jct_s - self.plan_t), 2)
            if self.plan_t is not None and self.jct_s else None,
            "throughput_after_plan": round(tput, 1) if tput else None,
            "bound_throughput": round(bound, 1) if bound else None,
            "throughput_vs_bound": round(tput / bound, 3) if tput and bound else None,
            "sync_s": round(sync_s, 4) if sync_s is not None else None,
            "bound_with_sync_throughput": round(bound_sync, 1) if bound_sync else None,
            "throughput_vs_bound_with_sync": round(tput / bound_sync, 3) if tput and bound_sync else None,
            "throughput_vs_bound_since_first_plan":
                round(first_tput / first_bound, 3) if first_tput and first_bound else None,
            "plans_executed": len(plan_ts),
            "bound_jct_s": round(bound_jct, 2) if bound_jct else None,
            "last_5pct_s": round(last5_s, 2) if last5_s is not None else None,
            "accuracy": round(min(acc), 4) if acc else None,
            "auc": round(min(auc), 4) if auc else None,
            "auc_target": self.args.target_auc if self.args.mode == "ps" else None,
            "auc_target_reached": (len(auc) == WORLD and min(auc) >= self.args.target_auc)
            if self.args.mode == "ps" else None,
            "ps_comm_share": round(ps_comm_share, 3) if ps_comm_share is not None else None,
            "wall_bound_throughput": round(wall_b, 1) if wall_b else None,
            "throughput_vs_wall_bound": round(tput / wall_b, 3) if tput and wall_b else None,
            "workers_finished": len(self.results),
            "records_expected": expected,
            "records_done": done,
            "records_trained": sum(int(r.get("samples", 0)) for r in self.results),
            "records_duplicated": self.ledger.get("twice"),
            # ps: pacer-ledger-check's own count (per lease, not per shard: see collect())
            "ledger_check_twice": self.ledger.get("ledger_check_twice"),
            "tail_backup_pairs": self.ledger.get("backup_pairs"),
            "acked_by_both_backup_copies": self.ledger.get("acked_by_both_copies"),
            "records_missing": self.ledger.get("missing"),
            "exactly_once": self.ledger.get("ok"),
            "final_batches": {r["worker"]: r.get("final_batch") for r in self.results},
            # records each trainer process trained (a restarted worker: its last process only)
            "records_per_worker": {r["worker"]: int(r.get("samples", 0)) for r in self.results},
            "actions": [{
                "t_s": round(self.unix_ms_to_t(x.get("time_ms", 0)), 2), "kind": x.get("kind"),
                "target": x.get("target"), "outcome": x.get("outcome"), "reason": x.get("reason"),
                "detail": x.get("detail"), "predicted_gain": x.get("predicted_gain"),
                "measured_gain": x.get("measured_gain") if x.get("measured") else None,
                "veto_reason": x.get("veto_reason"), "dispatch": x.get("dispatch"),
            } for x in self.actions],
        }


def crossing_time(samples, level):
    """When the records done first reached `level`: interpolated between the two polls around
    it (polls are a second apart; the quick demo's tail is shorter than that)."""
    prev = None
    for s in samples:
        if s["done"] >= level:
            if prev is None or s["done"] <= prev["done"]:
                return s["t"]
            f = (level - prev["done"]) / (s["done"] - prev["done"])
            return prev["t"] + f * (s["t"] - prev["t"])
        prev = s
    return None


def shard_counts(ledgers, records, epochs):
    """Tail backups in the trainers' ledgers (examples/consumer/ledger.h: an `L` line with
    `backup=1` is a lease handed out as the tail backup of another): how many there were and how
    many records the backups acknowledged. Informational only: exactly-once is
    pacer-ledger-check's verdict, which pairs each backup with its primary."""
    start, done = {}, {}  # backup lease -> its starting done prefix, its highest acknowledged
    for path in ledgers:
        try:
            with open(path) as f:
                for line in f:
                    p = line.split()
                    if len(p) >= 4 and p[0] == "L" and "backup=1" in p[4:]:
                        fields = dict(x.split("=", 1) for x in p[4:] if "=" in x)
                        start[(path, p[1])] = int(fields.get("start", 0))
                    elif len(p) == 3 and p[0] == "A" and (path, p[1]) in start:
                        done[(path, p[1])] = max(done.get((path, p[1]), 0), int(p[2]))
        except (OSError, ValueError):
            continue
    acked = sum(max(0, done.get(k, 0) - s) for k, s in start.items())
    return {"backup_pairs": len(start), "acked_by_both_copies": acked}


# ----------------------------------------------------------------------------------------------
# Report: table on stdout/stderr, JSON, and report.html with inline SVG.


def summarize(args, runs):
    base, mit = runs[0].summary(), runs[-1].summary()
    out = {
        "mode": args.mode, "straggler": args.straggler, "straggler_cores": args.straggler_cores,
        "contention_factor": args.contention_factor if not args.straggler_cores else None,
        "runs": [r.summary() for r in runs],
        "jct_s": {r.label: r.summary()["jct_s"] for r in runs},
        "speedup": round(base["jct_s"] / mit["jct_s"], 3) if base["jct_s"] and mit["jct_s"] else None,
        "bound_jct_s": mit["bound_jct_s"],
        "throughput_vs_bound": mit["throughput_vs_bound"],
        "throughput_vs_bound_with_sync": mit["throughput_vs_bound_with_sync"],
        "detect_s": mit["detect_s"],
        "actions": [x for x in mit["actions"] if x["outcome"] == "executed"],
        "records_expected": mit["records_expected"],
        "records_done": mit["records_done"],
        "records_duplicated": mit["records_duplicated"],
        "accuracy": mit["accuracy"],
        "auc": mit["auc"],
        "auc_target": mit["auc_target"],
        "all_runs_finished": all(r.summary()["workers_finished"] == WORLD for r in runs),
        "all_runs_exactly_once": all(r.summary()["exactly_once"] and
                                     r.summary()["records_done"] == r.summary()["records_expected"]
                                     for r in runs),
    }
    out["verdict"] = verdict(args, out)
    return out


def verdict(args, summary):
    """One line that says what the figures show, in plain words (the report's headline)."""
    base, mit = summary["runs"][0], summary["runs"][-1]
    ps = args.mode == "ps"
    what = "reallocation" if ps else "batch plan"
    speedup = summary.get("speedup")
    longer = "" if not args.quick else (
        "; --quick shows the mechanism (the straggler flagged, a batch plan, every record trained "
        "once), not the speed-up: run without --quick for a job long enough to measure it")
    if mit.get("detect_s") is None:
        return (f"The straggler {args.straggler} was not flagged before the job ended "
                f"({fmt(mit['jct_s'])} s): nothing was mitigated{longer}.")
    if mit.get("plan_s") is None:
        noise = (f" (the speed-up of {speedup:.2f}× is run-to-run variation)"
                 if speedup is not None else "")
        return (f"{args.straggler} was flagged {fmt(mit['detect_s'])} s after the contention began, "
                f"but the job ended before a {what} was executed: nothing to gain{noise}{longer}.")
    after = mit.get("after_plan_s") or 0.0
    ran = f"The job ended {after:.1f} s after the first {what} was made"
    if after < 10.0 or (mit["jct_s"] and after < 0.25 * mit["jct_s"]):
        return (f"{ran}: too short to gain reliably (speed-up {fmt(speedup, '{:.2f}')}× in this run: "
                f"a job this short is mostly warm-up, detection and the plan's lead, and its figure "
                f"swings from run to run){longer}.")
    if speedup is not None and speedup >= 1.05:
        tail = ""
        if mit.get("throughput_vs_bound"):
            tail = f", throughput {mit['throughput_vs_bound']:.2f} of the balanced bound after it"
        return (f"Pacer finished the job {speedup:.2f}× faster ({fmt(base['jct_s'])} s → "
                f"{fmt(mit['jct_s'])} s): {args.straggler} flagged after {fmt(mit['detect_s'])} s, "
                f"the {what} {fmt(mit['plan_s'])} s after the contention began{tail}.")
    return (f"{ran}, yet the job was not faster (speed-up {fmt(speedup, '{:.2f}')}×): the "
            f"mitigation did not pay off in this run; see the actions below.")


def fmt(v, spec="{:.1f}", none="-"):
    return none if v is None else spec.format(v)


def table_rows(summary):
    runs = summary["runs"]
    ps = summary.get("mode") == "ps"
    rows = [("", *[r["policy"] for r in runs])]
    rows.append(("job time (s)", *[fmt(r["jct_s"]) for r in runs]))
    rows.append(("contention began at (s)", *[fmt(r["contention_s"]) for r in runs]))
    rows.append(("straggler's CPU (cores: quota of used)",
                 *[f"{r['straggler_quota']['cores']:.2f} of {r['straggler_quota']['baseline_cores']:.2f}"
                   if r.get("straggler_quota") else f"x{r.get('contention_factor') or '-'}" for r in runs]))
    rows.append(("straggler flagged after (s)", *[fmt(r["detect_s"]) for r in runs]))
    rows.append(("first REALLOCATE / RESTART after (s)" if ps else "batch plan decided after (s)",
                 *[fmt(r["plan_s"]) for r in runs]))
    rows.append(("throughput under contention (rec/s)", *[fmt(r["throughput_after_plan"], "{:.0f}") for r in runs]))
    rows.append(("bound Σv_i (rec/s)" if ps else "balanced bound Σv_i (rec/s)",
                 *[fmt(r["bound_throughput"], "{:.0f}") for r in runs]))
    rows.append(("throughput / bound", *[fmt(r["throughput_vs_bound"], "{:.2f}") for r in runs]))
    if ps:
        rows.append(("PS pull/push share of a step", *[fmt(r["ps_comm_share"], "{:.2f}") for r in runs]))
        rows.append(("Σ samples / wall s of the workers (rec/s)",
                     *[fmt(r["wall_bound_throughput"], "{:.0f}") for r in runs]))
        rows.append(("throughput / Σ samples per wall s", *[fmt(r["throughput_vs_wall_bound"], "{:.2f}") for r in runs]))
    else:
        rows.append(("all-reduce time per step (s)", *[fmt(r["sync_s"], "{:.3f}") for r in runs]))
        rows.append(("throughput / (bound + all-reduce)",
                     *[fmt(r["throughput_vs_bound_with_sync"], "{:.2f}") for r in runs]))
    rows.append(("bound job time (s)" if ps else "balanced-bound job time (s)",
                 *[fmt(r["bound_jct_s"]) for r in runs]))
    rows.append(("last 5 % of the records took (s)", *[fmt(r["last_5pct_s"]) for r in runs]))
    if ps:
        rows.append((f"held-out AUC (min of workers; target {summary.get('auc_target')})",
                     *[fmt(r["auc"], "{:.3f}") for r in runs]))
    rows.append(("accuracy", *[fmt(r["accuracy"], "{:.3f}") for r in runs]))
    rows.append(("records expected", *[str(r["records_expected"]) for r in runs]))
    rows.append(("records done (sharding service)", *[str(r["records_done"]) for r in runs]))
    rows.append(("records trained (trainers)", *[str(r["records_trained"]) for r in runs]))
    rows.append(("counted twice / missing (ledgers)",
                 *[f"{r['records_duplicated']} / {r['records_missing']}" for r in runs]))
    if ps:
        rows.append(("tail-backup pairs: shards / records trained by both",
                     *[f"{r['tail_backup_pairs']} / {r['records_trained'] - r['records_expected']}" for r in runs]))
    if ps:
        rows.append(("records trained per worker", *[" ".join(f"{w}:{n}" for w, n in sorted(r["records_per_worker"].items()))
                                                    for r in runs]))
    else:
        rows.append(("final local batches", *[" ".join(f"{w}:{b}" for w, b in sorted(r["final_batches"].items()))
                                             for r in runs]))
    return rows


def print_table(summary, stream):
    rows = table_rows(summary)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        stream.write("  " + "  ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)) + "\n")
    stream.write(f"\n  {summary['verdict']}\n")
    stream.write(f"  speed-up: {fmt(summary['speedup'], '{:.2f}')}x   "
                 f"({'bound' if summary.get('mode') == 'ps' else 'balanced-bound'} job time "
                 f"{fmt(summary['bound_jct_s'])} s)\n")
    stream.write("  actions of the mitigated run (pacerctl actions):\n")
    acts = [x for x in summary["runs"][-1]["actions"] if x["outcome"] == "executed"]
    held = len(summary["runs"][-1]["actions"]) - len(acts)
    if not acts:
        stream.write("    none executed\n")
    for x in acts:
        stream.write(f"    {x['t_s']:6.1f}s {x['kind']:<10} {x['outcome']:<9} {x['reason']}\n")
        if x.get("detail"):
            stream.write(f"            {x['detail']}\n")
    if held:
        stream.write(f"    (+{held} proposals held back by the safety gate: min_gain, cooldown; all in report.html)\n")


def ticks(span, target):
    """Tick values 0, s, 2s, ... up to `span` with s = 1, 2 or 5 × 10^k: about `target` of them,
    whatever the span (a 9 s quick run gets 0, 1, 2, ... not 0 and 5)."""
    if span <= 0:
        return [0]
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if raw <= m * mag)
    n = int(span / step + 1e-9)
    return [round(k * step, 10) for k in range(n + 1)]


def tick_label(v):
    return f"{v:.0f}" if v == 0 or abs(v) >= 1 else f"{v:g}"


def svg_chart(title, series, markers, x_max, y_label, width=860, height=260):
    """series: [(name, colour, [(t, y)], dashed)]; markers: [(t, label, colour)]."""
    ml, mr, mt, mb = 60, 200, 28, 36
    pw, ph = width - ml - mr, height - mt - mb
    y_max = max([y for _, _, pts, _ in series for _, y in pts] + [1.0]) * 1.1
    x_max = max(x_max, 1.0)

    def X(t):
        return ml + pw * t / x_max

    def Y(y):
        return mt + ph * (1 - y / y_max)

    e = html.escape
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="chart" role="img" aria-label="{e(title)}">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
             f'<text x="{ml}" y="18" font-size="14" font-weight="bold">{e(title)}</text>']
    for y in ticks(y_max, 5):  # grid
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{Y(y):.1f}" y2="{Y(y):.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{ml - 6}" y="{Y(y) + 4:.1f}" font-size="10" text-anchor="end">{tick_label(y)}</text>')
    for t in ticks(x_max, 8):
        parts.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#999"/>')
        parts.append(f'<text class="xtick" x="{X(t):.1f}" y="{mt + ph + 15}" font-size="10" '
                     f'text-anchor="middle">{tick_label(t)}</text>')
    parts.append(f'<text x="{ml + pw / 2}" y="{height - 4}" font-size="11" text-anchor="middle">seconds since launch</text>')
    parts.append(f'<text x="12" y="{mt + ph / 2}" font-size="11" transform="rotate(-90 12 {mt + ph / 2})" '
                 f'text-anchor="middle">{e(y_label)}</text>')
    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for k, (t, label, colour) in enumerate(sorted(markers)):
        parts.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{mt}" y2="{mt + ph}" stroke="{colour}" '
                     f'stroke-dasharray="4 3"/>')
        # labels on three staggered rows so that close markers stay readable
        parts.append(f'<text x="{X(t) + 3:.1f}" y="{mt + 10 + 11 * (k % 3)}" font-size="10" '
                     f'fill="{colour}">{e(label)}</text>')
    for i, (name, colour, pts, dashed) in enumerate(series):
        if len(pts) >= 2:
            d = " ".join(f"{X(t):.1f},{Y(y):.1f}" for t, y in pts)
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            parts.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="2"{dash} points="{d}"/>')
        ly = mt + 14 * i + 8
        parts.append(f'<line x1="{ml + pw + 10}" x2="{ml + pw + 30}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{ml + pw + 34}" y="{ly + 4}" font-size="11">{e(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def run_markers(run):
    m = []
    if run.contention_t is not None:
        m.append((run.contention_t, "contention", "#d62728"))
    if run.detect_t is not None:
        m.append((run.detect_t, "flagged", "#ff7f0e"))
    for x in run.actions:
        if x.get("outcome") == "executed":
            m.append((run.unix_ms_to_t(x.get("time_ms", 0)), x.get("kind", ""), "#2ca02c"))
    return m


def write_report(path, args, runs, summary):
    e = html.escape
    x_max = max(r.jct_s or 1 for r in runs)
    contention_text = (f"a cgroup CPU quota of about {args.straggler_cores:g} cores" if args.straggler_cores
                       else f"×{args.contention_factor:g}")
    if args.mode == "ps":
        job_text = (f"Asynchronous parameter-server training of a sparse CTR model (pacer-train-ctr, "
                    f"{PS_SERVERS} pacer-ps servers)")
    else:
        job_text = "Synchronous all-reduce MLP training (pacer-train-mlp, Gloo)"
    charts = []
    for run in runs:
        ids = sorted({w for s in run.samples for w in s["workers"]})
        series = [(w + (" (straggler)" if w == args.straggler else ""), COLOURS[i % len(COLOURS)],
                   [(s["t"], s["workers"][w]["speed"]) for s in run.samples if w in s["workers"]], False)
                  for i, w in enumerate(ids)]
        charts.append(svg_chart(f"Per-worker speed v_i (samples per compute second) — policy {run.label}",
                                series, run_markers(run), x_max, "samples / compute s"))
    tput_series = []
    for i, run in enumerate(runs):
        pts = [(run.samples[k]["t"], run.throughput_at(k)) for k in range(1, len(run.samples))]
        tput_series.append((f"throughput, {run.label}", COLOURS[i * 2 % len(COLOURS)], pts, False))
    mit = runs[-1]
    tput_series.append((f"Σ v_i bound, {mit.label}", "#7f7f7f",
                        [(s["t"], s["sum_speed"]) for s in mit.samples], True))
    charts.append(svg_chart("Job throughput (records done per second, sharding service) vs the balanced bound",
                            tput_series, run_markers(mit), x_max, "records / s"))
    rows = table_rows(summary)
    table = "<table><thead><tr>" + "".join(f"<th>{e(c)}</th>" for c in rows[0]) + "</tr></thead><tbody>"
    for r in rows[1:]:
        table += "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>"
    table += "</tbody></table>"
    acts = "<table><thead><tr><th>run</th><th>t (s)</th><th>kind</th><th>outcome</th><th>why</th><th>detail</th></tr></thead><tbody>"
    for run in runs:
        for x in run.summary()["actions"]:
            acts += (f"<tr><td>{e(run.label)}</td><td>{x['t_s']:.1f}</td><td>{e(x['kind'] or '')}</td>"
                     f"<td>{e(x['outcome'] or '')}</td><td>{e(x['reason'] or '')}</td>"
                     f"<td>{e(x['detail'] or '')}</td></tr>")
    acts += "</tbody></table>"
    headline_bound = ""
    if summary["bound_jct_s"] is not None:
        headline_bound = (f' &nbsp; {"bound" if args.mode == "ps" else "balanced bound"} '
                          f'{fmt(summary["bound_jct_s"])} s')
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Pacer demo report</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }}
table {{ border-collapse: collapse; margin: 12px 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
.big {{ font-size: 20px; }}
svg.chart {{ display: block; margin: 12px 0; border: 1px solid #eee; }}
</style></head><body>
<h1>Pacer demo: a real straggler, with and without mitigation</h1>
<p>{e(job_text)}, {WORLD} workers on two agents,
{args.records * args.epochs} records ({args.records} × {args.epochs} epochs). After
{100 * args.warmup_fraction:.0f}% of the data the agent's contention switch slowed worker
<b>{e(args.straggler)}</b> with real CPU contention ({e(contention_text)}).
Runs: {", ".join(e(r.label) for r in runs)}.</p>
<p class="big" id="verdict">{e(summary['verdict'])}</p>
<p>Speed-up <b>{fmt(summary['speedup'], '{:.2f}')}×</b> &nbsp; job time
{" vs ".join(fmt(r.jct_s) + " s" for r in runs)}{headline_bound} &nbsp; straggler flagged
{"after " + fmt(summary['detect_s']) + " s" if summary['detect_s'] is not None else "never"}.
In the table, "-" marks a figure the run ended too early to measure.</p>
<h2>Summary</h2>
{table}
<p>{"Bound" if args.mode == "ps" else "Balanced bound"}: Σ v_i, the sum of the monitor's per-worker speeds (samples per compute second)
averaged over the polls while the contention is on (after the {"last reallocation" if args.mode == "ps" else "plan"} applies, in the mitigated run).
It is the job's throughput if every worker computed all the time at its measured speed, with no
waiting. The bound job time keeps the measured warm-up and runs the rest of the data at Σ v_i.</p>
<h2>Charts</h2>
{"".join(charts)}
<h2>Actions and why (pacerctl actions)</h2>
{acts}
<p>Generated by demo/pacer_demo.py at {time.strftime("%Y-%m-%d %H:%M:%S")}.</p>
<script>
// Self-check for tests/demo/check_report.py (headless Chromium --dump-dom): a chart counts as
// rendered when every data line in it has a laid-out, non-empty bounding box.
(function () {{
  var charts = document.querySelectorAll("svg.chart"), rendered = 0;
  charts.forEach(function (c) {{
    var lines = c.querySelectorAll("polyline.series"), drawn = 0;
    lines.forEach(function (l) {{ var b = l.getBBox(); if (b.width > 0) drawn++; }});
    if (lines.length > 0 && drawn === lines.length) rendered++;
  }});
  document.body.setAttribute("data-charts", charts.length);
  document.body.setAttribute("data-charts-rendered", rendered);
}})();
</script>
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)


# ----------------------------------------------------------------------------------------------


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    p = argparse.ArgumentParser(prog="pacer-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(root, os.environ.get("BUILD_DIR", "build"), "bin"),
                   help="folder with pacerd, pacerctl, pacer-agent, pacer-ledger-check and the mode's "
                        "trainer (pacer-train-mlp; ps: pacer-train-ctr and pacer-ps)")
    p.add_argument("--out", default=os.path.join(root, "demo-out"), help="output folder (emptied first)")
    p.add_argument("--mode", default="allreduce", choices=["allreduce", "ps"],
                   help="allreduce: synchronous MLP under AntDT-DD; ps: asynchronous parameter-server "
                        "CTR training under AntDT-ND")
    p.add_argument("--policy", default=None,
                   help="policy of the mitigated run (default policies/demo-dedicated.yaml; "
                        "ps: policies/demo-non-dedicated.yaml)")
    p.add_argument("--baseline", default=os.path.join(root, "policies", "demo-none.yaml"),
                   help="policy of the unmitigated run")
    p.add_argument("--quick", action="store_true", help="a shorter job (CI)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--live", default="auto", choices=["auto", "tty", "lines", "off"])
    p.add_argument("--records", type=int, default=None,
                   help="records per epoch; default 500000 (--quick: 120000), ps: %d (--quick: %d)"
                        % (PS_DEFAULTS["records"], PS_DEFAULTS["records_quick"]))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--shard-size", type=int, default=None,
                   help="records per shard (a step fills its batch across leases; the straggler's last "
                        "lease is the job's tail); default 8192 (--quick: 2048), ps: %d" % PS_DEFAULTS["shard_size"])
    p.add_argument("--batch", type=int, default=None,
                   help="initial local batch (global = 4 x this); default 4096 (--quick: 2048), ps: %d" % PS_DEFAULTS["batch"])
    p.add_argument("--target-auc", type=float, default=0.72,
                   help="ps: held-out AUC every worker must reach (reported, not enforced by the trainer)")
    p.add_argument("--hidden", type=int, default=None,
                   help="hidden units: compute per sample (steps long enough that compute dominates); "
                        "default 1024, ps: %d (the CTR model's ReLU tower)" % PS_DEFAULTS["hidden"])
    p.add_argument("--straggler", default="w1")
    p.add_argument("--contention-factor", type=float, default=2.5,
                   help="slow-down factor when --straggler-cores is 0 (or not measurable)")
    p.add_argument("--straggler-cores", type=float, default=None,
                   help="leave the straggler this many CPU cores (cgroup quota); 0: use --contention-factor; "
                        "default 0.1 (a quarter of --worker-cores), ps: 0.15")
    p.add_argument("--worker-cores", type=float, default=0.4,
                   help="CPU limit of each worker (the agent's cgroup, like a container limit): each "
                        "worker gets its own budget, as on its own node, instead of all four sharing "
                        "two cores; 0: no limit")
    p.add_argument("--warmup-fraction", type=float, default=None,
                   help="share of the data trained before the contention begins; default 0.1 "
                        "(--quick and ps: 0.15)")
    p.add_argument("--poll-s", type=float, default=1.0, help="pacerctl polling period (each poll costs CPU the trainers share)")
    p.add_argument("--run-timeout-s", type=float, default=240)
    a = p.parse_args(argv)
    if a.mode == "ps":
        defaults = dict(PS_DEFAULTS, records=PS_DEFAULTS["records_quick" if a.quick else "records"],
                        policy=os.path.join(root, "policies", "demo-non-dedicated.yaml"))
    else:
        # The full job: long enough that the speed-up is not noise (the plan comes ~2-3 s after
        # the contention begins, the job runs on ~40 s under it); local batch 4096 so that the
        # all-reduce (~20-30 ms) is a small part of a step; 8192-record shards so that a step
        # does not wait for a lease fetch in the middle of its batch. --quick: long enough that
        # the plan lands before the job ends on a loaded 2-core machine, too short to measure a
        # speed-up (the verdict says so); 2048-sample steps, so that the 1 s monitor windows
        # see several steps each.
        if a.quick:
            defaults = dict(records=120000, shard_size=2048, batch=2048, warmup_fraction=0.15)
        else:
            defaults = dict(records=500000, shard_size=8192, batch=4096, warmup_fraction=0.1)
        defaults.update(hidden=1024, straggler_cores=0.1,
                        policy=os.path.join(root, "policies", "demo-dedicated.yaml"))
    for k in ("records", "shard_size", "batch", "hidden", "policy", "warmup_fraction", "straggler_cores"):
        if getattr(a, k) is None:
            setattr(a, k, defaults[k])
    for k in ("records", "epochs", "shard_size", "batch"):
        if getattr(a, k) <= 0:
            p.error(f"--{k.replace('_', '-')} must be > 0, not {getattr(a, k)}")
    for f in (a.policy, a.baseline):
        if not os.path.isfile(f):
            p.error(f"policy file {f} does not exist")
    return a


def main(argv):
    args = parse_args(argv)
    needed = ["pacerd", "pacerctl", "pacer-agent", TRAINER[args.mode], "pacer-ledger-check"]
    if args.mode == "ps":
        needed.append("pacer-ps")
    for b in needed:
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            print(f"pacer-demo: {args.bin}/{b} missing: build it first (scripts/build.sh)", file=sys.stderr)
            return 1
    live = args.live
    if live == "auto":
        live = "tty" if sys.stderr.isatty() else "lines"
    args.out = os.path.abspath(args.out)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    with open(os.path.join(args.out, "demo.pid"), "w") as f:  # for tests that interrupt the demo
        f.write(str(os.getpid()))

    procs = Processes()

    def on_signal(sig, _frame):
        raise Stop(signal.Signals(sig).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    runs = []
    rc = 0
    try:
        mitigated = "non-dedicated" if args.mode == "ps" else "dedicated"
        for label, policy in (("none", args.baseline), (mitigated, args.policy)):
            if label == mitigated and os.path.basename(policy) not in (f"demo-{label}.yaml", f"{label}.yaml"):
                label = os.path.splitext(os.path.basename(policy))[0]
            run_dir = os.path.join(args.out, f"run-{len(runs) + 1}-{label}")
            os.makedirs(run_dir)
            run = Run(args, label, policy, run_dir, procs, live)
            runs.append(run)
            if live != "off":
                sys.stderr.write(f"--- run {len(runs)}: policy {label} ({os.path.relpath(policy)}) ---\n")
            run.start()
            run.watch()
            procs.stop_all()
            run.collect()
        summary = summarize(args, runs)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        write_report(os.path.join(args.out, "report.html"), args, runs, summary)
        stream = sys.stderr if args.json else sys.stdout
        stream.write("\n")
        print_table(summary, stream)
        stream.write(f"\n  report: {os.path.join(args.out, 'report.html')}\n")
        if args.json:
            print(json.dumps(summary, indent=2))
    except Stop as e:
        sys.stderr.write(f"\npacer-demo: {e}: stopping every process it started\n")
        rc = 130
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        sys.stderr.write(f"\npacer-demo: {e}\n")
        rc = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # cleanup must not be interrupted halfway
        procs.stop_all()
        kill_leftovers(args.out)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
