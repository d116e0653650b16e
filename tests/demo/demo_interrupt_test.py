#!/usr/bin/env python3
"""ctest demo_interrupt: Ctrl-C at a random moment leaves no process behind.

Starts the quick demo in its own session, waits until it has started its processes (pacerd's
port file exists) plus a random delay (seeded; the seed is printed, PACER_TEST_SEED replays
it), sends SIGINT as a terminal's Ctrl-C would, and checks that the demo exits promptly
(code 130) and that no process whose command line names the run's folder -- pacerd, the
agents, the trainers -- remains, and no contention cgroup of those agents is left.
Two rounds: one early (start-up, rendezvous), one later (training, often after the contention).
  demo_interrupt_test.py DEMO_PY BIN_DIR
"""
import glob
import os
import random
import signal
import subprocess
import sys
import time

from procs import procs_naming

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from pacerd_fixture import Children, temp_dir, wait_for  # noqa: E402


def run_procs(path):
    return procs_naming(path, "demo_interrupt_test")


def tail(path, chars=2000):
    with open(path, errors="replace") as f:
        return f.read()[-chars:]


def agent_pids(out):
    pids = []
    for pid, cmd in run_procs(out):
        if "pacer-agent" in cmd.split(" ")[0]:
            pids.append(pid)
    return pids


def one_round(demo, bin_dir, delay_s, tmp, n):
    with Children() as children:
        return interrupt(children, demo, bin_dir, delay_s, tmp, n)


def interrupt(children, demo, bin_dir, delay_s, tmp, n):
    out = os.path.join(tmp, f"out{n}")
    log = os.path.join(tmp, f"demo{n}.log")
    p = children.start([sys.executable, demo, "--quick", "--live", "off", "--bin", bin_dir, "--out", out],
                       log_path=log)
    try:
        wait_for(lambda: glob.glob(os.path.join(out, "run-*", "port.json")) or p.poll() is not None, 60,
                 "the demo to start pacerd", period_s=0.05)
    except TimeoutError as e:
        print(f"FAIL round {n}: {e}: {tail(log)}")
        return False
    if p.poll() is not None:
        print(f"FAIL round {n}: the demo exited before starting ({p.returncode}): {tail(log)}")
        return False
    # Wait the random delay while remembering which agents ran (for the cgroup check).
    agents = set()
    end = time.monotonic() + delay_s
    while time.monotonic() < end and p.poll() is None:
        agents.update(agent_pids(out))
        time.sleep(0.1)
    if p.poll() is not None:
        print(f"round {n}: the demo finished before the interrupt ({p.returncode}); nothing to check")
        return p.returncode == 0 and not run_procs(out)
    print(f"round {n}: SIGINT after {delay_s:.1f} s (agents seen: {sorted(agents)})")
    os.kill(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        print(f"FAIL round {n}: the demo did not exit within 60 s of SIGINT")
        return False
    ok = True
    if p.returncode != 130:
        print(f"FAIL round {n}: exit code {p.returncode}, want 130\n{tail(log)}")
        ok = False
    left = run_procs(out)
    if left:
        print(f"FAIL round {n}: processes left behind: {left}")
        ok = False
    groups = [g for a in agents for g in glob.glob(f"/sys/fs/cgroup/cpu/**/pacer-agent-{a}-*", recursive=True)]
    if groups:
        print(f"FAIL round {n}: contention cgroups left behind: {groups}")
        ok = False
    if ok:
        print(f"ok   round {n}: exit 130, nothing left behind")
    return ok


def main():
    demo, bin_dir = sys.argv[1], sys.argv[2]
    seed = int(os.environ.get("PACER_TEST_SEED", random.SystemRandom().randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"seed {seed} (PACER_TEST_SEED={seed} replays it)")
    ok = True
    with temp_dir(prefix="pacer-demo-int-") as tmp:
        ok &= one_round(demo, bin_dir, rng.uniform(0.0, 3.0), tmp, 1)
        ok &= one_round(demo, bin_dir, rng.uniform(5.0, 25.0), tmp, 2)
    print("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
