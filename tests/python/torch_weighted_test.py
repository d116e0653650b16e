"""Numerical test of pacer.torch.weighted, the loss weighting for engines other than pacer's DDP
(docs/pytorch.md, "Other data-parallel engines").

Three ranks on a Gloo process group (torch.multiprocessing.spawn, file:// rendezvous in a
private temp dir) hold uneven batches of one data set and take one SGD step; the parameters
after it must equal, to float tolerance, those of one process stepping on the union of the
batches:

  - plain torch DDP (no communication hook: DDP's mean over the ranks) with
    ``loss = pt.weighted(loss, samples=n_i)``;
  - a hand-written sharded step, as FSDP / ZeRO do it: each rank holds 1/W of the flat
    parameters, gathers them for forward and backward, reduces the flat gradient to its shard
    averaged over the ranks, steps its shard and gathers the shards again. torch 1.13's Gloo
    has no reduce_scatter, so the reduce-scatter is emulated by an all_reduce of the whole flat
    gradient of which each rank keeps its own shard (the same values reduce_scatter gives; the
    all-gathers are real);
  - a rank with an empty batch (its mean loss is NaN) contributes zero;
  - no rank with data (N = 0): ``pt.weighted.total`` is 0 on every rank and every gradient is
    zero, so the loop skips the step and the parameters stay.

Each case is also run without the helper, which must *not* match (so the test tells a wrong
weighting from a right one). Skips (exit 77, ctest SKIP_RETURN_CODE) without torch.
"""

import sys

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.utils import parameters_to_vector, vector_to_parameters
except ImportError as e:  # CI installs python3-torch; elsewhere this is a skip, not a pass
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

import gloo_ranks
from gloo_ranks import make_data, make_model
import pacer.torch as pt

WORLD = 3
LR = 0.5
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # float32
DIFFERENT = 1e-4  # an unweighted step must differ from the reference by more than this


def reference_step(x, y):
    """One process, the union of the batches: its parameters after one SGD step."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if len(y):
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return parameters_to_vector(model.parameters()).detach()


def mean_loss(model, x, y):
    """The rank's loss as a training loop writes it: the mean over its local batch (NaN when the
    batch is empty)."""
    return F.cross_entropy(model(x), y)


def ddp_step(x, y, use_helper):
    """Plain torch DDP (its mean over the ranks, no hook), with or without pt.weighted. Returns
    the parameters after the step (skipped when N = 0) and N."""
    ddp = DDP(make_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    loss = mean_loss(ddp, x, y)
    total = None
    if use_helper:
        loss = pt.weighted(loss, samples=len(y))
        total = pt.weighted.total
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
    if total != 0:
        opt.step()
    return parameters_to_vector(ddp.parameters()).detach(), total, grads


def sharded_step(x, y, use_helper):
    """One step of a hand-written fully sharded data-parallel model: returns the full parameters
    gathered after the step, N and this rank's gradient shard."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()  # the same initial values everywhere; each rank keeps only its shard
    flat = parameters_to_vector(model.parameters()).detach()
    shard_len = -(-flat.numel() // world)
    padded = torch.zeros(shard_len * world)
    padded[:flat.numel()] = flat
    shard = padded[rank * shard_len:(rank + 1) * shard_len].clone()
    del flat, padded

    def gather(own):
        parts = [torch.empty(shard_len) for _ in range(world)]
        dist.all_gather(parts, own)
        return torch.cat(parts)

    # Forward and backward with the gathered parameters.
    full = gather(shard)
    vector_to_parameters(full[:sum(p.numel() for p in model.parameters())], model.parameters())
    loss = mean_loss(model, x, y)
    total = None
    if use_helper:
        loss = pt.weighted(loss, samples=len(y))
        total = pt.weighted.total
    model.zero_grad()
    loss.backward()
    grad = torch.zeros(shard_len * world)
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    grad[:g.numel()] = g
    # Reduce-scatter, emulated (Gloo in torch 1.13 has none): the sum over the ranks of the
    # whole flat gradient, of which this rank keeps its shard, divided by the world size as
    # FSDP and ZeRO average.
    dist.all_reduce(grad)
    grad_shard = grad[rank * shard_len:(rank + 1) * shard_len] / world
    if total != 0:
        shard -= LR * grad_shard  # SGD on this rank's shard
    after = gather(shard)
    return after[:g.numel()], total, grad_shard


def worker(rank, store, result_dir):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    failures = []
    for sizes in ([7, 13, 44], [0, 20, 44], [0, 0, 0]):
        n = sum(sizes)
        x, y = make_data(n)
        want = reference_step(x, y)
        begin = sum(sizes[:rank])
        xs, ys = x[begin:begin + sizes[rank]], y[begin:begin + sizes[rank]]
        for name, step in (("plain DDP", ddp_step), ("sharded", sharded_step)):
            got, total, grads = step(xs, ys, use_helper=True)
            d = (got - want).abs().max().item()
            print(f"rank {rank} sizes {sizes} {name} + pt.weighted: max |param - reference| {d:.3g}"
                  f" (N = {total})", flush=True)
            if not torch.allclose(got, want, **TOLERANCE):
                failures.append(f"sizes {sizes} {name}: parameters differ from the union's step by {d}")
            if total != n:
                failures.append(f"sizes {sizes} {name}: N = {total}, not {n}")
            if n == 0 and not (torch.isfinite(grads).all() and grads.abs().max().item() == 0):
                failures.append(f"sizes {sizes} {name}: N = 0 but the gradient is not zero")
            if 0 not in sizes:  # without the helper the engine's mean of local means is wrong
                plain, _, _ = step(xs, ys, use_helper=False)
                pd = (plain - want).abs().max().item()
                print(f"rank {rank} sizes {sizes} {name} without it: max |param - reference| {pd:.3g}",
                      flush=True)
                if pd < DIFFERENT:
                    failures.append(f"sizes {sizes} {name}: the unweighted step matched the "
                                    f"union's ({pd}): the test cannot tell a wrong weighting")
    gloo_ranks.write_verdict(result_dir, rank, failures)
    dist.barrier()
    dist.destroy_process_group()


def main():
    torch.set_num_threads(1)
    return gloo_ranks.report(
        gloo_ranks.run_ranks(worker, WORLD),
        "plain DDP and a sharded step with pt.weighted == one step on the union of the batches "
        "(rtol 1e-5, atol 1e-6) on 3 Gloo ranks, with an empty batch and with N = 0")


if __name__ == "__main__":
    sys.exit(main())
