#!/usr/bin/python3
"""Do uneven local batches hurt BatchNorm? The arithmetic of a Pacer-planned DDP step, in one
process, over several seeds, without a cluster's timing noise.

The trainer of docs/pytorch.md (tests/python/docs_trainer.py: its dataset, its MLP, SGD 0.1 with
momentum 0.9 and linear decay, the same 2 000 test points). A step of W ranks with local batches
b_1..b_W is what pacer.torch computes: each rank's forward on its own b_i records (BatchNorm
normalising with that rank's batch statistics), the gradients averaged with weights b_i/N
(N = sum b_i), the BatchNorm running statistics averaged with the same weights. The records go
to the step in a seeded random order; from --plan-at (fraction of the records) on, the batches
follow the plan instead of being even; the global batch stays the same.

Prints, per case, the accuracy per seed and the mean difference from the even case (points).
Cases: even; the plan as the issue saw it (3 ranks, 16 against 88); the bench's (4 ranks, one at
a third of the speed); the same with a floor on the local batch (the policy's
adjust_batch.min_local_batch); and the model with GroupNorm / LayerNorm instead of BatchNorm.

    /usr/bin/python3 bench/torch_bn_uneven.py [--records 120000] [--seeds 5] [--only NAME]
        [--constant-lr] [--zero-steps K]

--only NAME keeps the cases whose name contains NAME (and the even case each is compared with);
--constant-lr drops the learning-rate decay; --zero-steps K ends each planned case with K steps
in which no rank trained a record (zero gradients, optimizer.step() still called), as pacerd's
runs end with at the end of an epoch under a plan.
"""

import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "build", "python"))
from docs_trainer import CLASSES, DIMS, SyntheticDataset  # noqa: E402


def make_model(norm):
    layer = {"batch": lambda: torch.nn.BatchNorm1d(64),
             "group": lambda: torch.nn.GroupNorm(8, 64),
             "layer": lambda: torch.nn.LayerNorm(64)}[norm]()
    return torch.nn.Sequential(torch.nn.Linear(DIMS, 64), layer, torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))


def tensors(n, seed_base):
    ds = SyntheticDataset(n, 0, seed_base=seed_base)
    xs, ys = [], []
    for i in range(n):
        x, y, _ = ds[i]
        xs.append(x)
        ys.append(y)
    return torch.stack(xs), torch.tensor(ys)


def train(xs, ys, test, seed, norm, even, planned, plan_at, lr=0.1, decay=True, zero_steps=0):
    torch.manual_seed(seed)
    model = make_model(norm)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    n = len(xs)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + seed))
    steps = n // sum(even)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.02, 1.0 - s / steps) if decay else 1.0)
    pos = 0
    model.train()
    while pos < n:
        batches = planned if pos >= plan_at * n else even
        total = min(sum(batches), n - pos)
        opt.zero_grad()
        before = [(b.running_mean.clone(), b.running_var.clone()) for b in bns]
        acc_stats = [[torch.zeros_like(m), torch.zeros_like(v)] for m, v in before]
        for b in batches:
            b = min(b, n - pos)
            if b < 2:
                break
            idx = order[pos:pos + b]
            pos += b
            for bn, (m, v) in zip(bns, before):  # every rank starts from the same statistics
                bn.running_mean.copy_(m)
                bn.running_var.copy_(v)
            loss = F.cross_entropy(model(xs[idx]), ys[idx]) * (b / total)
            loss.backward()
            for bn, a in zip(bns, acc_stats):
                a[0] += bn.running_mean * (b / total)
                a[1] += bn.running_var * (b / total)
        else:
            for bn, a in zip(bns, acc_stats):
                bn.running_mean.copy_(a[0])
                bn.running_var.copy_(a[1])
            opt.step()
            sched.step()
            continue
        break
    for _ in range(zero_steps):  # steps where no rank trained a record: zero gradients, and an
        opt.zero_grad()          # optimizer.step() that still applies the momentum
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        return (model(test[0]).argmax(dim=1) == test[1]).float().mean().item()


