"""Batch plans on the trainer written from docs/pytorch.md (tests/python/docs_trainer.py), two
ranks against a real pacerd running the demo's dedicated policy (1 s windows), one rank whose
records load slowly (a real per-record stall in its loader processes, --slow-rank/--slow-ms):

  - test_second_run_mitigation_takes_effect: run A with rank 1 slow;
    then `pacerctl datasets reset train` and run B of the same script against the same pacerd
    with rank 0 slow, no run id (torchrun's default). In each run the plan reaches the ranks
    (plans_applied > 0) and shrinks the batch of that run's slow rank: run B's plan is scheduled
    at run B's steps and follows run B's straggler, not run A's. Every record once in each run.
  - test_plan_keeps_accuracy: the same seed and the same slow rank, with the plan (dedicated)
    and without it (the policy switched to demo-none with `pacerctl policy apply`): the
    accuracies are within 2 points, and the run with the plan trains the slow rank on fewer
    records.

Every process is reaped; each wait has a deadline. Skips (77) without torch.
"""

import json
import os
import subprocess
import sys
import unittest

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

from pacerd_fixture import (DOCS_TRAINER as TRAINER, Children, Pacerd, bin_path, free_port, log_tails, temp_dir,
                            torch_rank_env)
import torch_ledger

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RECORDS = 12000
ARGS = ["--records", str(RECORDS), "--batch", "32", "--cost", "2", "--slow-ms", "2.5"]


def policy(name):
    return os.path.join(ROOT, "policies", f"demo-{name}.yaml")


def dedicated_pacerd(tmp):
    return Pacerd(tmp, heartbeat_interval_ms=250,
                  extra_args=["--policy", policy("dedicated"), "--job-mode", "sync",
                              "--reconcile-interval-ms", "500"])


class TorchPlanTest(unittest.TestCase):
    def run_job(self, d, tmp, name, slow_rank):
        out = os.path.join(tmp, name)
        port = free_port()
        with Children() as children:
            for r in range(2):
                children.start([sys.executable, TRAINER, "--out", out, "--slow-rank", str(slow_rank),
                                *ARGS], env=torch_rank_env(d, r, 2, port), log_path=f"{tmp}/{name}-r{r}.log")
            codes = children.wait_all(timeout_s=240)
        self.assertEqual(codes, [0, 0], log_tails(tmp, name))
        torch_ledger.assert_exactly_once(self, out, RECORDS, 1)
        res = [json.loads(open(os.path.join(out, f"result-{r}.json")).read()) for r in range(2)]
        self.assertEqual(res[0]["checksum"], res[1]["checksum"])
        print(name, json.dumps(res), flush=True)
        return res

    def ctl(self, d, *cmd):
        out = subprocess.run([bin_path("pacerctl"), "--addr", d.address, "--data-dir", d.data_dir, *cmd],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, f"pacerctl {' '.join(cmd)}: {out.stdout}{out.stderr}")
        return out.stdout

    def assert_mitigated(self, res, slow, what):
        fast = 1 - slow
        self.assertGreater(res[slow]["plans_applied"], 0, f"{what}: no plan reached rank {slow}")
        self.assertLess(res[slow]["local_batch"], res[fast]["local_batch"],
                        f"{what}: the plan did not shrink the slow rank's batch")
        self.assertLess(res[slow]["samples"], res[fast]["samples"],
                        f"{what}: the slow rank trained on as many records as the fast one")

    def test_second_run_mitigation_takes_effect(self):
        with temp_dir() as tmp, dedicated_pacerd(tmp) as d:
            a = self.run_job(d, tmp, "runA", slow_rank=1)
            self.assert_mitigated(a, 1, "run A")
            self.ctl(d, "datasets", "reset", "train")
            b = self.run_job(d, tmp, "runB", slow_rank=0)
            self.assert_mitigated(b, 0, "run B (second run, the other rank slow)")

    def test_plan_keeps_accuracy(self):
        with temp_dir() as tmp, dedicated_pacerd(tmp) as d:
            planned = self.run_job(d, tmp, "planned", slow_rank=1)
            self.assert_mitigated(planned, 1, "dedicated")
            self.ctl(d, "policy", "apply", policy("none"))
            self.ctl(d, "datasets", "reset", "train")
            plain = self.run_job(d, tmp, "plain", slow_rank=1)
            self.assertEqual(plain[1]["plans_applied"], 0, "a plan under policy none")
            acc_planned, acc_plain = planned[0]["accuracy"], plain[0]["accuracy"]
            print(f"accuracy with plan {acc_planned:.4f}, without {acc_plain:.4f}")
            self.assertLessEqual(abs(acc_planned - acc_plain), 0.02)


if __name__ == "__main__":
    unittest.main(verbosity=2)
