"""Helpers of the pacerctl tests: named checks, and pacerd as they run it. Processes, waiting and
pacerd itself come from the Python tests' fixture (tests/python/pacerd_fixture.py), which
importing this module puts on sys.path."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from pacerd_fixture import Pacerd  # noqa: E402


def start_pacerd(procs, bin_dir, tmp, policy=None, name="pacerd"):
    """Starts pacerd (one of ``procs``, a pacerd_fixture.Children) with its data in
    tmp/NAME-data; returns (process, 'HOST:PORT', data dir)."""
    extra = ["--reconcile-interval-ms", "500"] + (["--policy", policy] if policy else [])
    d = Pacerd(tmp, heartbeat_interval_ms=300, extra_args=extra, bin_dir=bin_dir, name=name,
               data_dir=os.path.join(tmp, name + "-data"), children=procs)
    return d.proc, d.address, d.data_dir


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
