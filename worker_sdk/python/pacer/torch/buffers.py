"""Module buffers kept in step by the gradient all-reduce (instead of DDP's broadcast of rank 0's
buffers at every forward): BatchNorm running statistics become the mean over the ranks weighted
by the samples that counted (a repeat batch, weight 0, moves nothing; a step where every rank
repeats leaves them as they were); any other floating-point buffer takes rank 0's value.

They ride with a step's last gradient bucket, so a step costs one collective, not two.
"""

import torch


class BufferSync:
    """The buffers of one module and how they travel in the all-reduce."""

    def __init__(self):
        self.stat_buffers = []    # BatchNorm running_mean / running_var
        self.other_buffers = []   # other floating-point buffers
        self.rank = 0
        self._snapshot = None     # the statistics before a weight-0 forward

    def attach(self, module, rank):
        self.rank = rank
        stats = set()
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats:
                for b in (m.running_mean, m.running_var):
                    if b is not None:
                        stats.add(id(b))
                        self.stat_buffers.append(b)
        self.other_buffers = [b for b in module.buffers()
                              if b.is_floating_point() and id(b) not in stats]

    def numel(self):
        return sum(b.numel() for b in self.stat_buffers) + sum(b.numel() for b in self.other_buffers)

    def before_forward(self, weight, training):
        """Called as the module's forward starts: a weight-0 training forward still moves the
        BatchNorm statistics, so they are kept to be put back should every rank repeat."""
        if weight == 0 and training and self.stat_buffers:
            self._snapshot = [b.detach().clone() for b in self.stat_buffers]

    def pack(self, out, weight):
        """Writes [w * stats, rank 0 ? others : 0] into ``out``."""
        i = 0
        for b in self.stat_buffers:
            n = b.numel()
            out[i:i + n].copy_(b.reshape(-1)).mul_(weight)
            i += n
        for b in self.other_buffers:
            n = b.numel()
            if self.rank == 0:
                out[i:i + n].copy_(b.reshape(-1))
            else:
                out[i:i + n].zero_()
            i += n

    def unpack(self, reduced, total):
        """Reads the sums back: the statistics divided by the total weight, the others as sent
        by rank 0."""
        i = 0
        with torch.no_grad():
            for k, b in enumerate(self.stat_buffers):
                n = b.numel()
                if total > 0:
                    b.copy_(reduced[i:i + n].view_as(b).div(total))
                elif self._snapshot is not None:
                    b.copy_(self._snapshot[k])  # every rank repeated: the statistics stay
                i += n
            for b in self.other_buffers:
                n = b.numel()
                b.copy_(reduced[i:i + n].view_as(b))
                i += n
        self._snapshot = None
