"""A torchrun script runs unchanged under pacer-agent, and a dead rank restarts the group.

  torchrun_compat_test.py PACER_AGENT

Three workers of tests/agent/torchrun_worker.py (dist.init_process_group("gloo"), env://) under
pacer-agent without pacerd: every rank all-reduces (sum 1+2+3), then rank 1 is killed with
SIGKILL; the agent stops the survivors and starts the group again with
TORCHELASTIC_RESTART_COUNT=1 and a new MASTER_PORT, where the all-reduce succeeds and every rank
exits 0, and so does the agent. Exits 77 (skipped) without torch. Every wait has a deadline.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_for(cond, timeout, what, agent, log):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if agent.poll() is not None and not cond():
            break
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; agent log:\n" + open(log).read())


def main():
    try:
        import torch.distributed as dist  # noqa: F401
        if not dist.is_gloo_available():
            raise ImportError("no gloo")
    except ImportError as e:
        print(f"skipped: torch with Gloo is not importable ({e})")
        return 77
    agent_bin = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="torchrun_compat_", dir=os.environ.get("TEST_TMPDIR"))
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    log = os.path.join(tmp, "agent.log")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PACER_", "MASTER_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [agent_bin, "--addr", "", "--node", "n0", "--job", "torchjob", "--workers", "3",
           "--backoff-initial-ms", "100", "--stop-grace-ms", "5000", "--no-nvml", "--",
           sys.executable, "-u", os.path.join(HERE, "torchrun_worker.py"), out]
    with open(log, "w") as lf:
        agent = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        def result(rank, restart):
            p = os.path.join(out, f"rank{rank}.{restart}.json")
            return json.load(open(p)) if os.path.exists(p) else None

        wait_for(lambda: all(result(r, 0) for r in range(3)), 240, "the first all-reduce", agent, log)
        first = [result(r, 0) for r in range(3)]
        for r, res in enumerate(first):
            assert res["world"] == 3 and res["sum"] == 6.0 and res["local_rank"] == r, res
        assert len({res["master_port"] for res in first}) == 1, first
        os.kill(first[1]["pid"], signal.SIGKILL)

        wait_for(lambda: agent.poll() is not None, 300, "the agent to finish", agent, log)
        assert agent.returncode == 0, f"agent exited {agent.returncode}:\n" + open(log).read()
        second = [result(r, 1) for r in range(3)]
        assert all(second), f"not every rank ran again: {second}\n" + open(log).read()
        for r, res in enumerate(second):
            assert res["world"] == 3 and res["sum"] == 6.0 and res["restart"] == 1, res
            assert res["pid"] != first[r]["pid"], (first[r], res)
        assert len({res["master_port"] for res in second}) == 1, second
        assert second[0]["master_port"] != first[0]["master_port"], (first, second)
        assert not any(result(r, 2) for r in range(3)), "a third start"
        text = open(log).read()
        assert "restarting the group of 3 worker(s), restart 1/3" in text, text
        print(f"ok: ports {first[0]['master_port']} -> {second[0]['master_port']}, all-reduce 6.0 in both starts")
        return 0
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


if __name__ == "__main__":
    sys.exit(main())
