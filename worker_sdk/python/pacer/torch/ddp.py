"""``pacer.torch.DistributedDataParallel``: torch's DDP with the weighted all-reduce."""

import torch
import torch.distributed as dist

from pacer.torch.allreduce import weighted_average_hook
from pacer.torch.session import SESSION


def DistributedDataParallel(module, *args, **kwargs):
    """``torch.nn.parallel.DistributedDataParallel`` with Pacer's gradient averaging: each
    rank's gradient counts by the samples it trained on this step, so the ranks may train on
    different batch sizes (the controller's plan) and the update still equals the full-batch
    gradient of the step's union of batches; the same all-reduce tells every rank when the
    data of all has ended. Takes DDP's arguments; returns the DDP module. The loss must be the
    mean over the local batch (as ``F.cross_entropy`` gives by default). One model per process."""
    if SESSION.model_attached:
        raise RuntimeError("pacer.torch.DistributedDataParallel: one wrapped model per process")
    # The buffers (BatchNorm statistics) are synced inside the gradient all-reduce, weighted by
    # each rank's samples, unless the caller asks for DDP's broadcast of rank 0's buffers.
    own_buffers = "broadcast_buffers" not in kwargs and len(args) < 4  # (device_ids, output_device, dim, broadcast_buffers, ...)
    if own_buffers:
        kwargs["broadcast_buffers"] = False
    ddp = torch.nn.parallel.DistributedDataParallel(module, *args, **kwargs)
    SESSION.process_group = kwargs.get("process_group")
    state = SESSION.hook
    if own_buffers:
        state.set_buffers(ddp.module, dist.get_rank(SESSION.process_group))
    ddp.register_comm_hook(state, weighted_average_hook)
    ddp.register_forward_pre_hook(state.enter_forward)
    ddp.module.register_forward_pre_hook(state.enter_module)
    SESSION.model_attached = True
    return ddp