def read_steps(out):
    """[[ids of rank 0, ids of rank 1, ...] per step] from the ledgers a docs_trainer run wrote
    (the records that counted; a rank absent from a step trained none in it)."""
    per = {}
    ranks = sorted(int(f[len("ledger-"):-len(".jsonl")]) for f in os.listdir(out) if f.startswith("ledger-"))
    steps = 0
    for r in ranks:
        with open(os.path.join(out, f"ledger-{r}.jsonl")) as f:
            for line in f:
                e = json.loads(line)
                if "step" in e:
                    per[(e["step"], r)] = e["ids"]
                    steps = max(steps, e["step"] + 1)
    with open(os.path.join(out, "result-0.json")) as f:
        result = json.load(f)
    steps = max(steps, result["steps"])
    return [[per.get((s, r), []) for r in ranks] for s in range(steps)], result


def replay(xs, ys, test, seed, steps, est_steps, sync=False, lr=0.1):
    """The docs trainer's updates on the records each rank trained at each step of a real run,
    as pacer.torch computes them (or, ``sync``, with BatchNorm statistics of the step's whole
    batch, as SyncBatchNorm would); a step where no rank trained a record still calls
    optimizer.step() on zero gradients, as the trainer does."""
    torch.manual_seed(seed)
    model = make_model("batch")
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.02, 1.0 - s / est_steps))
    model.train()
    for step in steps:
        opt.zero_grad()
        total = sum(len(ids) for ids in step)
        if total == 0:
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        elif sync:
            idx = torch.tensor([i for ids in step for i in ids])
            F.cross_entropy(model(xs[idx]), ys[idx]).backward()
        else:
            before = [(b.running_mean.clone(), b.running_var.clone()) for b in bns]
            acc_stats = [[torch.zeros_like(m), torch.zeros_like(v)] for m, v in before]
            for ids in step:
                if not ids:
                    continue
                idx = torch.tensor(ids if len(ids) > 1 else ids * 2)  # min_batch 2: repeated
                for bn, (m, v) in zip(bns, before):
                    bn.running_mean.copy_(m)
                    bn.running_var.copy_(v)
                (F.cross_entropy(model(xs[idx]), ys[idx]) * (len(ids) / total)).backward()
                for bn, a in zip(bns, acc_stats):
                    a[0] += bn.running_mean * (len(ids) / total)
                    a[1] += bn.running_var * (len(ids) / total)
            for bn, a in zip(bns, acc_stats):
                bn.running_mean.copy_(a[0])
                bn.running_var.copy_(a[1])
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        return (model(test[0]).argmax(dim=1) == test[1]).float().mean().item()


