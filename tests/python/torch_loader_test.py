"""pacer.torch.DataLoader + DistributedDataParallel (docs/pytorch.md) with the trainer written
from the docs (tests/python/docs_trainer.py: map-style dataset with real per-sample CPU cost,
num_workers=2, BatchNorm), against a real pacerd subprocess and Gloo between processes:

  - two ranks, two epochs, identity from torchrun's variables (RANK, no PACER_WORKER_ID): every
    record trained exactly twice, equal parameters on both ranks;
  - kill -9 of rank 1 mid-epoch after checkpoints, then the restart a supervisor does (both ranks
    again, TORCHELASTIC_RESTART_COUNT=1, a fresh MASTER_PORT): the model descends from the last
    checkpoint and saw every record exactly once — all after the checkpoint it resumed from were
    trained again, none before;
  - the same kill before any checkpoint but the recipe's step-0 one: every record exactly once;
  - the same script under torchrun --nproc-per-node 2 with no PACER_* identity: every record once.
Every process is reaped; each wait has a deadline. Skips (77) without torch.
"""

import json
import os
import shutil
import sys
import unittest

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

from pacerd_fixture import (DOCS_TRAINER as TRAINER, Children, Pacerd, free_port, log_tails, pacer_env,
                            temp_dir, torch_rank_env, wait_for)
import torch_ledger


def results(out, world):
    return [json.loads(open(os.path.join(out, f"result-{r}.json")).read()) for r in range(world)]


class TorchLoaderTest(unittest.TestCase):
    def start_ranks(self, children, d, tmp, out, args, attempt=0, world=2):
        port = free_port()
        return [children.start([sys.executable, TRAINER, "--out", out, *args],
                               env=torch_rank_env(d, r, world, port, attempt),
                               log_path=f"{tmp}/a{attempt}-r{r}.log") for r in range(world)]

    def test_two_ranks_two_epochs_exactly_once(self):
        records, epochs = 3000, 2
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            out = os.path.join(tmp, "out")
            self.start_ranks(children, d, tmp, out, ["--records", str(records), "--epochs", str(epochs),
                                                     "--batch", "24", "--cost", "5"])
            codes = children.wait_all(timeout_s=240)
            self.assertEqual(codes, [0, 0], log_tails(tmp))
            res = results(out, 2)
            torch_ledger.assert_exactly_once(self, out, records, epochs)
        print(json.dumps(res))
        self.assertEqual(res[0]["checksum"], res[1]["checksum"])
        self.assertEqual(res[0]["steps"], res[1]["steps"])
        self.assertEqual(sum(r["samples"] for r in res), records * epochs)

    def kill_rank_one_and_restart(self, records, args):
        """Runs 2 ranks until rank 1 kills itself (--die-at-step), stops the survivor and starts
        the group again, as a supervisor (pacer-agent, torchrun) does; returns the ledger's chain
        of attempts (every record trained exactly once) and the results."""
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            out = os.path.join(tmp, "out")
            ranks = self.start_ranks(children, d, tmp, out, args)
            wait_for(lambda: ranks[1].poll() is not None, 180, "rank 1 killing itself")
            self.assertEqual(ranks[1].returncode, -9, log_tails(tmp))
            children.kill_all()
            self.assertTrue(os.path.exists(os.path.join(out, "ckpt.pt")), log_tails(tmp))
            children.procs.clear()
            self.start_ranks(children, d, tmp, out, args, attempt=1)
            codes = children.wait_all(timeout_s=240)
            self.assertEqual(codes, [0, 0], log_tails(tmp))
            chain = torch_ledger.assert_exactly_once(self, out, records, 1)
            return chain, results(out, 2)

    def test_kill_one_rank_resume_from_checkpoint(self):
        records = 4000
        chain, res = self.kill_rank_one_and_restart(
            records, ["--records", str(records), "--batch", "16", "--cost", "5", "--ckpt-every", "20",
                      "--die-at-step", "70"])
        print(json.dumps({"chain": chain, "results": res}))
        self.assertEqual([a for a, _, _ in chain], [0, 1])
        self.assertEqual(chain[1][1] % 20, 0)  # resumed at a checkpoint step
        self.assertGreater(chain[1][1], 0)
        self.assertEqual(res[0]["checksum"], res[1]["checksum"])

    def test_kill_before_first_checkpoint(self):
        """The recipe's step-0 checkpoint: rank 1 killed at step 30, before any later checkpoint;
        the restart resumes model and data from step 0, and the model sees every record once
        (the records trained before the kill are trained again)."""
        records = 2000
        chain, _ = self.kill_rank_one_and_restart(
            records, ["--records", str(records), "--batch", "16", "--cost", "5", "--ckpt-every", "1000",
                      "--die-at-step", "30"])
        print(json.dumps({"chain": chain}))
        self.assertEqual(chain, [(0, 0, 0), (1, 0, None)])

    def test_single_process_worker_init_sees_the_dataset(self):
        """World 1 (no torch.distributed), num_workers=2: every record once, and a
        worker_init_fn reaches the user's dataset attributes through get_worker_info()."""
        script = (
            "import os, sys, torch\n"
            "import pacer.torch as pt\n"
            "class DS(torch.utils.data.Dataset):\n"
            "    tag = 'mine'\n"
            "    def __len__(self): return 500\n"
            "    def __getitem__(self, i): return i\n"
            "def init(_):\n"
            "    info = torch.utils.data.get_worker_info()\n"
            "    assert info.dataset.tag == 'mine' and len(info.dataset) == 500, 'dataset hidden'\n"
            "seen = []\n"
            "loader = pt.DataLoader(DS(), batch_size=16, num_workers=2, worker_init_fn=init)\n"
            "for b in loader:\n"
            "    seen += b.tolist()\n"
            "assert sorted(seen) == list(range(500)), (len(seen), len(set(seen)))\n"
            "print('OK', len(seen), loader.step)\n")
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            children.start([sys.executable, "-c", script], env=pacer_env(d, PACER_WORKER_ID="solo"),
                           log_path=f"{tmp}/solo.log")
            codes = children.wait_all(timeout_s=120)
            self.assertEqual(codes, [0], log_tails(tmp))

    @unittest.skipUnless(shutil.which("torchrun"), "torchrun not installed")
    def test_under_torchrun_without_pacer_identity(self):
        records = 2000
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            out = os.path.join(tmp, "out")
            children.start(["torchrun", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
                            "--log_dir", os.path.join(tmp, "torchrun-logs"),
                            "--master_port", str(free_port()), TRAINER, "--out", out,
                            "--records", str(records), "--batch", "16", "--cost", "5"],
                           env=pacer_env(d), log_path=f"{tmp}/torchrun.log")
            codes = children.wait_all(timeout_s=240)
            self.assertEqual(codes, [0], log_tails(tmp))
            torch_ledger.assert_exactly_once(self, out, records, 1)
            res = results(out, 2)
        print(json.dumps(res))
        self.assertEqual(res[0]["checksum"], res[1]["checksum"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
