"""How ``pacer.torch.DataLoader`` measures a step (docs/pytorch.md, "Step times").

A step lasts from handing out one batch to handing out the next, minus the time the step's
collectives kept this rank waiting for the others (``CollectiveWait``), but only as far as the
rank's loader processes were idle meanwhile: every batch carries how long the loader processes
were busy with it (``TimedDataset`` + ``TimedCollate`` in the loader processes,
``LoaderBusyTime`` in the trainer process).
"""

import threading
import time

import torch

# The tag of a batch that carries its loading interval (TimedCollate -> LoaderBusyTime).
TIMED = "pacer.torch.timed-batch"


class Empty:
    """What the collate wrapper makes of a batch without indices (a step with nothing to train)."""


EMPTY = Empty()


class CollectiveWait:
    """How long this rank waited for the others in one step: in DDP's forward collective (the
    broadcast of rank 0's buffers, timed from the wrapper's forward pre-hook to the wrapped
    module's) and at the end of the backward (from launching the last bucket's all-reduce to
    its result). The all-reduce callbacks may run on another thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.max_launch_ns = 0
        self.max_finish_ns = 0
        self.forward_wait_ns = 0
        self._outer_ns = 0

    def reset(self):
        self.max_launch_ns = self.max_finish_ns = 0
        self.forward_wait_ns = 0
        self._outer_ns = 0

    def launched(self, ns):
        with self.lock:
            self.max_launch_ns = max(self.max_launch_ns, ns)

    def finished(self, ns):
        """Called with the step state's lock held by the all-reduce callback."""
        self.max_finish_ns = max(self.max_finish_ns, ns)

    def enter_wrapper(self):
        self._outer_ns = time.monotonic_ns()

    def enter_module(self):
        if self._outer_ns:
            self.forward_wait_ns += time.monotonic_ns() - self._outer_ns
            self._outer_ns = 0

    def wait_ns(self):
        with self.lock:
            tail = (self.max_finish_ns - self.max_launch_ns
                    if self.max_finish_ns > self.max_launch_ns > 0 else 0)
        return tail + self.forward_wait_ns


class TimedDataset(torch.utils.data.Dataset):
    """The user's dataset as the torch DataLoader sees it: notes when a loader process starts
    on a batch (its first ``dataset[i]``), so that ``TimedCollate`` can say how long the batch
    took."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.batch_start_ns = None

    def __len__(self):
        return len(self.dataset)

    def __getattr__(self, name):
        # get_worker_info().dataset in a worker_init_fn is this wrapper: the user's attributes
        # stay reachable through it.
        if name in ("dataset", "batch_start_ns") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, i):
        if self.batch_start_ns is None:
            self.batch_start_ns = time.monotonic_ns()
        return self.dataset[i]


class TimedCollate:
    """Runs in the loader process: the user's collate, and the batch's loading interval
    (first ``dataset[i]`` to the end of collate, on the host's monotonic clock)."""

    def __init__(self, collate_fn, timed):
        self.collate_fn = collate_fn
        self.timed = timed

    def __call__(self, samples):
        start = self.timed.batch_start_ns
        self.timed.batch_start_ns = None
        if not samples:
            return EMPTY
        data = self.collate_fn(samples)
        end = time.monotonic_ns()
        return (TIMED, data, start if start is not None else end, end)


class LoaderBusyTime:
    """In the trainer process: unwraps the batches from the loader processes and estimates how
    long they were busy with each."""

    def __init__(self):
        self._covered_ns = 0          # loading intervals counted up to here
        self._per_sample_ns = None    # smoothed loader busy time per sample

    def unwrap(self, data, item):
        """Returns the user's batch and sets ``item.loader_ns``: the union of the batches'
        loading intervals (two processes decoding at once share the rank's CPU, so their overlap
        counts once), the part not covered yet."""
        if isinstance(data, (tuple, list)) and len(data) == 4 and data[0] == TIMED:
            _, data, start, end = data
            start, end = int(start), int(end)
            busy = max(0, end - max(start, self._covered_ns))
            self._covered_ns = max(self._covered_ns, end)
            if item.size > 0:
                # Which of two overlapping batches gets the overlap is arbitrary: the cost per
                # sample is smoothed over the last few batches (a contention still shows
                # within a few steps).
                per_sample = busy / item.size
                prev = self._per_sample_ns
                self._per_sample_ns = per_sample if prev is None else prev + 0.3 * (per_sample - prev)
                item.loader_ns = int(self._per_sample_ns * item.size)
        return data
