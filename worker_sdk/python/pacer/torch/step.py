"""The step in flight, as the loader hands it out and the model's all-reduce completes it.

``StepState`` is the ``WeightedAverageState`` that ``pacer.torch.DistributedDataParallel``
registers with ``weighted_average_hook``. The loader sets it at hand-out (``begin_step``); each
bucket's all-reduce carries, besides the weighted gradient, the counts every rank needs:
``[w_i g_i, (buffers, last bucket only), waiting_i * batch_i, waiting_i, ended_i, w_i]``.
After the backward every rank knows the total weight, whether every rank's data has ended (the
loop ends after this step on all of them), and how many other ranks waited for data this step
and with what batch (the loader's end-of-epoch hand-back).
"""

import time

import torch.distributed as dist

from pacer.torch.allreduce import WeightedAverageState
from pacer.torch.buffers import BufferSync
from pacer.torch.timing import CollectiveWait


class StepState(WeightedAverageState):
    """State of the weighted all-reduce for the step in flight (set by the loader at hand-out).
    ``local_batch`` is the samples of this rank's batch that count (0: a repeat)."""

    _EXTRA = 3  # waiting_i * batch_i, waiting_i, ended_i

    def __init__(self):
        super().__init__()
        self.ended = False        # this rank has no batch after this one
        self.waiting = False      # a repeat because the others hold the rest of the epoch
        self.batch = 0            # this rank's planned batch
        self.others_waiting = 0   # ranks other than this one that waited so, after backward
        self.waiting_batch = 0.0  # their mean planned batch
        self.all_ended = False    # every rank's data has ended after this step
        self.steps_reduced = 0    # buckets reduced (the loader checks that the hook runs)
        self.wait = CollectiveWait()
        self.lock = self.wait.lock
        self.buffers = BufferSync()  # none unless set_buffers (DDP's broadcast_buffers off)

    @property
    def weight(self):
        return self.local_batch

    def set_buffers(self, module, rank):
        self.buffers.attach(module, rank)

    def begin_step(self, weight, ended, waiting=False, batch=0):
        self.local_batch = weight
        self.ended = ended
        self.waiting = waiting
        self.batch = batch
        self.wait.reset()

    # Forward pre-hooks: of the DDP wrapper, then of the wrapped module.
    def enter_forward(self, *_):
        self.wait.enter_wrapper()

    def enter_module(self, module, _inputs):
        self.buffers.before_forward(self.local_batch, module.training)
        self.wait.enter_module()

    def wait_ns(self):
        """How long this rank waited for the others in the step (``CollectiveWait``)."""
        return self.wait.wait_ns()

    # The weighted all-reduce's extension points (allreduce.py).
    def _buffer_numel(self, bucket):
        # DDP's own broadcast of the buffers at every forward is off: they ride with the step's
        # last bucket (one collective per step instead of two).
        return self.buffers.numel() if bucket.is_last() else 0

    def extra_numel(self, bucket):
        return self._buffer_numel(bucket) + self._EXTRA

    def pack_extra(self, out, bucket):
        nbuf = out.numel() - self._EXTRA
        if nbuf:
            self.buffers.pack(out[:nbuf], float(self.local_batch))
        out[nbuf] = float(self.batch) if self.waiting else 0.0
        out[nbuf + 1] = 1.0 if self.waiting else 0.0
        out[nbuf + 2] = 1.0 if self.ended else 0.0

    def on_launch(self, launched_ns):
        self.wait.launched(launched_ns)

    def on_reduced(self, extra, total, launched_ns):
        nbuf = extra.numel() - self._EXTRA
        world = dist.get_world_size(self.process_group)
        waiting = int(round(float(extra[nbuf + 1].item()))) - (1 if self.waiting else 0)
        waiting_batch = float(extra[nbuf].item()) - (self.batch if self.waiting else 0)
        ended = float(extra[nbuf + 2].item())
        with self.lock:
            self.others_waiting = waiting
            self.waiting_batch = waiting_batch / waiting if waiting > 0 else 0.0
            self.wait.finished(time.monotonic_ns())
            super().on_reduced(extra, total, launched_ns)
            self.all_ended = ended >= world - 0.5
            self.steps_reduced += 1
        if nbuf:
            self.buffers.unpack(extra[:nbuf], total)
