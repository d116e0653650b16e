"""pacer.torch.DataLoader.batch_info (docs/pytorch.md, "Which records a batch holds"), against a
real pacerd subprocess and Gloo between two rank processes on loopback:

  - one process (no torch.distributed): a rank's last records, fewer than min_batch, repeated
    evenly, only their first occurrence counted;
  - with num_workers=0 and num_workers=2, every row of every batch the loop receives is the
    record batch_info names (the dataset returns its own index, compared row by row), in the
    order the loader yields them;
  - from batch_info alone: every record of the dataset counted (trained with weight > 0)
    exactly once per epoch across the ranks, counted samples first in a batch, the samples not
    counted repeating counted ones of the same batch (a topped-up batch) or the rank's previous
    batch (a step with nothing to train), and weight == loader.weight == the counted samples.

The file is also the rank's trainer (``--trainer``). Every process is reaped; each wait has a
deadline. Skips (77) without torch.
"""

import collections
import json
import os
import sys
import unittest

try:
    import torch
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)


def trainer(out, records, epochs, batch, min_batch, shard_size, num_workers):
    import torch.distributed as dist
    import torch.nn.functional as F

    import pacer.torch as pt

    class Records(torch.utils.data.Dataset):
        """Record i: a point drawn from seed i, its label, and i itself."""

        def __len__(self):
            return records

        def __getitem__(self, i):
            x = torch.randn(4, generator=torch.Generator().manual_seed(int(i)))
            return x, int(x.sum() > 0), int(i)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = pt.DataLoader(Records(), batch_size=batch, min_batch=min_batch, shard_size=shard_size,
                           num_workers=num_workers, epochs=epochs, seed=5)
    model = pt.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    assert loader.batch_info is None
    with open(os.path.join(out, f"batches-{rank}.jsonl"), "w") as f:
        for x, y, rows in loader:
            info = loader.batch_info
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            f.write(json.dumps({"step": info.step, "loader_step": loader.step, "weight": info.weight,
                                "loader_weight": loader.weight, "indices": list(info.indices),
                                "epochs": list(info.epochs), "counted": list(info.counted),
                                "records": info.records, "rows": rows.tolist(),
                                "samples": int(x.shape[0])}) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


class BatchInfoTest(unittest.TestCase):
    RECORDS, EPOCHS = 1003, 2

    def train(self, num_workers):
        from pacerd_fixture import Children, Pacerd, free_port, log_tails, temp_dir, torch_rank_env

        world = 2
        # Shards of 40 records (1003 = 25 x 40 + 3) and batches of 16 with min_batch 16: a
        # rank's last records of a shard can come short of a batch, and ranks run out of data
        # at different steps near the end.
        args = ["--trainer", "--records", str(self.RECORDS), "--epochs", str(self.EPOCHS),
                "--batch", "16", "--min-batch", "16", "--shard-size", "40",
                "--num-workers", str(num_workers)]
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            out = os.path.join(tmp, "out")
            os.makedirs(out)
            port = free_port()
            for r in range(world):
                children.start([sys.executable, os.path.abspath(__file__), *args, "--out", out],
                               env=torch_rank_env(d, r, world, port), log_path=f"{tmp}/r{r}.log")
            codes = children.wait_all(timeout_s=240)
            self.assertEqual(codes, [0] * world, log_tails(tmp))
            batches = []
            for r in range(world):
                with open(os.path.join(out, f"batches-{r}.jsonl")) as f:
                    batches.append([json.loads(line) for line in f if line.strip()])
        return batches

    def check(self, batches):
        counted = collections.Counter()
        uncounted = {"topped_up": 0, "repeat_steps": 0}
        for rank, mine in enumerate(batches):
            self.assertTrue(mine, f"rank {rank} trained no batch")
            self.assertEqual([b["step"] for b in mine], list(range(len(mine))), f"rank {rank}")
            previous = None
            for b in mine:
                where = f"rank {rank} step {b['step']}: {b}"
                n = b["samples"]
                self.assertEqual(b["loader_step"], b["step"] + 1, where)
                self.assertEqual(len(b["indices"]), n, where)
                self.assertEqual(len(b["epochs"]), n, where)
                self.assertEqual(len(b["counted"]), n, where)
                # Row k of the batch is dataset[indices[k]].
                self.assertEqual(b["rows"], b["indices"], where)
                w = b["weight"]
                self.assertEqual(w, b["loader_weight"], where)
                self.assertEqual(b["counted"], [True] * w + [False] * (n - w), where)
                self.assertEqual([tuple(r) for r in b["records"]],
                                 list(zip(b["epochs"][:w], b["indices"][:w])), where)
                if w == 0:
                    # Nothing to train: the rank's previous batch again (its data and indices).
                    uncounted["repeat_steps"] += 1
                    if previous is not None:
                        self.assertEqual(b["indices"], previous["indices"], where)
                else:
                    self.assertGreaterEqual(n, 16, where)
                    if n > w:
                        # Topped up: each counted record repeated the same number of times.
                        uncounted["topped_up"] += 1
                        self.assertEqual(n % w, 0, where)
                        self.assertEqual(b["indices"], b["indices"][:w] * (n // w), where)
                        self.assertEqual(b["epochs"], b["epochs"][:w] * (n // w), where)
                    previous = b
                counted.update((e, i) for e, i in zip(b["epochs"][:w], b["indices"][:w]))
        expected = {(e, i) for e in range(self.EPOCHS) for i in range(self.RECORDS)}
        missing = sorted(expected - set(counted))
        twice = sorted(k for k, c in counted.items() if c > 1)
        stray = sorted(set(counted) - expected)
        self.assertEqual((missing[:5], twice[:5], stray[:5]), ([], [], []),
                         f"{len(missing)} (epoch, record) never counted, {len(twice)} more than once, "
                         f"{len(stray)} not in the dataset")
        self.assertEqual(sum(counted.values()), self.EPOCHS * self.RECORDS)
        print(json.dumps({"steps": [len(m) for m in batches], **uncounted}), flush=True)
        return uncounted

    def test_single_process_topped_up_batch(self):
        """World 1, num_workers=2: 21 records in batches of 16 with min_batch 16 are a batch of
        16 and the last 5 records repeated 4 times, only their first occurrence counted."""
        from pacerd_fixture import Children, Pacerd, log_tails, pacer_env, temp_dir

        script = (
            "import json, torch\n"
            "import pacer.torch as pt\n"
            "class DS(torch.utils.data.Dataset):\n"
            "    def __len__(self): return 21\n"
            "    def __getitem__(self, i): return i\n"
            "loader = pt.DataLoader(DS(), batch_size=16, min_batch=16, num_workers=2, shuffle=False)\n"
            "for rows in loader:\n"
            "    info = loader.batch_info\n"
            "    print(json.dumps({'rows': rows.tolist(), 'indices': list(info.indices), 'weight': info.weight,\n"
            "                      'counted': list(info.counted), 'records': info.records}))\n")
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            children.start([sys.executable, "-c", script], env=pacer_env(d, PACER_WORKER_ID="solo"),
                           log_path=f"{tmp}/solo.log")
            self.assertEqual(children.wait_all(timeout_s=120), [0], log_tails(tmp))
            with open(f"{tmp}/solo.log") as f:
                batches = [json.loads(line) for line in f if line.startswith("{")]
        last = list(range(16, 21))
        self.assertEqual(batches, [
            {"rows": list(range(16)), "indices": list(range(16)), "weight": 16, "counted": [True] * 16,
             "records": [[0, i] for i in range(16)]},
            {"rows": last * 4, "indices": last * 4, "weight": 5, "counted": [True] * 5 + [False] * 15,
             "records": [[0, i] for i in last]},
        ])

    def test_no_loader_processes(self):
        self.check(self.train(num_workers=0))

    def test_two_loader_processes(self):
        self.check(self.train(num_workers=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer":
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("--trainer", action="store_true")
        for flag in ("--records", "--epochs", "--batch", "--min-batch", "--shard-size", "--num-workers"):
            ap.add_argument(flag, type=int, required=True)
        ap.add_argument("--out", required=True)
        a = ap.parse_args()
        sys.exit(trainer(a.out, a.records, a.epochs, a.batch, a.min_batch, a.shard_size, a.num_workers))
    unittest.main(verbosity=2)
