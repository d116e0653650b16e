"""PyTorch helpers for the Pacer worker SDK (docs/design.md §6).

- ``LeasedShardDataset``: an ``IterableDataset`` of batches read from leased shards through a
  ``pacer.ShardReader`` (the reader prefetches leases itself; use it in the training process,
  ``num_workers=0``).
- ``WeightedAverageState`` + ``weighted_average_hook``: a DDP communication hook that averages
  gradients weighted by each rank's local batch size, sum_i b_i g_i / sum_i b_i, in one
  all-reduce per bucket (the scaled gradient with b_i appended). With uneven batches (or a rank
  with none, b_i = 0) the update equals the full-batch gradient of the union of the batches.
- ``timed_step``: a context manager around one training step with a ``pacer.StepTimer``.
- ``BatchPlanCallback``: applies the controller's batch plan at the start of every step.
- ``all_ranks_done``: the lockstep end-of-data agreement for synchronous trainers.

Loss convention: each rank's loss is the *mean over its local batch* (sum / b_i, 0 when
b_i = 0); the hook turns the local means into the global weighted mean.
"""

import contextlib
import time

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

import pacer


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


class WeightedAverageState:
    """State of ``weighted_average_hook`` for one DDP model.

    Set ``local_batch`` to the number of samples this rank's loss averaged over *before*
    ``backward()`` every step. After ``backward()``, ``last_total`` is sum_i b_i over the group
    (0: nobody had data; skip the optimizer step) and ``comm_ns`` the time the step's
    all-reduces were in flight (they overlap backward compute: an upper bound on the wait).
    """

    def __init__(self, process_group=None):
        self.process_group = process_group
        self.local_batch = 0
        self.last_total = None
        self.comm_ns = 0


def weighted_average_hook(state, bucket):
    """DDP communication hook: the bucket's gradient becomes sum_i b_i g_i / sum_i b_i.

    One all-reduce per bucket of [b_i * g_i, b_i] (b_i packed in the gradient's dtype: exact for
    integer batch sizes below 2**24 in float32). A rank with b_i = 0 contributes zeros even when
    its local gradient is NaN (the mean over an empty batch). Register with
    ``ddp_model.register_comm_hook(state, weighted_average_hook)``.
    """
    grad = bucket.buffer()
    b = float(state.local_batch)
    packed = torch.empty(grad.numel() + 1, dtype=grad.dtype, device=grad.device)
    if b > 0:
        torch.mul(grad.reshape(-1), b, out=packed[:-1])
    else:
        packed[:-1].zero_()
    packed[-1] = b
    start = time.monotonic_ns()
    fut = dist.all_reduce(packed, group=state.process_group, async_op=True).get_future()

    def finish(f):
        reduced = f.value()[0]
        total = float(reduced[-1].item())
        state.last_total = total
        state.comm_ns += time.monotonic_ns() - start
        if total > 0:
            grad.copy_(reduced[:-1].view_as(grad).div_(total))
        else:
            grad.zero_()
        return grad

    return fut.then(finish)


class StepRecord:
    """What ``timed_step`` yields: set ``samples`` to the samples the step processed."""

    __slots__ = ("samples", "report")

    def __init__(self):
        self.samples = 0
        self.report = None  # the StepReport dict once the step ended


