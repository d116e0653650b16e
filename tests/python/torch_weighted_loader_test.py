"""pacer.torch.weighted with pacer.torch.DataLoader (docs/pytorch.md, "Other data-parallel
engines"), against a real pacerd subprocess and two ranks on Gloo, the model a plain torch DDP
(its own mean over the ranks, no Pacer hook):

  - ``loss = pt.weighted(loss)`` takes each rank's counted samples from the loader, and its one
    all-reduce also ends the loop on both ranks after the same step: every record trained
    exactly once per epoch (from ``batch_info``), both ranks end with equal parameters and
    agree on every step's N (``loader.total_weight``), which is the sum of the ranks' weights;
    a step with N = 0 skips ``optimizer.step()``;
  - with a ``pt.DistributedDataParallel`` model, ``pt.weighted`` refuses (the ranks would be
    weighted twice);
  - with neither, the loader refuses at the next batch rather than train unweighted.

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

RECORDS, EPOCHS = 700, 2


def trainer(out, mode):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pacer.torch as pt

    class Records(torch.utils.data.Dataset):
        def __len__(self):
            return RECORDS

        def __getitem__(self, i):
            x = torch.randn(4, generator=torch.Generator().manual_seed(int(i)))
            return x, int(x.sum() > 0)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = pt.DataLoader(Records(), batch_size=16, epochs=EPOCHS, seed=5)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = pt.DistributedDataParallel(net) if mode == "both" else DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = []
    try:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            if mode in ("weighted", "both"):
                loss = pt.weighted(loss)
            opt.zero_grad()
            loss.backward()
            if loader.total_weight:
                opt.step()
            info = loader.batch_info
            steps.append({"step": info.step, "weight": info.weight, "total": loader.total_weight,
                          "records": info.records})
    except RuntimeError as e:
        with open(os.path.join(out, f"error-{rank}.txt"), "w") as f:
            f.write(str(e))
        return 0
    with open(os.path.join(out, f"steps-{rank}.json"), "w") as f:
        json.dump({"steps": steps, "checksum": float(sum(p.double().sum() for p in model.parameters()))}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


class TorchWeightedLoaderTest(unittest.TestCase):
    def run_mode(self, mode):
        from pacerd_fixture import Children, Pacerd, free_port, log_tails, temp_dir, torch_rank_env
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            port = free_port()
            for r in range(2):
                children.start([sys.executable, os.path.abspath(__file__), "--trainer", tmp, mode],
                               env=torch_rank_env(d, r, 2, port), log_path=f"{tmp}/{mode}-r{r}.log")
            codes = children.wait_all(timeout_s=180)
            self.assertEqual(codes, [0, 0], log_tails(tmp))
            found = {}
            for r in range(2):
                for kind in ("steps", "error"):
                    path = os.path.join(tmp, f"{kind}-{r}.{'json' if kind == 'steps' else 'txt'}")
                    if os.path.exists(path):
                        with open(path) as f:
                            found[r] = (kind, json.load(f) if kind == "steps" else f.read())
            return found

    def test_plain_ddp_with_weighted_loss(self):
        found = self.run_mode("weighted")
        self.assertEqual([found[r][0] for r in range(2)], ["steps", "steps"], found)
        runs = [found[r][1] for r in range(2)]
        self.assertEqual(runs[0]["checksum"], runs[1]["checksum"])
        by_step = [{s["step"]: s for s in run["steps"]} for run in runs]
        self.assertEqual(sorted(by_step[0]), sorted(by_step[1]), "the ranks took different steps")
        for step, s0 in by_step[0].items():
            s1 = by_step[1][step]
            self.assertEqual((s0["total"], s1["total"]), (s0["weight"] + s1["weight"],) * 2, (s0, s1))
        seen = collections.Counter(tuple(p) for run in runs for s in run["steps"] for p in s["records"])
        self.assertEqual(set(seen), {(e, i) for e in range(EPOCHS) for i in range(RECORDS)})
        self.assertEqual([p for p, n in seen.items() if n > 1], [])
        zero = sum(1 for s in by_step[0].values() if s["total"] == 0)
        print(f"PASS: {len(by_step[0])} steps, each record once per epoch, equal parameters; "
              f"{zero} step(s) with N = 0")

    def test_weighted_with_pacer_ddp_refused(self):
        found = self.run_mode("both")
        for r in range(2):
            self.assertEqual(found[r][0], "error", found)
            self.assertIn("count them twice", found[r][1])

    def test_neither_refused(self):
        found = self.run_mode("plain")
        for r in range(2):
            self.assertEqual(found[r][0], "error", found)
            self.assertIn("pacer.torch.weighted", found[r][1])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer":
        sys.exit(trainer(sys.argv[2], sys.argv[3]))
    unittest.main(verbosity=2)
