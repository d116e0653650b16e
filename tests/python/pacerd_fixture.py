"""The Python tests' fixture (tests/python, tests/pacerctl, tests/agent, tests/tls, the demo tests
and bench/torch_straggler_bench.py): a private temp dir, a pacerd subprocess on a port from the
OS, child processes that are always reaped, and waiting with a deadline.

``Pacerd(tmp)`` starts pacerd (from PACER_BIN_DIR, default build/bin, or ``bin_dir=``) with
--listen 127.0.0.1:0 and waits, with a deadline, for its --port-file; ``stop()`` (or leaving the
``with`` block) kills it and reaps it. ``Children`` starts any process in its own process group,
which the kernel kills should the test process die, and kills and reaps them all at the end.
Scripts outside tests/python put this folder on ``sys.path`` to import it.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# The trainer written from docs/pytorch.md, as a user would write it (tests/python/docs_trainer.py).
DOCS_TRAINER = os.path.join(HERE, "docs_trainer.py")


def bin_path(name, bin_dir=None):
    return os.path.join(bin_dir or os.environ.get("PACER_BIN_DIR", "build/bin"), name)


def free_port():
    """A port the OS just handed out, for a process that binds it itself (torch's MASTER_PORT);
    another process may take it meanwhile, which torch reports as an error, not a hang."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def temp_dir(prefix=None):
    """A private temp dir under TEST_TMPDIR (ctest gives every test its own), removed at the end."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=os.environ.get("TEST_TMPDIR") or None)


def wait_for(condition, timeout_s, what, period_s=0.02):
    """Polls ``condition`` until it returns a true value, which is returned; raises TimeoutError
    naming ``what`` at the deadline. ``condition`` may raise to give up early (a process it
    waits on exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(period_s)


def pacer_env(pacerd, **extra):
    """This process's environment without its PACER_* variables (but PACER_BIN_DIR), plus
    pacerd's address and job token and ``extra``: what a worker of ``pacerd`` runs with."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACER_") or k == "PACER_BIN_DIR"}
    env.update(PACER_ADDR=pacerd.address, PACER_TOKEN=pacerd.token, **extra)
    return env


def torch_rank_env(pacerd, rank, world, master_port, attempt=0):
    """``pacer_env`` plus the environment torchrun gives rank ``rank`` of ``world`` (env://
    rendezvous on 127.0.0.1:``master_port``, restart ``attempt``)."""
    return pacer_env(pacerd, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port),
                     TORCHELASTIC_RESTART_COUNT=str(attempt))


def log_tails(folder, prefix="", chars=2500):
    """The ends of the *.log files in ``folder`` whose names start with ``prefix`` (and
    pacerd.log), for a failure message."""
    text = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".log") and (name.startswith(prefix) or name == "pacerd.log"):
            with open(os.path.join(folder, name), errors="replace") as f:
                text.append(f"--- {name}\n" + f.read()[-chars:])
    return "\n".join(text)


def _own_group_and_die_with_parent():
    """preexec_fn: a new process group (killed as one) that the kernel SIGKILLs when the test
    process dies, even by SIGKILL from ctest's timeout (PR_SET_PDEATHSIG)."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _signal_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


class Children:
    """Processes started in their own process groups. ``stop(p)`` ends one (SIGTERM, SIGKILL
    after a grace period), ``close()`` does that to all, ``kill_all()`` SIGKILLs all; each
    reaps what it ended."""

    def __init__(self):
        self.procs = []

    def start(self, argv, env=None, log_path=None, cwd=None):
        """Starts ``argv`` with stdout and stderr appended to ``log_path`` (else discarded)."""
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
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

    def stop(self, p, grace_s=10):
        """SIGTERM to ``p``'s group, SIGKILL after ``grace_s``; returns its exit code."""
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        return p.returncode

    def close(self, grace_s=10):
        """Stops every child, the last started first."""
        for p in reversed(self.procs):
            self.stop(p, grace_s)

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
            p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill_all()


class Pacerd:
    """pacerd on 127.0.0.1:0 with its data in ``tmp``/data (or ``data_dir``) and its log in
    ``tmp``/``name``.log; ``address``, ``data_dir``, ``token`` (the job token), ``token_file``
    and ``proc`` once started. With ``children=`` it is one of the caller's children (stopped
    with them); else it has its own."""

    def __init__(self, tmp, heartbeat_interval_ms=100, extra_args=(), bin_dir=None,
                 name="pacerd", data_dir=None, children=None):
        self.data_dir = data_dir or os.path.join(tmp, "data")
        port_file = os.path.join(tmp, f"{name}.port")
        self.log = os.path.join(tmp, f"{name}.log")
        self.children = children if children is not None else Children()
        self.proc = self.children.start(
            [bin_path("pacerd", bin_dir), "--data-dir", self.data_dir, "--listen", "127.0.0.1:0",
             "--metrics-listen", "", "--port-file", port_file,
             "--heartbeat-interval-ms", str(heartbeat_interval_ms), *extra_args],
            log_path=self.log)

        def port():
            if self.proc.poll() is not None:
                raise RuntimeError(f"pacerd exited ({self.proc.returncode}): {self.read_log()}")
            try:
                with open(port_file) as f:
                    return json.load(f)["port"]
            except (OSError, ValueError, KeyError):
                return None

        self.port = wait_for(port, 60, "pacerd serving")
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

    def stop(self, grace_s=0):
        """Ends pacerd: SIGKILL by default, SIGTERM first with ``grace_s``."""
        if grace_s:
            self.children.stop(self.proc, grace_s)
        elif self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
