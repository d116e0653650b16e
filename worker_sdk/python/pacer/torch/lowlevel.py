"""The low-level API (docs/design.md §6), for loops that drive a ``pacer.ShardReader`` themselves:
the dataset yields leased batches, the loop sets the weight of the weighted all-reduce
(``WeightedAverageState.local_batch``), times its steps and applies the batch plan.

- ``LeasedShardDataset``: an ``IterableDataset`` of batches read from leased shards through a
  ``pacer.ShardReader`` (the reader prefetches leases itself; use it in the training process,
  ``num_workers=0``).
- ``timed_step``: a context manager around one training step with a ``pacer.StepTimer``.
- ``BatchPlanCallback``: applies the controller's batch plan at the start of every step.
- ``all_ranks_done``: the lockstep end-of-data agreement for synchronous trainers.

``pacer.torch.DataLoader`` + ``pacer.torch.DistributedDataParallel`` (or ``pacer.torch.weighted``)
do all of this for a map-style dataset, and more: step times that count the loader processes,
BatchNorm statistics weighted by the samples, the end-of-epoch hand-back, exact checkpoints.
These pieces are deprecated (a ``DeprecationWarning`` names the replacement; the migration note:
docs/pytorch.md, "Moving off the low-level API"), except ``LeasedShardDataset`` with ``client=``,
the one way a PyTorch loop honours EXCLUDE_WORKERS today.
"""

import contextlib
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

import pacer


MIGRATION = "docs/pytorch.md, \"Moving off the low-level API\""


def deprecated(name, instead, stacklevel=3):
    """Warns that ``name`` of the low-level API is deprecated in favour of ``instead``."""
    warnings.warn(f"pacer.torch.{name} is deprecated: {instead} (see {MIGRATION})",
                  DeprecationWarning, stacklevel=stacklevel)


class LeasedBatch:
    """One batch: the record ids, what ``load(ids)`` made of them, and whether this rank's data
    has ended (then ``ids`` is empty)."""

    __slots__ = ("ids", "data", "end_of_data", "excluded")

    def __init__(self, ids, data, end_of_data, excluded=False):
        self.ids = ids
        self.data = data
        self.end_of_data = end_of_data
        self.excluded = excluded  # EXCLUDE_WORKERS: this rank trains on nothing (weight 0)

    def __len__(self):
        return len(self.ids)


class LeasedShardDataset(IterableDataset):
    """Batches of records from the shards this worker leases.

    ``load(ids)`` turns a list of record ids into the batch's data (e.g. ``(x, y)`` tensors); it
    must accept an empty list when ``lockstep`` is on. ``batch_size`` may change between batches
    (``BatchPlanCallback`` sets it from the plan).

    ``lockstep=False`` (independent workers, parameter server): blocks until records come and
    stops at the end of the data.
    ``lockstep=True`` (synchronous all-reduce): never blocks on data another rank holds; when
    the service says WAIT or this rank's data has ended it yields an *empty* batch (the rank
    then contributes weight 0 to the weighted average) and it never stops by itself: the
    training loop stops when ``all_ranks_done`` says every rank has ended.

    After training on a batch call ``mark_consumed()``: it queues the progress of every record
    handed out so far (never blocks; the client's reporter sends it).

    EXCLUDE_WORKERS (``lockstep=True`` with ``client=`` a ``pacer.Client(...,
    honors_exclusion=True)``): while ``client.excluded`` the job's steps do not wait for this
    rank. Asking for the next batch declares the previous one trained, so at that point the
    dataset hands the reader's leases back once (``reader.release_all()``; on an error it tries
    again at the next batch) and yields empty batches with ``excluded=True``: the rank joins
    the all-reduce with ``hook_state.local_batch = 0`` (weight 0 in ``weighted_average_hook``,
    so the others' update stays exact). The training loop still times a probe of about half
    its batch on data it already holds every couple of seconds (gradient discarded, reported
    with ``timed_step``) so pacerd sees it recover. When ``client.excluded`` turns False the
    dataset calls ``reader.resume()`` and reads as before. Honor exclusion only if every rank's
    loop does all this: pacerd excludes nobody while any live worker has not opted in.
    """

    def __init__(self, reader, load, batch_size=32, lockstep=False, client=None):
        super().__init__()
        if batch_size <= 0:
            raise ValueError("batch_size must be > 0")
        self.reader = reader
        self.load = load
        self.batch_size = batch_size
        self.lockstep = lockstep
        if client is not None and not lockstep:
            raise ValueError("client= (exclusion) needs lockstep=True")
        if client is None:
            deprecated("LeasedShardDataset", "use pacer.torch.DataLoader(dataset, batch_size) over a "
                       "map-style dataset whose __getitem__ does what load(ids) did per record")
        self.client = client

    def __iter__(self):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "LeasedShardDataset must be read in the training process (DataLoader "
                "num_workers=0): its ShardReader prefetches leases itself")
        blocking = pacer.Blocking.UNTIL_PREFETCHED if self.lockstep else pacer.Blocking.UNTIL_DATA
        ended = False
        handed_back = False
        while True:
            if self.client is not None and self.client.excluded:
                if not handed_back:
                    try:
                        self.reader.release_all()
                        handed_back = True
                    except pacer.Error:
                        pass  # leases not handed back yet (leasing stays stopped): next batch
                yield LeasedBatch([], self.load([]), False, excluded=True)
                continue
            if self.reader.holding_off:
                self.reader.resume()
            handed_back = False
            if not ended:
                outcome, ids = self.reader.next(self.batch_size, blocking)
                ended = outcome == pacer.Outcome.END_OF_DATA
            else:
                ids = []
            if not ids and not self.lockstep:
                if ended:
                    return
                continue  # UNTIL_DATA returns records or the end; never spin here
            yield LeasedBatch(ids, self.load(ids), ended and not ids)

    def mark_consumed(self):
        self.reader.mark_consumed()