@contextlib.contextmanager
def timed_step(timer, step, local_batch, hook_state=None):
    """Times one step with a ``pacer.StepTimer``: wrap input waits in ``timer.data_wait()``;
    with ``hook_state`` the hook's all-reduce time counts as communication. The report is
    queued on the client (batched) when the block ends normally; a block that raises reports
    nothing."""
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
    ranks at the same step, e.g. when ``WeightedAverageState.last_total`` was 0)."""
    running = torch.tensor([0.0 if local_done else 1.0])
    dist.all_reduce(running, group=process_group)
    return running.item() == 0.0


# ---------------------------------------------------------------------------------------------
# The conventional API (docs/pytorch.md): pacer.torch.DataLoader + pacer.torch.DistributedDataParallel.
#
# What the two do together, per step t of a synchronous job:
#   - the loader's batch sampler runs in the trainer process: it leases shards (ShardReader),
#     cuts batches of the planned size (at least ``min_batch``) and hands their indices to the
#     torch DataLoader, whose worker processes call ``dataset[i]`` and collate;
#   - handing out batch t+1 declares batch t trained (its records' progress is queued: only
#     what was trained, never what is prefetched), reports step t's time (from handing out t
#     to handing out t+1, minus the time the step's all-reduce kept this rank waiting) and its
#     samples, and applies a new batch plan;
#   - the comm hook averages gradients weighted by each rank's batch and, in the same
#     all-reduce, counts the ranks whose data has ended; when all have, the loop ends on every
#     rank after the same step. A rank with nothing to train on at a step (the others hold the
#     rest of the epoch) gets its previous batch again with weight 0.
# ---------------------------------------------------------------------------------------------

import atexit
import math
import os
import secrets
import threading
from collections import deque

CHECKPOINT_FORMAT = "pacer.torch.data/1"


def _dist_world(process_group=None):
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(process_group), dist.get_rank(process_group)
    return 1, 0


class _HookState:
    """State of ``_pacer_hook`` for the step in flight (set by the loader at hand-out)."""

    def __init__(self):
        self.weight = 0           # samples of this rank's batch that count (0: a repeat)
        self.ended = False        # this rank has no batch after this one
        self.waiting = False      # a repeat because the others hold the rest of the epoch
        self.batch = 0            # this rank's planned batch
        self.others_waiting = 0   # ranks other than this one that waited so, after backward
        self.waiting_batch = 0.0  # their mean planned batch
        self.last_total = None    # sum of the weights over the group, after backward
        self.all_ended = False    # every rank's data has ended after this step
        self.max_launch_ns = 0
        self.max_finish_ns = 0
        self.steps_reduced = 0    # buckets reduced (the loader checks that the hook runs)
        self.forward_wait_ns = 0  # waited in DDP's forward collective (buffer broadcast)
        self._outer_ns = 0
        self.lock = threading.Lock()
        # Module buffers synced in the step's last all-reduce (instead of DDP's broadcast of
        # rank 0's buffers at every forward): BatchNorm running statistics as the mean over the
        # ranks weighted by the samples that counted (a repeat batch, weight 0, moves nothing);
        # any other floating-point buffer as rank 0's value.
        self.stat_buffers = []    # BatchNorm running_mean / running_var
        self.other_buffers = []   # other floating-point buffers
        self.rank = 0
        self._snapshot = None     # the statistics before a weight-0 forward

    def set_buffers(self, module, rank):
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

    def buffer_numel(self):
        return sum(b.numel() for b in self.stat_buffers) + sum(b.numel() for b in self.other_buffers)

    def pack_buffers(self, out, weight):
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

    def unpack_buffers(self, reduced, total):
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

    def begin_step(self, weight, ended, waiting=False, batch=0):
        self.weight = weight
        self.ended = ended
        self.waiting = waiting
        self.batch = batch
        self.max_launch_ns = self.max_finish_ns = 0
        self.forward_wait_ns = 0
        self._outer_ns = 0

    # DDP's forward starts with its own collective (the broadcast of rank 0's buffers, e.g.
    # BatchNorm statistics) where a fast rank waits for the slow one: timed from the wrapper's
    # forward pre-hook to the wrapped module's.
    def enter_forward(self, *_):
        self._outer_ns = time.monotonic_ns()

    def enter_module(self, module, _inputs):
        if self.weight == 0 and module.training and self.stat_buffers:
            self._snapshot = [b.detach().clone() for b in self.stat_buffers]
        if self._outer_ns:
            self.forward_wait_ns += time.monotonic_ns() - self._outer_ns
            self._outer_ns = 0

    def wait_ns(self):
        """How long this rank waited for the others in the step: at the end of the backward,
        from launching the last bucket's all-reduce (its own gradients were all computed) to the
        last bucket's result; plus the wait in DDP's forward collective."""
        with self.lock:
            tail = self.max_finish_ns - self.max_launch_ns if self.max_finish_ns > self.max_launch_ns > 0 else 0
        return tail + self.forward_wait_ns


class _Session:
    """Per process: the Pacer client, the step timer and the hook state shared by the loader and
    the model wrapper."""

    def __init__(self):
        self.client = None
        self.timer = None
        self.hook = _HookState()
        self.loader = None
        self.model_attached = False
        self.process_group = None

    def connect(self, client=None, batch_size=32):
        if self.client is None:
            self.client = client if client is not None else pacer.Client(initial_micro_batch=batch_size)
            self.timer = pacer.StepTimer(self.client)
        return self.client

    def close(self):
        if self.client is not None and not self.client.closed:
            self.client.close()


_SESSION = _Session()


@atexit.register
def _close_session():
    try:
        _SESSION.close()
    except Exception:  # noqa: BLE001  (interpreter exit: nothing left to report to)
        pass


def _pacer_hook(state, bucket):
    """DDP comm hook of ``DistributedDataParallel``: one all-reduce of [w_i g_i, (buffers),
    waiting_i * batch_i, waiting_i, w_i, ended_i] per bucket; the gradient becomes
    sum_i w_i g_i / sum_i w_i."""
    grad = bucket.buffer()
    w = float(state.weight)
    g = grad.numel()
    # The module's buffers ride with the step's last bucket (DDP's own broadcast of them at
    # every forward is off: one collective per step instead of two).
    nbuf = state.buffer_numel() if bucket.is_last() else 0
    packed = torch.empty(g + nbuf + 4, dtype=grad.dtype, device=grad.device)
    if w > 0:
        torch.mul(grad.reshape(-1), w, out=packed[:g])
    else:
        packed[:g].zero_()  # a repeat batch (or a NaN mean over nothing) contributes nothing
    if nbuf:
        state.pack_buffers(packed[g:g + nbuf], w)
    packed[-4] = float(state.batch) if state.waiting else 0.0
    packed[-3] = 1.0 if state.waiting else 0.0
    packed[-2] = w
    packed[-1] = 1.0 if state.ended else 0.0
    group = _SESSION.process_group
    world = dist.get_world_size(group)
    launched = time.monotonic_ns()
    with state.lock:
        state.max_launch_ns = max(state.max_launch_ns, launched)
    fut = dist.all_reduce(packed, group=group, async_op=True).get_future()

    def finish(f):
        reduced = f.value()[0]
        total = float(reduced[-2].item())
        ended = float(reduced[-1].item())
        waiting = int(round(float(reduced[-3].item()))) - (1 if state.waiting else 0)
        waiting_batch = float(reduced[-4].item()) - (state.batch if state.waiting else 0)
        with state.lock:
            state.others_waiting = waiting
            state.waiting_batch = waiting_batch / waiting if waiting > 0 else 0.0
            state.max_finish_ns = max(state.max_finish_ns, time.monotonic_ns())
            state.last_total = total
            state.all_ended = ended >= world - 0.5
            state.steps_reduced += 1
        if nbuf:
            state.unpack_buffers(reduced[g:g + nbuf], total)
        if total > 0:
            grad.copy_(reduced[:g].view_as(grad).div_(total))
        else:
            grad.zero_()
        return grad

    return fut.then(finish)


def DistributedDataParallel(module, *args, **kwargs):
    """``torch.nn.parallel.DistributedDataParallel`` with Pacer's gradient averaging: each
    rank's gradient counts by the samples it trained on this step, so the ranks may train on
    different batch sizes (the controller's plan) and the update still equals the full-batch
    gradient of the step's union of batches; the same all-reduce tells every rank when the
    data of all has ended. Takes DDP's arguments; returns the DDP module. The loss must be the
    mean over the local batch (as ``F.cross_entropy`` gives by default). One model per process."""
    if _SESSION.model_attached:
        raise RuntimeError("pacer.torch.DistributedDataParallel: one wrapped model per process")
    # The buffers (BatchNorm statistics) are synced inside the gradient all-reduce, weighted by
    # each rank's samples, unless the caller asks for DDP's broadcast of rank 0's buffers.
    own_buffers = "broadcast_buffers" not in kwargs and len(args) < 4  # (device_ids, output_device, dim, broadcast_buffers, ...)
    if own_buffers:
        kwargs["broadcast_buffers"] = False
    ddp = torch.nn.parallel.DistributedDataParallel(module, *args, **kwargs)
    _SESSION.process_group = kwargs.get("process_group")
    if own_buffers:
        _SESSION.hook.set_buffers(ddp.module, dist.get_rank(_SESSION.process_group))
    ddp.register_comm_hook(_SESSION.hook, _pacer_hook)
    ddp.register_forward_pre_hook(_SESSION.hook.enter_forward)
    ddp.module.register_forward_pre_hook(_SESSION.hook.enter_module)
    _SESSION.model_attached = True
    return ddp


class _Empty:
    """What the collate wrapper makes of a batch without indices (a step with nothing to train)."""


_EMPTY = _Empty()


class _TimedDataset(torch.utils.data.Dataset):
    """The user's dataset as the torch DataLoader sees it: notes when a loader process starts
    on a batch (its first ``dataset[i]``), so that ``_Collate`` can say how long the batch took."""

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


class _Collate:
    """Runs in the loader process: the user's collate, and the batch's loading interval
    (first ``dataset[i]`` to the end of collate, on the host's monotonic clock)."""

    def __init__(self, collate_fn, timed):
        self.collate_fn = collate_fn
        self.timed = timed

    def __call__(self, samples):
        start = self.timed.batch_start_ns
        self.timed.batch_start_ns = None
        if not samples:
            return _EMPTY
        data = self.collate_fn(samples)
        end = time.monotonic_ns()
        return (_TIMED, data, start if start is not None else end, end)


_TIMED = "pacer.torch.timed-batch"


class _Item:
    """One batch handed to the torch DataLoader: its weight (distinct records; 0 for a step
    without data) and the reader position just past its records."""

    __slots__ = ("weight", "end_pos", "size", "loader_ns")

    def __init__(self, weight, end_pos, size=0):
        self.weight = weight
        self.end_pos = end_pos
        self.size = size    # samples the loader processes decode (weight, or more when topped up)
        self.loader_ns = 0  # the loader processes' busy time for this batch (see _loaded)


class _LeaseBatchSampler:
    """The torch DataLoader's batch sampler: runs in the trainer process and cuts batches from
    the leased records. Every yielded index list is recorded in ``loader._pipeline``."""

    def __init__(self, loader):
        self.loader = loader
        self.ended = False
        self.stash = None  # (item, ids) computed ahead by peek()

    def _take(self):
        ld = self.loader
        if self.ended or ld._release_pending:
            return _Item(0, ld._reader.records_read), []
        if ld._reader.holding_off:
            if ld._step < ld._resume_at:
                return _Item(0, ld._reader.records_read), []
            ld._reader.resume()
        n = max(ld._batch, ld.min_batch)
        # Without lockstep the reader may block until data comes, but not while batches of this
        # rank's records are still in the loader processes: the end of the data (or the next
        # lease) can come only after they are trained and declared, which waits for this call.
        blocking = (pacer.Blocking.UNTIL_PREFETCHED if ld._lockstep or self.in_flight()
                    else pacer.Blocking.UNTIL_DATA)
        outcome, ids = ld._reader.next(n, blocking)
        if outcome == pacer.Outcome.WAIT and ld._lockstep:
            # The service has nothing for this rank now. Often that is because this rank's own
            # last leases are not complete yet: send their queued completions now (one round
            # trip; a completion also leases the next shard or learns the end of the data)
            # instead of at the next heartbeat, so the step after is not spent on a repeat.
            # Then ask again at once rather than after the WAIT's retry delay: at the end of the
            # data the answer is END_OF_DATA as soon as every rank's completions are in.
            try:
                ld.client.flush(5_000)
            except pacer.Error:
                pass  # pacerd slow or away: the reporter retries; this step is a repeat
            ld._reader.retry_now()
            outcome, ids = ld._reader.next(n, blocking)
        if outcome == pacer.Outcome.END_OF_DATA:
            self.ended = True
        elif 0 < len(ids) < ld.min_batch:
            # A lease boundary cut the batch short: top it up from what is prefetched.
            outcome, more = ld._reader.next(n - len(ids), pacer.Blocking.UNTIL_PREFETCHED)
            ids += more
            if outcome == pacer.Outcome.END_OF_DATA:
                self.ended = True
        item = _Item(len(ids), ld._reader.records_read)
        if 0 < len(ids) < ld.min_batch:
            # Still short (the rank's last records): repeat every record the same number of
            # times, so that the batch mean equals the mean over the distinct records and
            # BatchNorm sees at least min_batch samples; the weight stays the distinct count.
            ids = ids * math.ceil(ld.min_batch / len(ids))
        item.size = len(ids)
        return item, ids

    def peek(self):
        if self.stash is None:
            self.stash = self._take()
        return self.stash[0]

    def __iter__(self):
        ld = self.loader
        while True:
            if self.stash is not None:
                (item, ids), self.stash = self.stash, None
            else:
                item, ids = self._take()
            if not ids and not ld._lockstep:
                if self.ended:
                    return
                if not self.in_flight():
                    continue  # UNTIL_DATA returned nothing without the end: ask again
                # Nothing now, and records in flight: hand the DataLoader an empty batch so the
                # loop trains (and declares) those first; the loop skips it.
            ld._pipeline.append(item)
            yield ids

    def in_flight(self):
        """Whether records this rank handed out are not trained yet."""
        ld = self.loader
        return (any(p.weight for p in ld._pipeline) or
                (ld._current is not None and ld._current.weight > 0))


class DataLoader:
    """A ``torch.utils.data.DataLoader`` for a map-style dataset (``dataset[i]``, ``len``) whose
    indices come from Pacer's sharding service instead of a ``DistributedSampler``: every record
    is trained on once per epoch across all ranks, faster ranks train on more, and a rank that
    restarts goes on where the job was.

    ``batch_size`` is this rank's starting batch; the controller's plan changes it (never below
    ``min_batch``, default 2, so BatchNorm works). ``num_workers``, ``collate_fn``,
    ``pin_memory``, ``prefetch_factor``, ``worker_init_fn``, ``multiprocessing_context`` and
    ``timeout`` mean what they mean for torch's DataLoader (decoding runs in the worker
    processes; the leases are kept in the trainer process). One pass over the loader covers all
    ``epochs`` epochs and ends on every rank after the same step, when the data of every rank
    has ended. ``state_dict()`` / ``load_state_dict()`` pin the data position to a model
    checkpoint (collective calls: every rank, at the same step). The dataset is registered with
    pacerd under ``name`` (the same arguments on every rank); the client connects with the
    identity the environment gives (``pacer-agent``'s PACER_* variables, or torchrun's RANK).

    Under ``torch.distributed`` with more than one rank, the model must be wrapped with
    ``pacer.torch.DistributedDataParallel`` and the loop must run forward and backward on every
    batch the loader yields (no ``no_sync``, no skipped batches)."""

    def __init__(self, dataset, batch_size=32, *, shuffle=True, num_workers=0, collate_fn=None,
                 pin_memory=False, prefetch_factor=2, worker_init_fn=None,
                 multiprocessing_context=None, timeout=0, epochs=1, seed=0, name="train",
                 shard_size=0, min_batch=2, client=None, process_group=None):
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise TypeError("pacer.torch.DataLoader needs a map-style dataset (dataset[i] and len(dataset))")
        num_records = len(dataset)
        if num_records <= 0:
            raise ValueError("pacer.torch.DataLoader: the dataset is empty")
        if batch_size is None or batch_size <= 0:
            raise ValueError("batch_size must be > 0")
        if min_batch <= 0:
            raise ValueError("min_batch must be > 0")
        if epochs <= 0:
            raise ValueError("epochs must be > 0")
        if _SESSION.loader is not None:
            raise RuntimeError("pacer.torch.DataLoader: one training loader per process")
        self.dataset = dataset
        self.batch_size = batch_size
        self.min_batch = min_batch
        self.epochs = epochs
        self.name = name
        self.num_workers = num_workers
        self._torch_kwargs = dict(num_workers=num_workers, pin_memory=pin_memory, timeout=timeout,
                                  worker_init_fn=worker_init_fn,
                                  multiprocessing_context=multiprocessing_context)
        if num_workers > 0:
            self._torch_kwargs["prefetch_factor"] = prefetch_factor
        self._collate = collate_fn if collate_fn is not None else torch.utils.data.default_collate
        self.client = _SESSION.connect(client, batch_size)
        _SESSION.process_group = process_group or _SESSION.process_group
        self.client.register_dataset(name, num_records=num_records, shard_size=shard_size,
                                     num_epochs=epochs, shuffle="records" if shuffle else "none",
                                     seed=seed, batch_size=batch_size)
        _SESSION.loader = self
        self._reader = None
        self._pipeline = deque()
        self._batch = batch_size
        self._step = 0              # steps handed out (the next step's number)
        self._handed = None         # _Item of the batch handed out last
        self._last_real = None      # the data of the last batch with weight > 0
        self._finished = False
        self._lockstep = False
        self.weight = 0             # samples of the batch handed out last that count
        self.plans_applied = 0
        self.repeats = 0            # steps this rank trained with weight 0
        self.tail_releases = 0      # times this rank handed its leases to waiting ranks
        self._release_pending = False
        self._resume_at = 0
        self._current = None        # the batch between the pipeline and its hand-out
        self._loader_covered_ns = 0  # loading intervals counted up to here
        self._loader_per_sample_ns = None  # smoothed loader busy time per sample
        self._handed_ns = 0          # when the batch handed out last was handed out

    # -- what users read --------------------------------------------------------------------
    def __len__(self):
        """An estimate of this rank's steps (the plan moves batches between ranks)."""
        world, _ = _dist_world(_SESSION.process_group)
        return max(1, math.ceil(len(self.dataset) * self.epochs / (world * self.batch_size)))

    @property
    def step(self):
        """Steps handed out so far (the number the next batch's step will have)."""
        return self._step

    @property
    def local_batch(self):
        """This rank's planned batch now."""
        return self._batch

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self):
        if self._finished:
            raise RuntimeError(
                "pacer.torch.DataLoader: the data has ended (one pass over the loader covers all "
                f"{self.epochs} epoch(s); see docs/pytorch.md)")
        world, _ = _dist_world(_SESSION.process_group)
        self._lockstep = world > 1
        if self._lockstep and not _SESSION.model_attached:
            raise RuntimeError(
                "pacer.torch.DataLoader with torch.distributed (world size > 1) needs the model "
                "wrapped with pacer.torch.DistributedDataParallel: it weights each rank's gradient "
                "by its batch and agrees on the end of the data")
        if self._reader is None:
            self._reader = pacer.ShardReader(self.client, dataset=self.name)
        sampler = _LeaseBatchSampler(self)
        timed = _TimedDataset(self.dataset)
        torch_loader = torch.utils.data.DataLoader(timed, batch_sampler=sampler,
                                                   collate_fn=_Collate(self._collate, timed),
                                                   **self._torch_kwargs)
        it = iter(torch_loader)
        hook = _SESSION.hook
        try:
            while True:
                stepped = self._consume_step()
                if stepped is not None and self._lockstep:
                    if hook.last_total is None:
                        raise RuntimeError(
                            "pacer.torch.DataLoader: the step ran no backward through the "
                            "pacer.torch.DistributedDataParallel model (every batch needs forward "
                            "and backward on every rank)")
                    if hook.all_ended:
                        self._report_step(stepped)
                        break
                    self._tail_release(sampler)
                try:
                    data = next(it)
                finally:
                    # The step lasts until the next batch is here: waiting for the loader
                    # processes (decoding, augmentation) is this rank's own cost.
                    self._report_step(stepped)
                item = self._pipeline.popleft()
                data = self._loaded(data, item)
                if item.weight == 0 and not self._lockstep:
                    continue  # nothing to train (see _LeaseBatchSampler.__iter__): no step
                self._current = item
                if isinstance(data, _Empty) or item.weight == 0:
                    data = self._repeat_batch()
                    self.repeats += 1
                else:
                    self._last_real = data
                if self._lockstep and not self._real_ahead(sampler) and not sampler.ended:
                    # Nothing real queued after this batch: look ahead so that the end of the
                    # data is known at this step, not one all-empty step later.
                    sampler.peek()
                self._begin_step(item, sampler.ended and not self._real_ahead(sampler))
                yield data
        except StopIteration:
            pass  # not lockstep: the sampler ended (the last step was reported above)
        finally:
            del it
        self._finished = True
        self.client.flush(30_000)

    def _tail_release(self, sampler):
        """The end of an epoch: when ranks with larger batches (faster ones, under a plan) wait
        for data while this rank still holds leased records for more than two of its steps, it
        stops taking records, trains what its loader processes already hold, and then hands
        its leases back at their trained prefix (``release_all``) so the waiting ranks finish
        the rest; it leases again two steps later. Records are handed back only once every
        record handed out was trained, so a checkpoint in between stays exact."""
        hook = _SESSION.hook
        reader = self._reader
        if sampler.ended:
            return
        if self._release_pending:
            if self._real_ahead(sampler):
                return  # batches of this rank's records still in the loader processes
            try:
                reader.release_all(5_000)
            except pacer.Error:
                return  # pacerd slow or away: try again at the next step
            self._release_pending = False
            self._resume_at = self._step + 2
            self.tail_releases += 1
            return
        if (hook.others_waiting > 0 and hook.waiting_batch > self._batch and not reader.holding_off
                and reader.records_held > 2 * max(self._batch, self.min_batch)):
            self._release_pending = True

    def _loaded(self, data, item):
        """Unwraps a batch from the loader processes and notes on ``item`` how long they were
        busy with it: the union of the batches' loading intervals (two processes decoding at
        once share the rank's CPU, so their overlap counts once), the part not covered yet."""
        if isinstance(data, (tuple, list)) and len(data) == 4 and data[0] == _TIMED:
            _, data, start, end = data
            start, end = int(start), int(end)
            busy = max(0, end - max(start, self._loader_covered_ns))
            self._loader_covered_ns = max(self._loader_covered_ns, end)
            if item.size > 0:
                # Which of two overlapping batches gets the overlap is arbitrary: the cost per
                # sample is smoothed over the last few batches (a contention still shows
                # within a few steps).
                per_sample = busy / item.size
                prev = self._loader_per_sample_ns
                self._loader_per_sample_ns = per_sample if prev is None else prev + 0.3 * (per_sample - prev)
                item.loader_ns = int(self._loader_per_sample_ns * item.size)
        return data

    def _real_ahead(self, sampler):
        """Whether a batch with records follows the one being handed out."""
        return (any(p.weight for p in self._pipeline) or
                (sampler.stash is not None and sampler.stash[0].weight > 0))

    def _repeat_batch(self):
        if self._last_real is None:
            self._last_real = self._collate([self.dataset[0]] * self.min_batch)
        return self._last_real

    def _begin_step(self, item, ended):
        hook = _SESSION.hook
        waiting = (item.weight == 0 and not ended and not self._release_pending and
                   not self._reader.holding_off)
        hook.begin_step(item.weight, ended, waiting=waiting, batch=self._batch)
        hook.last_total = None
        self._handed = item
        self._current = None
        self.weight = item.weight
        self.client.set_step(self._step)
        plan = self.client.batch_plan(self._step)
        batch = max(plan.micro_batch * plan.accumulation_steps, self.min_batch)
        if batch != self._batch:
            self._batch = batch
            self.plans_applied += 1
        _SESSION.timer.begin_step(self._step)
        self._handed_ns = time.monotonic_ns()
        self._step += 1

    def _consume_step(self):
        """The batch handed out last is trained: declare its records. Returns its item (None
        before the first step)."""
        item = self._handed
        if item is None:
            return None
        self._handed = None
        self._reader.mark_consumed(through=item.end_pos)
        self._done_pos = item.end_pos
        return item

    def _report_step(self, item):
        """Reports the step of ``item``: its wall time from its hand-out to now (the next batch
        fetched), minus the time the step's collectives kept this rank waiting for the others."""
        if item is None or item.weight == 0:
            return
        wait = _SESSION.hook.wait_ns() if self._lockstep else 0
        if wait and item.loader_ns:
            # While this rank waited for the others its loader processes were decoding the
            # next batches: as long as they were busy, the rank was not idle. Its cost is at
            # least the loaders' time for one batch.
            wall = time.monotonic_ns() - self._handed_ns
            wait = min(wait, max(0, wall - item.loader_ns))
        if wait:
            _SESSION.timer.add(pacer.Phase.COMMUNICATION, wait)
        _SESSION.timer.end_step(self._batch, item.weight)

    # -- checkpoints -------------------------------------------------------------------------
    def _barrier(self):
        if _dist_world(_SESSION.process_group)[0] > 1:
            dist.barrier(group=_SESSION.process_group)

    def state_dict(self):
        """The data position of the model as it is now (after ``optimizer.step()`` on the batch
        handed out last), for ``torch.save({"model": ..., "data": loader.state_dict()})``.
        Collective: every rank calls it at the same step; one rank saves the file."""
        if self._reader is not None:
            pos = self._handed.end_pos if self._handed is not None else getattr(self, "_done_pos", None)
            if pos is not None:
                self._reader.mark_consumed(through=pos)
        self.client.flush(30_000)
        world, rank = _dist_world(_SESSION.process_group)
        nonce = [secrets.token_hex(4)]
        if world > 1:
            dist.broadcast_object_list(nonce, src=0, group=_SESSION.process_group)
        tag = f"{self.name}:step-{self._step}.{nonce[0]}"
        self._barrier()  # every rank's progress through this step is acknowledged
        if rank == 0:
            self.client.save_checkpoint(tag)
        self._barrier()  # nobody reports past this step before the pin is taken
        return {"format": CHECKPOINT_FORMAT, "tag": tag, "dataset": self.name, "step": self._step}

    def load_state_dict(self, state):
        """Moves the job's data back to the position of ``state`` (from ``state_dict()``), so the
        records trained after it are delivered again and no others. Collective: every rank calls
        it before iterating (after ``init_process_group``)."""
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"load_state_dict: not a {CHECKPOINT_FORMAT} state (from DataLoader.state_dict())")
        if state.get("dataset") != self.name:
            raise ValueError(f"load_state_dict: the state is of dataset '{state.get('dataset')}', "
                             f"this loader reads '{self.name}'")
        if self._reader is not None:
            raise RuntimeError("load_state_dict: call it before iterating the loader")
        _, rank = _dist_world(_SESSION.process_group)
        self._barrier()  # no rank reads yet
        if rank == 0:
            self.client.restore_checkpoint(state["tag"])
        self._barrier()
        self._step = int(state["step"])
