"""Test helpers for Python tests: a private temp dir, a pacerd subprocess on a port from the OS,
and child processes that are always reaped.

``Pacerd(tmp)`` starts build/bin/pacerd (PACER_BIN_DIR) with --listen 127.0.0.1:0 and waits,
with a deadline, for its --port-file; ``stop()`` (or leaving the ``with`` block) kills its
process group and reaps it. ``Children`` does the same for any processes a test starts.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import tempfile
import time


def bin_path(name):
    return os.path.join(os.environ.get("PACER_BIN_DIR", "build/bin"), name)


# The trainer written from docs/pytorch.md, as a user would write it (tests/python/docs_trainer.py).
DOCS_TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs_trainer.py")


def free_port():
    """A port the OS just handed out, for a process that binds it itself (torch's MASTER_PORT);
    another process may take it meanwhile, which torch reports as an error, not a hang."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def temp_dir():
    return tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR") or None)


def wait_for(condition, timeout_s, what):
    """Polls `condition` until true or the deadline; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def _own_group_and_die_with_parent():
    """preexec_fn: a new process group (killed as one) that the kernel SIGKILLs when the test
    process dies, even by SIGKILL from ctest's timeout (PR_SET_PDEATHSIG)."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Children:
    """Processes started in their own process groups; kill_all() SIGKILLs and reaps them."""

    def __init__(self):
        self.procs = []

    def start(self, argv, env=None, log_path=None):
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                             preexec_fn=_own_group_and_die_with_parent)
        if log_path:
            out.close()
        self.procs.append(p)
        return p

    def wait_all(self, timeout_s):
        """Exit codes of every child, or raises TimeoutError (the children are then killed)."""
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill_all()
                raise TimeoutError(f"process {p.args} still running after {timeout_s} s")
        return codes

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill_all()


class Pacerd:
    def __init__(self, tmp, heartbeat_interval_ms=100, extra_args=()):
        self.data_dir = os.path.join(tmp, "data")
        port_file = os.path.join(tmp, "pacerd.port")
        self.log = os.path.join(tmp, "pacerd.log")
        self.children = Children()
        self.proc = self.children.start(
            [bin_path("pacerd"), "--data-dir", self.data_dir, "--listen", "127.0.0.1:0",
             "--metrics-listen", "", "--port-file", port_file,
             "--heartbeat-interval-ms", str(heartbeat_interval_ms), *extra_args],
            log_path=self.log)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"pacerd exited ({self.proc.returncode}): {self.read_log()}")
            try:
                with open(port_file) as f:
                    self.port = json.load(f)["port"]
                return True
            except (OSError, ValueError, KeyError):
                return False

        wait_for(ready, 60, "pacerd serving")
        self.address = f"127.0.0.1:{self.port}"
        self.token_file = os.path.join(self.data_dir, "job.token")
        with open(self.token_file) as f:
            self.token = f.read().strip()

    def read_log(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        self.children.kill_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