class StepRecord:
    """What ``timed_step`` yields: set ``samples`` to the samples the step processed."""

    __slots__ = ("samples", "report")

    def __init__(self):
        self.samples = 0
        self.report = None  # the StepReport dict once the step ended


def timed_step(timer, step, local_batch, hook_state=None):
    """Times one step with a ``pacer.StepTimer``: wrap input waits in ``timer.data_wait()``;
    with ``hook_state`` the hook's all-reduce time counts as communication. The report is
    queued on the client (batched) when the block ends normally; a block that raises reports
    nothing. Deprecated: ``pacer.torch.DataLoader`` times every step itself."""
    deprecated("timed_step", "pacer.torch.DataLoader times every step itself, the loader "
               "processes' work included; drop the timer")
    return _timed_step(timer, step, local_batch, hook_state)


@contextlib.contextmanager
def _timed_step(timer, step, local_batch, hook_state):
    record = StepRecord()
    timer.begin_step(step)
    if hook_state is not None:
        hook_state.comm_ns = 0
    yield record
    if hook_state is not None and hook_state.comm_ns:
        timer.add(pacer.Phase.COMMUNICATION, hook_state.comm_ns)
    record.report = timer.end_step(local_batch, record.samples)


class BatchPlanCallback:
    """Call at the start of every step: returns the ``pacer.LocalBatch`` in force at ``step``
    (a new plan switches at its effective step, on every rank at the same step), tells the
    client the step, and when the plan changed sets ``batch_size`` on each target (e.g. a
    ``LeasedShardDataset``) and calls ``on_change(plan)``."""

    def __init__(self, client, targets=(), on_change=None):
        deprecated("BatchPlanCallback", "pacer.torch.DataLoader applies the batch plan itself "
                   "(loader.local_batch is the batch in force)")
        self.client = client
        self.targets = list(targets)
        self.on_change = on_change
        self._applied = None  # (version, micro_batch, accumulation_steps)

    def __call__(self, step):
        self.client.set_step(step)
        plan = self.client.batch_plan(step)
        key = (plan.version, plan.micro_batch, plan.accumulation_steps)
        if key != self._applied:
            self._applied = key
            for t in self.targets:
                t.batch_size = plan.micro_batch
            if self.on_change is not None:
                self.on_change(plan)
        return plan


def all_ranks_done(local_done, process_group=None):
    """True on every rank when every rank's data has ended (one all-reduce; call it on all
    ranks at the same step, e.g. when ``WeightedAverageState.last_total`` was 0). Deprecated:
    one pass over ``pacer.torch.DataLoader`` ends on every rank after the same step."""
    deprecated("all_ranks_done", "one pass over pacer.torch.DataLoader ends on every rank after "
               "the same step; drop the check")
    running = torch.tensor([0.0 if local_done else 1.0])
    dist.all_reduce(running, group=process_group)
    return running.item() == 0.0
