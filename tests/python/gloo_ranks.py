"""Runs a test's ranks as spawned processes on Gloo with a file:// store in a private temp dir,
and collects each rank's verdict.

``run_ranks(worker, world)`` calls ``worker(rank, store, result_dir)`` in ``world`` processes.
Each rank writes its verdict ("OK", or its failures one per line) to ``result_dir/rank<r>``
*before* it tears down Gloo: teardown with a file:// store can hang on a loaded machine
(torch 1.13), and that must neither hide nor fake the result. So once every verdict is in, a
teardown still stuck after ``teardown_grace_s`` is killed and the verdicts stand; a rank that
never wrote one within ``timeout_s`` is a failure. Every process is killed and reaped either way.
"""

import os
import tempfile
import time

import torch
import torch.multiprocessing as mp


def make_model():
    """The numerics tests' model: the same initial weights in every rank and reference."""
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))


def make_data(n):
    """n fixed samples (inputs, class labels) for make_model, the same in every process."""
    g = torch.Generator().manual_seed(99)
    return torch.randn(n, 10, generator=g), torch.randint(0, 5, (n,), generator=g)


def run_ranks(worker, world, timeout_s=180, teardown_grace_s=30):
    """Returns the verdicts, one per rank ("no result" for a rank that wrote none), or None when
    the ranks did not finish within `timeout_s`. Raises if a rank exited with an error."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR") or None) as tmp:
        ctx = mp.start_processes(worker, args=(os.path.join(tmp, "store"), tmp), nprocs=world,
                                 join=False, start_method="spawn")
        paths = [os.path.join(tmp, f"rank{r}") for r in range(world)]
        deadline = time.monotonic() + timeout_s
        all_in_since = None
        while not ctx.join(timeout=1):  # raises if a rank failed; True once all exited
            now = time.monotonic()
            if all_in_since is None and all(os.path.exists(p) for p in paths):
                all_in_since = now
            teardown_stuck = all_in_since is not None and now - all_in_since > teardown_grace_s
            if teardown_stuck or now > deadline:
                for proc in ctx.processes:
                    if proc.is_alive():
                        proc.kill()
                for proc in ctx.processes:
                    proc.join()
                if not teardown_stuck:
                    print(f"FAIL: ranks did not finish within {timeout_s} s")
                    return None
                print("note: every rank wrote its verdict but teardown hung; ranks terminated")
                break
        return [open(p).read() if os.path.exists(p) else "no result" for p in paths]


def write_verdict(result_dir, rank, failures):
    with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
        f.write("\n".join(failures) if failures else "OK")


def report(results, passed):
    """Prints PASS `passed` or the failing ranks' verdicts; returns the exit code."""
    if results is None:
        return 1
    bad = [f"rank {r}: {s}" for r, s in enumerate(results) if s != "OK"]
    if bad:
        print("FAIL\n" + "\n".join(bad))
        return 1
    print("PASS: " + passed)
    return 0
