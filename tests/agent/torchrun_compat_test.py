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
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from pacerd_fixture import Children, temp_dir, wait_for  # noqa: E402


def wait_on_agent(cond, timeout, what, agent, log):
    """wait_for(cond) that gives up as soon as the agent exited without cond; fails with the
    agent's log."""
    def check():
        if cond():
            return True
        if agent.poll() is not None:
            raise AssertionError(f"the agent exited ({agent.returncode}) before {what}")
        return False
    try:
        wait_for(check, timeout, what, period_s=0.1)
    except (AssertionError, TimeoutError) as e:
        raise AssertionError(f"{e}; agent log:\n" + open(log).read())


def main():
    try:
        import torch.distributed as dist  # noqa: F401
        if not dist.is_gloo_available():
            raise ImportError("no gloo")
    except ImportError as e:
        print(f"skipped: torch with Gloo is not importable ({e})")
        return 77
    with temp_dir(prefix="torchrun_compat_") as tmp, Children() as children:
        return run(sys.argv[1], tmp, children)


def run(agent_bin, tmp, children):
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    log = os.path.join(tmp, "agent.log")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PACER_", "MASTER_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [agent_bin, "--addr", "", "--node", "n0", "--job", "torchjob", "--workers", "3",
           "--backoff-initial-ms", "100", "--stop-grace-ms", "5000", "--no-nvml", "--",
           sys.executable, "-u", os.path.join(HERE, "torchrun_worker.py"), out]
    agent = children.start(cmd, env=env, log_path=log)

    def result(rank, restart):
        p = os.path.join(out, f"rank{rank}.{restart}.json")
        return json.load(open(p)) if os.path.exists(p) else None

    wait_on_agent(lambda: all(result(r, 0) for r in range(3)), 240, "the first all-reduce", agent, log)
    first = [result(r, 0) for r in range(3)]
    for r, res in enumerate(first):
        assert res["world"] == 3 and res["sum"] == 6.0 and res["local_rank"] == r, res
    assert len({res["master_port"] for res in first}) == 1, first
    os.kill(first[1]["pid"], signal.SIGKILL)

    wait_on_agent(lambda: agent.poll() is not None, 300, "the agent to finish", agent, log)
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


if __name__ == "__main__":
    sys.exit(main())
