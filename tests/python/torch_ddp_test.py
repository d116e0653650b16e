"""Example (c), examples/torch_ddp/train.py: 2 DDP processes on Gloo (env:// as torchrun sets it)
reading through pacer.torch.DataLoader from a real pacerd subprocess and averaging with
pacer.torch.DistributedDataParallel (every rank registers the dataset with the same batch size;
uneven batches come from the controller's plan: torch_plan_test.py, and the weighted average
itself is checked by torch_hook_test.py), must:
  - both exit 0 and reach the stated accuracy (TARGET) on the held-out set;
  - end with identical parameters (same checksum on both ranks: the hook keeps them in sync);
  - together train every record exactly once per epoch (samples sum = records x epochs), and
    their --ledger files hold every (epoch, index) pair exactly once.
Every process is reaped (own process groups, killed on failure); the test has a deadline.
Skips (exit 77) with a message when torch cannot be imported.
"""

import collections
import json
import os
import sys
import unittest

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

from pacerd_fixture import Children, Pacerd, free_port, log_tails, temp_dir, torch_rank_env

TARGET = 0.85  # MLP 20-128-4, generated 4-class task, 4 epochs of 16384
RECORDS, EPOCHS = 16384, 4
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch_ddp", "train.py")


class TorchDdpExampleTest(unittest.TestCase):
    def test_two_ranks_uneven_batches_converge(self):
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            port = free_port()
            for rank in range(2):
                children.start([sys.executable, TRAIN, "--batch", "32", "--records", str(RECORDS),
                                "--epochs", str(EPOCHS), "--target-accuracy", str(TARGET),
                                "--result-dir", tmp, "--ledger", tmp],
                               env=torch_rank_env(d, rank, 2, port), log_path=f"{tmp}/w{rank}.log")
            codes = children.wait_all(timeout_s=400)
            self.assertEqual(codes, [0, 0], log_tails(tmp))
            results = [json.loads(open(f"{tmp}/result-{r}.json").read()) for r in range(2)]
            seen = collections.Counter()
            for r in range(2):
                with open(f"{tmp}/ledger-{r}.jsonl") as f:
                    for line in f:
                        seen.update(tuple(p) for p in json.loads(line)["records"])
        for r in results:
            print(json.dumps(r))
            self.assertGreaterEqual(r["accuracy"], TARGET)
        self.assertEqual(results[0]["checksum"], results[1]["checksum"])
        self.assertEqual(results[0]["steps"], results[1]["steps"])
        self.assertEqual(sum(r["samples"] for r in results), RECORDS * EPOCHS)
        expected = {(e, i) for e in range(EPOCHS) for i in range(RECORDS)}
        self.assertEqual(set(seen), expected)
        self.assertEqual([p for p, n in seen.items() if n > 1], [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
