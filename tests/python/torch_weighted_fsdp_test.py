"""pacer.torch.weighted under torch's FullyShardedDataParallel (docs/pytorch.md, "Other
data-parallel engines"): one rank per GPU on NCCL, uneven batches, one SGD step; the parameters
(gathered with a full state dict) must equal those of one process stepping on the union of the
batches, and the same step without the helper must not. FSDP averages the ranks' gradients in
its reduce-scatter, which is what ``pt.weighted(loss)`` with the default ``reduction="mean"``
expects.

Needs CUDA, NCCL and a GPU (torch 1.13 runs FSDP only on GPUs; NCCL takes one GPU per rank, so
the world is the number of GPUs, at most 4; with one GPU the step is checked on one rank, where
the helper must leave the loss as it is). Otherwise it skips (exit 77) with a message.
"""

import sys

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

if not (torch.cuda.is_available() and torch.cuda.device_count() >= 1 and dist.is_nccl_available()):
    print("SKIP: needs CUDA, NCCL and at least one GPU (FSDP runs only on GPUs in torch 1.13)")
    sys.exit(77)

from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType

import gloo_ranks
from gloo_ranks import make_data, make_model
import pacer.torch as pt

WORLD = min(torch.cuda.device_count(), 4)
SIZES = [7, 13, 44, 3][:WORLD]
LR = 0.5
TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # float32 on GPU (TF32 off below)


def reference_state(x, y, device):
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    F.cross_entropy(model(x.to(device)), y.to(device)).backward()
    opt.step()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def fsdp_state(x, y, device, use_helper):
    model = FSDP(make_model().to(device), device_id=device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    if use_helper:
        loss = pt.weighted(loss, samples=len(y))
    loss.backward()
    if not use_helper or pt.weighted.total:
        opt.step()
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        state = model.state_dict()
    return {k: v.detach().cpu() for k, v in state.items()}


def max_diff(a, b):
    if sorted(a) != sorted(b):
        raise AssertionError(f"state dict keys differ: {sorted(a)} vs {sorted(b)}")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def worker(rank, store, result_dir):
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    device = torch.device("cuda", rank)
    failures = []
    x, y = make_data(sum(SIZES))
    want = reference_state(x, y, device)
    begin = sum(SIZES[:rank])
    xs, ys = x[begin:begin + SIZES[rank]], y[begin:begin + SIZES[rank]]
    got = fsdp_state(xs, ys, device, use_helper=True)
    d = max_diff(got, want)
    print(f"rank {rank} sizes {SIZES}: FSDP + pt.weighted vs the union's step: max |diff| {d:.3g}"
          f" (N = {pt.weighted.total})", flush=True)
    if not all(torch.allclose(got[k], want[k], **TOLERANCE) for k in want):
        failures.append(f"FSDP + pt.weighted: parameters differ from the union's step by {d}")
    if pt.weighted.total != sum(SIZES):
        failures.append(f"N = {pt.weighted.total}, not {sum(SIZES)}")
    if WORLD > 1:
        plain = max_diff(fsdp_state(xs, ys, device, use_helper=False), want)
        print(f"rank {rank}: FSDP without it: max |diff| {plain:.3g}", flush=True)
        if plain < 1e-3:
            failures.append(f"FSDP without the helper matched the union's step ({plain}): test too weak")
    gloo_ranks.write_verdict(result_dir, rank, failures)
    dist.barrier()
    dist.destroy_process_group()


def main():
    return gloo_ranks.report(gloo_ranks.run_ranks(worker, WORLD),
                             f"FSDP + pt.weighted == one step on the union of the batches on {WORLD} GPU(s)")


if __name__ == "__main__":
    sys.exit(main())
