#!/usr/bin/python3
"""Example (c) of the worker SDK: a PyTorch DDP trainer on Gloo with Pacer (docs/pytorch.md).

The two calls that make a DDP script a Pacer job: ``pacer.torch.DataLoader`` over a map-style
dataset (its indices come from pacerd: every record once per epoch across the ranks, faster
ranks train on more, the batch size follows the controller's plan) and
``pacer.torch.DistributedDataParallel`` (gradients averaged weighted by the samples each rank
trained on, so uneven batches still take the full-batch step). The loop is plain PyTorch.

The task is generated: record i is a fixed random 20-d point labelled by a random teacher
(argmax of a linear plus a quadratic form, 4 classes); a held-out set from another seed
measures accuracy. Start it like any torchrun script, with pacerd's address and job token:

    PACER_ADDR=127.0.0.1:7070 PACER_TOKEN=$(cat data/job.token) PYTHONPATH=build/python \\
      torchrun --nproc_per_node 2 --redirects 1 --tee 1 examples/torch_ddp/train.py
    pacer-agent --addr 127.0.0.1:7070 --token-file data/job.token --workers 2 -- \\
      /usr/bin/python3 examples/torch_ddp/train.py

Run with Debian's /usr/bin/python3 (python3-torch). Prints one JSON line per rank (accuracy,
steps, samples, a parameter checksum that is equal on every rank, the batch plan's version and
the local batch at the end); exits 3 when the accuracy is below --target-accuracy.

--ledger DIR writes ledger-RANK.jsonl there: one line per step with the (epoch, index) pairs
the step trained on (``loader.batch_info.records``), the plan's version and the local batch,
each line on disk before pacerd counts the step's records (tests count every record once per
epoch across the ranks). --hidden widens the hidden layer: more compute per record, so that a
slowed rank's compute dominates its step.
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

DIMS, CLASSES = 20, 4


def generate(n, seed):
    """n points and their teacher labels (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    linear = torch.randn(DIMS, CLASSES, generator=torch.Generator().manual_seed(7))
    quadratic = torch.randn(DIMS, CLASSES, generator=torch.Generator().manual_seed(8))
    x = torch.randn(n, DIMS, generator=g)
    y = (x @ linear + 0.25 * (x * x) @ quadratic).argmax(dim=1)
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=16384)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="this rank's starting batch (the plan changes it)")
    ap.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--eval-records", type=int, default=2000)
    ap.add_argument("--target-accuracy", type=float, default=0.0)
    ap.add_argument("--result-dir", default=None, help="write result-RANK.json here")
    ap.add_argument("--ledger", default=None, metavar="DIR",
                    help="write ledger-RANK.jsonl here: the records each step trained on")
    args = ap.parse_args()
    torch.manual_seed(0)  # the same initial model on every rank
    torch.set_num_threads(1)

    dist.init_process_group("gloo")  # env:// from torchrun or pacer-agent
    dataset = torch.utils.data.TensorDataset(*generate(args.records, seed=1))
    loader = pt.DataLoader(dataset, batch_size=args.batch, epochs=args.epochs, seed=17, shard_size=256)
    model = pt.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(DIMS, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Decay: the final iterate, not a lucky one, is evaluated.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1.0 + step / 300.0))

    ledger = open(os.path.join(args.ledger, f"ledger-{dist.get_rank()}.jsonl"), "w") if args.ledger else None
    start = time.monotonic()
    samples = 0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)  # the mean over the local batch
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        samples += loader.weight  # 0 for a repeated batch (the others hold the rest of the epoch)
        if ledger and loader.weight:
            info = loader.batch_info
            ledger.write(json.dumps({"step": info.step, "records": info.records,
                                     "plan": loader.client.current_plan.version,
                                     "batch": loader.local_batch}) + "\n")
            # On disk before the next batch is asked for, which is when pacerd counts this one.
            ledger.flush()
            os.fsync(ledger.fileno())
        if loader.step % 100 == 0 and dist.get_rank() == 0:
            print(f"step {loader.step} loss {loss.item():.4f} local batch {loader.local_batch}", file=sys.stderr)
    seconds = time.monotonic() - start
    if ledger:
        ledger.close()

    ex, ey = generate(args.eval_records, seed=2)
    with torch.no_grad():
        accuracy = (model.module(ex).argmax(dim=1) == ey).float().mean().item()
    result = {"worker": loader.client.worker_id, "rank": dist.get_rank(), "accuracy": round(accuracy, 4),
              "steps": loader.step, "samples": samples, "seconds": round(seconds, 2),
              "plan_version": loader.client.current_plan.version, "local_batch": loader.local_batch,
              "checksum": float(sum(p.double().sum() for p in model.parameters()))}
    print(json.dumps(result), flush=True)
    if args.result_dir:
        with open(os.path.join(args.result_dir, f"result-{dist.get_rank()}.json"), "w") as f:
            f.write(json.dumps(result) + "\n")
    dist.barrier()  # every rank reaches teardown together
    dist.destroy_process_group()
    if args.target_accuracy and accuracy < args.target_accuracy:
        print(f"accuracy {accuracy:.4f} below target {args.target_accuracy}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
