"""``pacer.torch.weighted``: sample weighting for any data-parallel engine (FSDP/FSDP2, DeepSpeed
ZeRO, Megatron-style loops, plain DDP), where a DDP communication hook does not apply.

Rank i trains on n_i counted samples and its loss is the mean over its local batch, so its
gradient is g_i. The update the ranks should take is the gradient of the union of their batches,
sum_i n_i g_i / N with N = sum_i n_i. An engine that averages gradients over the W data-parallel
ranks (sum_i g_i / W) gives exactly that when each rank's loss is first scaled by W n_i / N; an
engine that sums them (DeepSpeed's ``gradient_allreduce_op: sum``, FSDP2 with
``set_gradient_divide_factor(1.0)``) needs n_i / N. N costs one all-reduce of a few numbers per
step, issued before the backward; with ``pacer.torch.DataLoader`` the same all-reduce carries
what the loader needs from the step (every rank's end of data, who waited for records), which
``pacer.torch.DistributedDataParallel`` otherwise sends with the gradients.

A rank with n_i = 0 (a repeat batch, or an empty one whose mean loss is NaN) contributes zero:
its loss is replaced by 0 times the loss with NaN and infinities zeroed, so its backward still
runs through the engine (whose collectives need every rank) and sends zeros. N = 0 (no rank
trained a record) gives every rank a zero gradient; ``weighted.total`` (and
``loader.total_weight``) is then 0 on every rank, and the loop skips ``optimizer.step()``.
"""

import time

import torch
import torch.distributed as dist

from pacer.torch.session import SESSION

_REDUCTIONS = ("mean", "sum")


class Weighting:
    """``pacer.torch.weighted``: call it on the rank's mean loss, before the backward, on every
    rank at every step.

    ``weighted(loss)`` takes this rank's counted samples from ``pacer.torch.DataLoader`` (the
    batch it yielded last: ``loader.batch_info.weight``) and sums them over the loader's process
    group. ``weighted(loss, samples=n, group=g)`` is for loops without that loader: ``n`` is the
    samples the loss averaged over and ``g`` the data-parallel group the engine reduces over.
    ``reduction`` says what the engine does with the ranks' gradients: ``"mean"`` (DDP, FSDP,
    FSDP2 and DeepSpeed by default, Megatron's data-parallel gradient reduction) or ``"sum"``.

    Returns the loss to backward: ``loss * W * n_i / N`` (``loss * n_i / N`` for ``"sum"``), or
    zero with the loss's graph when n_i = 0 or N = 0. ``total`` is N of the last call."""

    def __init__(self):
        self.total = None

    def __call__(self, loss, samples=None, *, group=None, reduction="mean"):
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError("pacer.torch.weighted: loss must be a one-element tensor (the mean "
                            "loss over this rank's batch)")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"pacer.torch.weighted: reduction must be one of {_REDUCTIONS}, "
                             f"not {reduction!r}")
        state = SESSION.hook
        from_loader = samples is None
        if from_loader:
            if SESSION.loader is None:
                raise RuntimeError("pacer.torch.weighted(loss) takes the sample count from "
                                   "pacer.torch.DataLoader; without one, pass samples=")
            if group is not None:
                raise ValueError("pacer.torch.weighted(loss): the group is the loader's (pass "
                                 "process_group= to pacer.torch.DataLoader)")
            if SESSION.model_attached:
                raise RuntimeError(
                    "pacer.torch.weighted: the model is a pacer.torch.DistributedDataParallel, "
                    "which already weights the ranks by their samples; weighting the loss too "
                    "would count them twice (use one or the other: docs/pytorch.md)")
            if state.last_total is not None:
                raise RuntimeError("pacer.torch.weighted: called twice in one step (once per "
                                   "batch the loader yields)")
            group = SESSION.process_group
            n = state.local_batch
        else:
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
                raise ValueError(f"pacer.torch.weighted: samples must be an int >= 0, not {samples!r}")
            n = samples
        distributed = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size(group) if distributed else 1
        # [n_i, then what the loader's step state sends (StepState.pack_extra)]: float64 holds
        # the counts exactly; on the loss's device, so NCCL can reduce it.
        counts = torch.zeros(4 if from_loader else 1, dtype=torch.float64, device=loss.device)
        counts[0] = float(n)
        if from_loader:
            state.pack_extra(counts[1:], None)
        launched = time.monotonic_ns()
        if from_loader:
            state.on_launch(launched)
        if distributed and world > 1:
            dist.all_reduce(counts, group=group)
        total = float(counts[0].item())
        if from_loader:
            state.on_reduced(counts[1:], total, launched)
        self.total = total
        if n > 0 and total > 0:
            scale = (world if reduction == "mean" else 1) * n / total
            return loss * scale
        # Nothing of this rank counts (or nobody's): zero, through the loss's graph so that the
        # engine's backward collectives still run on this rank. A mean over an empty batch is
        # NaN: nan_to_num passes a zero gradient where its input is not finite.
        return torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0) * 0.0


weighted = Weighting()
