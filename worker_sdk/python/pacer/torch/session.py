"""Per process: the Pacer client, the step timer and the step state that ``pacer.torch.DataLoader``
and ``pacer.torch.DistributedDataParallel`` share (one of each per process)."""

import atexit

import torch.distributed as dist

import pacer
from pacer.torch.step import StepState


def dist_world(process_group=None):
    """(world size, rank) under torch.distributed, else (1, 0)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(process_group), dist.get_rank(process_group)
    return 1, 0


class Session:
    def __init__(self):
        self.client = None
        self.timer = None
        self.hook = StepState()
        self.loader = None
        self.model_attached = False

    @property
    def process_group(self):
        return self.hook.process_group

    @process_group.setter
    def process_group(self, group):
        self.hook.process_group = group  # the group the step's all-reduce runs on

    def connect(self, client=None, batch_size=32):
        if self.client is None:
            self.client = client if client is not None else pacer.Client(initial_micro_batch=batch_size)
            self.timer = pacer.StepTimer(self.client)
        return self.client

    def close(self):
        if self.client is not None and not self.client.closed:
            self.client.close()


SESSION = Session()


@atexit.register
def _close_session():
    try:
        SESSION.close()
    except Exception:  # noqa: BLE001  (interpreter exit: nothing left to report to)
        pass
