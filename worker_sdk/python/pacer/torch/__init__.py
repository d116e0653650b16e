"""PyTorch on Pacer (docs/pytorch.md): replace ``DistributedSampler`` and DDP with two calls.

    import pacer.torch as pt

    dist.init_process_group("gloo")                  # env:// from torchrun or pacer-agent
    loader = pt.DataLoader(dataset, batch_size=64, num_workers=2, epochs=3, seed=0)
    model = pt.DistributedDataParallel(MyModel())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in loader:                              # one pass covers all epochs
        loss = F.cross_entropy(model(x), y)          # the mean over the local batch
        opt.zero_grad(); loss.backward(); opt.step()

- ``DataLoader``: a torch DataLoader for a map-style dataset whose indices come from pacerd
  (every record trained once per epoch across the ranks, faster ranks train on more, the batch
  size follows the controller's plan); ``state_dict()`` / ``load_state_dict()`` pin the data
  position to a model checkpoint; ``batch_info`` says which records the batch just yielded
  holds (``BatchInfo``: index and epoch per sample, which of them count).
- ``DistributedDataParallel``: torch's DDP whose gradients are averaged weighted by the samples
  each rank trained on, so uneven batches still give the full-batch step; the same all-reduce
  keeps the module's buffers in step and ends the loop on every rank together.
- ``weighted``: the same weighting for any other data-parallel engine (FSDP/FSDP2, DeepSpeed,
  Megatron-style loops, plain DDP): ``loss = pt.weighted(loss)`` scales this rank's mean loss
  by W n_i / N before the engine averages the gradients.

Modules, one concept each:

- ``loader``: ``DataLoader`` (configuration, iteration, checkpoints);
- ``sampler``: its batch sampler, which leases records and cuts batches, and ``BatchInfo``;
- ``ddp``: ``DistributedDataParallel``;
- ``weighted``: ``weighted`` (loss weighting for engines other than pacer's DDP);
- ``allreduce``: the one weighted all-reduce (``weighted_average_hook`` and its
  ``WeightedAverageState``), used by both APIs;
- ``step``: the state of the step in flight that the loader and the all-reduce share;
- ``buffers``: module buffers (BatchNorm statistics) carried by the all-reduce;
- ``timing``: how a step's time and the loader processes' busy time are measured;
- ``session``: the per-process client, timer and step state;
- ``lowlevel``: the low-level API for loops that drive a ``pacer.ShardReader`` themselves
  (``LeasedShardDataset``, ``timed_step``, ``BatchPlanCallback``, ``all_ranks_done``; they
  register ``weighted_average_hook`` with a ``WeightedAverageState`` on a plain DDP model).

Loss convention: each rank's loss is the *mean over its local batch* (sum / b_i, 0 when
b_i = 0); the weighted all-reduce turns the local means into the global weighted mean.
"""

from pacer.torch.allreduce import WeightedAverageState, weighted_average_hook  # noqa: F401
from pacer.torch.ddp import DistributedDataParallel  # noqa: F401
from pacer.torch.loader import CHECKPOINT_FORMAT, DataLoader  # noqa: F401
from pacer.torch.sampler import BatchInfo  # noqa: F401
from pacer.torch.weighted import Weighting, weighted  # noqa: F401
from pacer.torch.lowlevel import (  # noqa: F401
    BatchPlanCallback,
    LeasedBatch,
    LeasedShardDataset,
    StepRecord,
    all_ranks_done,
    timed_step,
)
from pacer.torch.session import SESSION as _SESSION  # noqa: F401  (tests reach the step state)

__all__ = [
    "DataLoader",
    "BatchInfo",
    "DistributedDataParallel",
    "weighted",
    "Weighting",
    "CHECKPOINT_FORMAT",
    "LeasedBatch",
    "LeasedShardDataset",
    "WeightedAverageState",
    "weighted_average_hook",
    "StepRecord",
    "timed_step",
    "BatchPlanCallback",
    "all_ranks_done",
]