def replay_runs(args):
    """--replay DIR: each seed's none and dedicated runs of bench/torch_straggler_bench.py --out DIR."""
    test = tensors(2000, 10**9)
    data = None
    diffs = {"real": [], "replay": [], "sync": [], "recut": []}
    for seed_dir in sorted(d for d in os.listdir(args.replay) if d.startswith("seed")):
        seed = int(seed_dir[len("seed"):])
        acc = {}
        for policy in ("none", "dedicated"):
            steps, result = read_steps(os.path.join(args.replay, seed_dir, policy, "out"))
            n = sum(len(ids) for step in steps for ids in step)
            if data is None or len(data[0]) < n:
                data = tensors(n, 0)
            est = max(1, math.ceil(n / (len(steps[0]) * args.batch)))
            # the same records in the same order, cut into even steps (world x batch, as none's)
            flat = [i for step in steps for ids in step for i in ids]
            world = len(steps[0])
            recut = [[flat[j + r * args.batch:j + (r + 1) * args.batch] for r in range(world)]
                     for j in range(0, len(flat), world * args.batch)]
            acc[policy] = (result["accuracy"], replay(*data, test, seed, steps, est),
                           replay(*data, test, seed, steps, est, sync=True),
                           replay(*data, test, seed, recut, est))
        for k, i in (("real", 0), ("replay", 1), ("sync", 2), ("recut", 3)):
            diffs[k].append(100 * (acc["dedicated"][i] - acc["none"][i]))
        print(f"{seed_dir}: none / dedicated: real {acc['none'][0]:.4f} / {acc['dedicated'][0]:.4f}, "
              f"replayed {acc['none'][1]:.4f} / {acc['dedicated'][1]:.4f}, replayed with the step's "
              f"whole-batch statistics {acc['none'][2]:.4f} / {acc['dedicated'][2]:.4f}, the same order "
              f"in even steps {acc['none'][3]:.4f} / {acc['dedicated'][3]:.4f}", flush=True)
    for k, v in diffs.items():
        print(f"dedicated - none, {k}: mean {statistics.mean(v):+.2f} points "
              f"(per seed {', '.join(f'{x:+.2f}' for x in v)})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=120000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--plan-at", type=float, default=0.15)
    ap.add_argument("--constant-lr", action="store_true",
                    help="no learning-rate decay (the final accuracy then hangs on the last steps' noise)")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--zero-steps", type=int, default=0,
                    help="the planned cases end with this many steps where no rank trained a record "
                         "(zero gradients, optimizer.step() called: momentum still moves the model)")
    ap.add_argument("--replay", default="",
                    help="a bench/torch_straggler_bench.py --out DIR: replay each seed's runs from their ledgers")
    ap.add_argument("--batch", type=int, default=64, help="with --replay: the runs' --batch")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.replay:
        replay_runs(args)
        return 0
    xs, ys = tensors(args.records, 0)
    test = tensors(2000, 10**9)
    cases = [
        # name, norm, even batches, planned batches
        ("issue: 3 ranks, BatchNorm, even 64/64/64", "batch", [64, 64, 64], [64, 64, 64]),
        ("issue: 3 ranks, BatchNorm, planned 16/88/88", "batch", [64, 64, 64], [16, 88, 88]),
        ("issue: 3 ranks, BatchNorm, floor 32: 32/80/80", "batch", [64, 64, 64], [32, 80, 80]),
        ("issue: 3 ranks, BatchNorm, floor 48: 48/72/72", "batch", [64, 64, 64], [48, 72, 72]),
        ("issue: 3 ranks, GroupNorm, even", "group", [64, 64, 64], [64, 64, 64]),
        ("issue: 3 ranks, GroupNorm, planned 16/88/88", "group", [64, 64, 64], [16, 88, 88]),
        ("issue: 3 ranks, LayerNorm, even", "layer", [64, 64, 64], [64, 64, 64]),
        ("issue: 3 ranks, LayerNorm, planned 16/88/88", "layer", [64, 64, 64], [16, 88, 88]),
        ("bench: 4 ranks, BatchNorm, even 64x4", "batch", [64] * 4, [64] * 4),
        ("bench: 4 ranks, BatchNorm, planned 26/77/77/76", "batch", [64] * 4, [26, 77, 77, 76]),
        ("bench: 4 ranks, BatchNorm, planned 8/83/83/82", "batch", [64] * 4, [8, 83, 83, 82]),
        ("bench: 4 ranks, BatchNorm, floor 48: 48/70/69/69", "batch", [64] * 4, [48, 70, 69, 69]),
    ]
    # --only keeps the cases it names and the even case each is compared with
    cases = [c for c in cases
             if args.only in c[0] or (c[2] == c[3] and args.only.startswith(", ".join(c[0].split(", ")[:2])))]
    base = {}
    for name, norm, even, planned in cases:
        accs = [train(xs, ys, test, s, norm, even, planned, args.plan_at, decay=not args.constant_lr,
                      zero_steps=args.zero_steps if even != planned else 0)
                for s in range(args.seeds)]
        key = (name.split(":")[0], norm)
        if even == planned:
            base[key] = accs
        ref = base.get(key)
        diff = (f"mean diff vs even {100 * (statistics.mean(accs) - statistics.mean(ref)):+.2f} points "
                f"(per seed: {', '.join(f'{100 * (a - r):+.2f}' for a, r in zip(accs, ref))})"
                if ref is not None and even != planned else "")
        print(f"{name:50s} acc mean {statistics.mean(accs):.4f} "
              f"[{' '.join(f'{a:.4f}' for a in accs)}] {diff}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
