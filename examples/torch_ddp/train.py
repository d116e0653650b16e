#!/usr/bin/python3
"""Example (c) of the worker SDK: a PyTorch DDP trainer on Gloo reading leased shards.

Every rank connects to the job's pacerd with ``pacer.Client()`` (PACER_ADDR, PACER_TOKEN,
PACER_WORKER_ID from the environment the node agent sets, or flags), reads its batches through
``pacer.torch.LeasedShardDataset`` (shards leased and prefetched by the SDK; the service hands
each record out once per epoch across all ranks) and averages gradients with
``pacer.torch.weighted_average_hook``, so ranks may use different local batch sizes (the
controller's batch plan, applied by ``BatchPlanCallback``) and still take the full-batch step.
Synchronous ranks never wait on data a peer holds: a rank without data contributes weight 0,
and all ranks stop together when ``all_ranks_done`` says every rank's data has ended.

The task is generated: record i is a fixed random 20-d point labelled by a random teacher
(argmax of a linear plus a quadratic form, 4 classes); a held-out set from another seed measures accuracy.

    PACER_ADDR=127.0.0.1:7070 PACER_TOKEN=$(cat data/job.token) PACER_WORKER_ID=w0 \\
      /usr/bin/python3 examples/torch_ddp/train.py --rank 0 --world-size 2 \\
      --init-method file:///tmp/run1/store --batch 16 --register &
    ... same with --rank 1 --batch 48 ...

Under pacer-agent (which sets PACER_*, MASTER_ADDR and MASTER_PORT and replaces {rank} and
{worker_id}; docs/containers.md runs it so in containers):

    pacer-agent --addr ... --token-file ... --workers 2 --nnodes 2 --node-rank 0 \\
      --master-addr 127.0.0.1 --master-port 29500 -- \\
      python3 train.py --rank {rank} --world-size 4 --init-method env:// --register

Run with Debian's /usr/bin/python3 (python3-torch) and PYTHONPATH=build/python. Prints one JSON
line (accuracy, steps, samples, a parameter checksum that is equal on every rank, the batch plan's
version and local batch at the end); exits 3 when the accuracy is below --target-accuracy.
--ledger writes the record ids of every step, for tests that count each record.
"""

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import pacer
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
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--init-method", required=True, help="torch.distributed rendezvous (file://... or tcp://...)")
    ap.add_argument("--addr", default=None, help="pacerd address (default: PACER_ADDR)")
    ap.add_argument("--token-file", default=None, help="job token file (default: PACER_TOKEN)")
    ap.add_argument("--worker-id", default=None, help="default: PACER_WORKER_ID")
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--register", action="store_true", help="register the dataset (same spec on every rank)")
    ap.add_argument("--records", type=int, default=16384)
    ap.add_argument("--shard-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="initial local batch (until a plan arrives)")
    ap.add_argument("--hidden", type=int, default=128,
                    help="width of the hidden layer (more compute per record: a straggler's slower "
                         "compute then dominates the step)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--eval-records", type=int, default=2000)
    ap.add_argument("--target-accuracy", type=float, default=0.0)
    ap.add_argument("--result-file", default=None)
    ap.add_argument("--ledger", default=None,
                    help="append every step's plan version, local batch and record ids here, one JSON "
                         "line per step (tests count the records: each once per epoch)")
    args = ap.parse_args()

    torch.manual_seed(0)  # the same initial model on every rank
    torch.set_num_threads(1)
    data_x, data_y = generate(args.records, seed=1)

    client = pacer.Client(address=args.addr, token_file=args.token_file, worker_id=args.worker_id,
                          initial_micro_batch=args.batch)
    if args.register:
        client.register_dataset(args.dataset, num_records=args.records, shard_size=args.shard_size,
                                num_epochs=args.epochs, shuffle="records", seed=17)
    reader = pacer.ShardReader(client, dataset=args.dataset)
    dataset = pt.LeasedShardDataset(reader, lambda ids: (data_x[ids], data_y[ids]),
                                    batch_size=args.batch, lockstep=args.world_size > 1)
    plan_for_step = pt.BatchPlanCallback(client, targets=[dataset])

    dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank, world_size=args.world_size)
    model = torch.nn.Sequential(torch.nn.Linear(DIMS, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, CLASSES))
    ddp = DDP(model)
    hook_state = pt.WeightedAverageState()
    ddp.register_comm_hook(hook_state, pt.weighted_average_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    timer = pacer.StepTimer(client)

    ledger = open(args.ledger, "a") if args.ledger else None
    start = time.monotonic()
    batches = iter(dataset)
    step = samples_total = 0
    while True:
        plan = plan_for_step(step)
        with pt.timed_step(timer, step, plan.micro_batch, hook_state) as rec:
            with timer.data_wait():
                batch = next(batches)
            x, y = batch.data
            hook_state.local_batch = n = len(batch)
            loss = F.cross_entropy(ddp(x), y, reduction="sum") / max(n, 1)  # local mean
            opt.zero_grad()
            loss.backward()  # the hook leaves sum_i b_i g_i / sum_i b_i in every .grad
            if hook_state.last_total > 0:  # the same on every rank
                for group in opt.param_groups:  # decay: the final iterate, not a lucky one, is evaluated
                    group["lr"] = args.lr / (1.0 + step / 300.0)
                opt.step()
            rec.samples = n
        if ledger and n:
            ledger.write(json.dumps({"step": step, "plan": plan.version, "batch": plan.micro_batch,
                                     "ids": [int(i) for i in batch.ids]}) + "\n")
            ledger.flush()
        dataset.mark_consumed()
        samples_total += n
        step += 1
        if hook_state.last_total == 0 and pt.all_ranks_done(batch.end_of_data):
            break
        if client.stop_requested:
            break
        if step % 100 == 0 and args.rank == 0:
            print(f"step {step} loss {loss.item():.4f} local batch {plan.micro_batch}", file=sys.stderr)
    seconds = time.monotonic() - start
    client.flush(30_000)
    if ledger:
        ledger.close()

    ex, ey = generate(args.eval_records, seed=2)
    with torch.no_grad():
        accuracy = (model(ex).argmax(dim=1) == ey).float().mean().item()
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    result = {"worker": client.worker_id, "rank": args.rank, "accuracy": round(accuracy, 4), "steps": step,
              "samples": samples_total, "seconds": round(seconds, 2), "checksum": checksum,
              "plan_version": plan.version, "local_batch": plan.micro_batch}
    line = json.dumps(result)
    print(line, flush=True)
    if args.result_file:
        with open(args.result_file, "w") as f:
            f.write(line + "\n")
    client.close()
    dist.barrier()  # every rank reaches teardown together (Gloo + file:// store)
    dist.destroy_process_group()
    if args.target_accuracy and accuracy < args.target_accuracy:
        print(f"accuracy {accuracy:.4f} below target {args.target_accuracy}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
