"""The weighted all-reduce: one DDP communication hook that averages gradients weighted by the
samples each rank trained on, sum_i b_i g_i / sum_i b_i, in one all-reduce per bucket.

Both APIs use it: ``pacer.torch.DistributedDataParallel`` registers it with its step state
(``ddp.StepState``, which sends the module's buffers and the end-of-data counts in the same
all-reduce), and a low-level loop registers it itself with a ``WeightedAverageState``.

Wire layout of one bucket's all-reduce: ``[b_i * g_i, extra_i, b_i]``. ``extra_i`` is what the
state adds (``extra_numel`` / ``pack_extra``; nothing for ``WeightedAverageState``); every rank
of the group must use the same kind of state.
"""

import time
import warnings

import torch
import torch.distributed as dist


class WeightedAverageState:
    """State of ``weighted_average_hook`` for one DDP model.

    Set ``local_batch`` to the number of samples this rank's loss averaged over *before*
    ``backward()`` every step. After ``backward()``, ``last_total`` is sum_i b_i over the group
    (0: nobody had data; skip the optimizer step) and ``comm_ns`` the time the step's
    all-reduces were in flight (they overlap backward compute: an upper bound on the wait).

    A subclass may send more values in the same all-reduce: ``extra_numel(bucket)`` says how
    many, ``pack_extra`` writes this rank's, ``on_reduced`` reads the sums (and must call this
    class's ``on_reduced``).
    """

    def __init__(self, process_group=None):
        if type(self) is WeightedAverageState:  # pacer.torch's own step state is a subclass
            warnings.warn(
                "pacer.torch.WeightedAverageState / weighted_average_hook on your own DDP model "
                "are deprecated: use pacer.torch.DistributedDataParallel(model), or "
                "loss = pacer.torch.weighted(loss) with another engine (see docs/pytorch.md, "
                "\"Moving off the low-level API\")", DeprecationWarning, stacklevel=2)
        self.process_group = process_group
        self.local_batch = 0
        self.last_total = None
        self.comm_ns = 0

    def extra_numel(self, bucket):
        return 0

    def pack_extra(self, out, bucket):
        pass

    def on_launch(self, launched_ns):
        pass

    def on_reduced(self, extra, total, launched_ns):
        """Runs when the bucket's all-reduce is done, before the gradient is written back."""
        self.last_total = total
        self.comm_ns += time.monotonic_ns() - launched_ns


def weighted_average_hook(state, bucket):
    """DDP communication hook: the bucket's gradient becomes sum_i b_i g_i / sum_i b_i.

    One all-reduce per bucket of [b_i * g_i, (the state's extra values), b_i] (b_i packed in the
    gradient's dtype: exact for integer batch sizes below 2**24 in float32). A rank with
    b_i = 0 contributes zeros even when its local gradient is NaN (the mean over an empty
    batch). Register with ``ddp_model.register_comm_hook(state, weighted_average_hook)``.
    """
    grad = bucket.buffer()
    b = float(state.local_batch)
    g = grad.numel()
    k = state.extra_numel(bucket)
    packed = torch.empty(g + k + 1, dtype=grad.dtype, device=grad.device)
    if b > 0:
        torch.mul(grad.reshape(-1), b, out=packed[:g])
    else:
        packed[:g].zero_()  # an empty or repeated batch (or a NaN mean over nothing): nothing
    if k:
        state.pack_extra(packed[g:g + k], bucket)
    packed[-1] = b
    launched = time.monotonic_ns()
    state.on_launch(launched)
    fut = dist.all_reduce(packed, group=state.process_group, async_op=True).get_future()

    def finish(f):
        reduced = f.value()[0]
        total = float(reduced[-1].item())
        state.on_reduced(reduced[g:g + k], total, launched)
        if total > 0:
            grad.copy_(reduced[:g].view_as(grad).div_(total))
        else:
            grad.zero_()
        return grad

    return fut.then(finish)
