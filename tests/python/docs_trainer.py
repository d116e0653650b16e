#!/usr/bin/python3
"""A user's DDP trainer written only from docs/pytorch.md (no example code, no StepTimer): a
map-style dataset whose __getitem__ costs real CPU, num_workers=2, a BatchNorm MLP, checkpoint
and resume per the recipe. Used by the PyTorch acceptance tests and bench/torch_straggler_bench.py.

For the tests it also writes a ledger: one line per step with the records that counted
(loader.batch_info.records, when loader.weight > 0) as JSON {"attempt", "step", "ids"}, and one
"start" line per attempt naming the checkpoint it resumed from (with checkpoints on, a first
start saves one at step 0). Prints one JSON result line on rank 0.

    RECORDS, EPOCHS, BATCH, CKPT_EVERY, COST (per-sample work), OUT (a folder) come from flags.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import pacer.torch as pt

DIMS, CLASSES = 16, 4


def teacher():
    g = torch.Generator().manual_seed(7)
    return torch.randn(DIMS, CLASSES, generator=g), torch.randn(DIMS, CLASSES, generator=g)


class SyntheticDataset(torch.utils.data.Dataset):
    """Record i: a point drawn from seed i, labelled by a fixed teacher; `cost` rounds of extra
    CPU work per sample stand in for decoding and augmentation."""

    def __init__(self, n, cost, seed_base=0, stall_s=0.0):
        self.n, self.cost, self.seed_base, self.stall_s = n, cost, seed_base, stall_s
        self.linear, self.quadratic = teacher()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed_base + int(i))
        x = torch.randn(DIMS, generator=g)
        y = int((x @ self.linear + 0.25 * (x * x) @ self.quadratic).argmax())
        if self.stall_s:
            time.sleep(self.stall_s)  # tests: this rank's storage is slow (real latency)
        acc = x
        for _ in range(self.cost):  # the "decoding": real work, result discarded
            acc = torch.tanh(acc * 1.0001 + 0.001)
        return x + 0.0 * acc[0], y, int(i)


def lower_priority(_worker_id):
    """Loader processes yield the CPU to the training process (docs/pytorch.md, "CPU-bound
    hosts"): its collectives are not held up by decoding that can wait."""
    os.nice(10)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cost", type=int, default=40)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0, help="the model's initialisation and the loader's order")
    ap.add_argument("--ckpt-every", type=int, default=0, help="steps between checkpoints (0: none)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--die-at-step", type=int, default=-1, help="rank 1 of attempt 0 kills itself at this step")
    ap.add_argument("--slow-rank", type=int, default=-1, help="tests: this rank's records load slowly")
    ap.add_argument("--slow-ms", type=float, default=0.0, help="tests: per-record loading stall of --slow-rank")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dataset = SyntheticDataset(args.records, args.cost,
                               stall_s=args.slow_ms / 1000 if rank == args.slow_rank else 0.0)
    loader = pt.DataLoader(dataset, batch_size=args.batch, num_workers=args.num_workers,
                           epochs=args.epochs, seed=3 + args.seed, worker_init_fn=lower_priority)
    model = pt.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(DIMS, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Linear decay over the estimated steps (len(loader)), so the final accuracy does not hang
    # on the noise of the last few high-rate steps (runs compare within a point).
    steps = len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.02, 1.0 - s / steps))

    ckpt_path = os.path.join(args.out, "ckpt.pt")
    ledger = open(os.path.join(args.out, f"ledger-{rank}.jsonl"), "a")
    resumed = None

    def save_checkpoint():
        ledger.flush()
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                 "data": loader.state_dict(), "attempt": attempt}
        if rank == 0:
            torch.save(state, ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)

    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sched.load_state_dict(ckpt["sched"])
        loader.load_state_dict(ckpt["data"])
        resumed = {"attempt": ckpt["attempt"], "step": ckpt["data"]["step"]}
    ledger.write(json.dumps({"start": attempt, "resumed": resumed}) + "\n")
    ledger.flush()
    if resumed is None and args.ckpt_every:
        save_checkpoint()  # step 0: a restart before the next checkpoint starts over from here

    start = time.monotonic()
    samples = 0
    for x, y, ids in loader:
        step = loader.step - 1  # the step of this batch
        if rank == 1 and attempt == 0 and step == args.die_at_step:
            os.kill(os.getpid(), 9)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if loader.weight > 0:
            samples += loader.weight
            ledger.write(json.dumps({"attempt": attempt, "step": step,
                                     "ids": [i for _, i in loader.batch_info.records]}) + "\n")
        if args.ckpt_every and loader.step % args.ckpt_every == 0:
            save_checkpoint()
    seconds = time.monotonic() - start
    ledger.close()

    test = SyntheticDataset(2000, 0, seed_base=10**9)
    xs = torch.stack([test[i][0] for i in range(len(test))])
    ys = torch.tensor([test[i][1] for i in range(len(test))])
    model.eval()
    with torch.no_grad():
        accuracy = (model(xs).argmax(dim=1) == ys).float().mean().item()
    result = {"rank": rank, "attempt": attempt, "accuracy": round(accuracy, 4), "steps": loader.step,
              "samples": samples, "seconds": round(seconds, 2), "repeats": loader.repeats,
              "plans_applied": loader.plans_applied, "tail_releases": loader.tail_releases,
              "local_batch": loader.local_batch, "cpu_s": round(time.process_time(), 2),
              "checksum": float(sum(p.double().sum() for p in model.parameters()))}
    with open(os.path.join(args.out, f"result-{rank}.json"), "w") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
