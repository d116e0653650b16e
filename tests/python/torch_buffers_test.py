"""pacer.torch.DistributedDataParallel keeps the module's buffers in step without DDP's
broadcast: BatchNorm running statistics are averaged over the ranks inside the step's gradient
all-reduce, weighted by the samples each rank's batch counted; a repeat batch (weight 0) moves
nothing; a step where every rank repeated leaves them as they were; another floating-point
buffer takes rank 0's value. Three ranks on Gloo (file:// store in a private temp dir), uneven
batches; the expected statistics are computed in one process from the union of the batches.

Skips (77) without torch.
"""

import sys

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

import gloo_ranks
import pacer.torch as pt

WORLD = 3
MOMENTUM = 0.1
TOL = dict(rtol=1e-5, atol=1e-6)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.fc = torch.nn.Linear(6, 8)
        self.bn = torch.nn.BatchNorm1d(8, momentum=MOMENTUM)
        self.out = torch.nn.Linear(8, 3)
        self.register_buffer("scale", torch.tensor([1.0]))

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def expected_stats(net, batches, weights, mean, var):
    """Running stats after one step: (1-m) r + m * sum_i w_i s_i / sum_i w_i over the ranks with
    w_i > 0, where s_i is rank i's batch statistic (BatchNorm's own update, per rank)."""
    total = sum(weights)
    if total == 0:
        return mean.clone(), var.clone()
    m_acc, v_acc = torch.zeros_like(mean), torch.zeros_like(var)
    with torch.no_grad():
        for (x, _), w in zip(batches, weights):
            if w == 0:
                continue
            h = net.fc(x)
            m_acc += w * ((1 - MOMENTUM) * mean + MOMENTUM * h.mean(0))
            v_acc += w * ((1 - MOMENTUM) * var + MOMENTUM * h.var(0, unbiased=True))
    return m_acc / total, v_acc / total


def worker(rank, store, result_dir):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    failures = []
    model = pt.DistributedDataParallel(Net())
    if model.broadcast_buffers:
        failures.append("DDP's per-forward buffer broadcast is still on")
    net = model.module
    if rank == 0:
        with torch.no_grad():
            net.scale.fill_(3.0)  # another buffer: every rank must end with rank 0's value
    hook = pt._SESSION.hook
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay: stats only depend on fc
    cases = [
        ("uneven batches", [2, 10, 30], [2, 10, 30]),
        ("rank 2 repeats (weight 0)", [4, 12, 9], [4, 12, 0]),
        ("every rank repeats", [3, 5, 7], [0, 0, 0]),
    ]
    for k, (name, sizes, weights) in enumerate(cases):
        batches = [data(sizes[r], 100 * k + r) for r in range(WORLD)]
        mean0 = net.bn.running_mean.clone()
        var0 = net.bn.running_var.clone()
        want_mean, want_var = expected_stats(net, batches, weights, mean0, var0)
        hook.begin_step(weights[rank], False)
        hook.last_total = None
        x, y = batches[rank]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hook.last_total != sum(weights):
            failures.append(f"{name}: total weight {hook.last_total} != {sum(weights)}")
        got = [net.bn.running_mean.clone(), net.bn.running_var.clone()]
        for label, g, w in (("running_mean", got[0], want_mean), ("running_var", got[1], want_var)):
            if not torch.allclose(g, w, **TOL):
                failures.append(f"{name}: {label} off by {(g - w).abs().max().item():.3g}")
        if sum(weights) == 0 and not (torch.equal(got[0], mean0) and torch.equal(got[1], var0)):
            failures.append(f"{name}: the statistics moved in a step where every rank repeated")
        gathered = [torch.zeros(16) for _ in range(WORLD)]
        dist.all_gather(gathered, torch.cat(got))
        if not all(torch.equal(gathered[0], t) for t in gathered):
            failures.append(f"{name}: ranks hold different statistics")
        if net.scale.item() != 3.0:
            failures.append(f"{name}: buffer 'scale' is {net.scale.item()}, not rank 0's 3.0")
        print(f"rank {rank} {name}: mean err {(got[0] - want_mean).abs().max().item():.2g}", flush=True)
    gloo_ranks.write_verdict(result_dir, rank, failures)
    dist.barrier()
    dist.destroy_process_group()


def main():
    torch.set_num_threads(1)
    return gloo_ranks.report(gloo_ranks.run_ranks(worker, WORLD),
                             "BatchNorm statistics = weighted mean over the ranks' batches, "
                             "repeats excluded, equal on every rank; other buffers from rank 0")


if __name__ == "__main__":
    sys.exit(main())
