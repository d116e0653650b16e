"""Helpers shared by the pacerctl tests: a real pacerd on loopback (port 0) in a temp dir,
processes that are always reaped, and waiting for a condition with a deadline."""
import json
import os
import signal
import subprocess
import sys
import time


def wait_for(predicate, timeout_s, what, period_s=0.05):
    """Polls `predicate` until it returns a true value (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(period_s)


class Procs:
    """Every process a test starts: its own process group, stopped (SIGTERM, then SIGKILL)
    and reaped on close."""

    def __init__(self):
        self.procs = []

    def spawn(self, argv, log, env=None, cwd=None):
        out = open(log, "w")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             start_new_session=True)
        out.close()
        self.procs.append(p)
        return p

    def stop(self, p, grace_s=10):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        return p.returncode

    def close(self):
        for p in reversed(self.procs):
            self.stop(p)


def start_pacerd(procs, bin_dir, tmp, policy=None, name="pacerd"):
    """Starts pacerd with its data in tmp/NAME-data; returns (process, 'HOST:PORT', data dir)."""
    data = os.path.join(tmp, name + "-data")
    port_file = os.path.join(tmp, name + ".port.json")
    argv = [os.path.join(bin_dir, "pacerd"), "--data-dir", data, "--listen", "127.0.0.1:0",
            "--metrics-listen", "", "--port-file", port_file, "--heartbeat-interval-ms", "300",
            "--reconcile-interval-ms", "500"]
    if policy:
        argv += ["--policy", policy]
    p = procs.spawn(argv, os.path.join(tmp, name + ".log"))

    def port():
        if p.poll() is not None:
            raise RuntimeError(f"pacerd exited with {p.returncode}: see {tmp}/{name}.log")
        try:
            with open(port_file) as f:
                return json.load(f)["port"]
        except (OSError, ValueError, KeyError):
            return None
    return p, "127.0.0.1:%d" % wait_for(port, 30, "pacerd to listen"), data


class Checks:
    def __init__(self):
        self.failures = []

    def expect(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)
        return cond

    def result(self):
        print("PASS" if not self.failures else f"{len(self.failures)} FAILED: {self.failures}")
        return 0 if not self.failures else 1
