"""``pacer.torch.DataLoader``: a torch DataLoader whose indices come from Pacer's sharding service.

What it does together with ``pacer.torch.DistributedDataParallel``, per step t of a synchronous
job:
  1. the batch sampler (sampler.py) runs in the trainer process: it leases shards
     (``pacer.ShardReader``), cuts batches of the planned size (at least ``min_batch``) and hands
     their indices to the torch DataLoader, whose worker processes call ``dataset[i]`` and
     collate;
  2. handing out batch t+1 declares batch t trained (its records' progress is queued: only what
     was trained, never what is prefetched), reports step t's time (timing.py) and its samples,
     and applies a new batch plan;
  3. the weighted all-reduce (allreduce.py, with the step state of step.py) averages gradients
     weighted by each rank's batch and, in the same all-reduce, counts the ranks whose data has
     ended; when all have, the loop ends on every rank after the same step. A rank with nothing
     to train on at a step (the others hold the rest of the epoch) gets its previous batch
     again with weight 0.
"""

import math
import secrets
import time
from collections import deque

import torch
import torch.distributed as dist

import pacer
from pacer.torch.sampler import BatchInfo, LeaseBatchSampler
from pacer.torch.session import SESSION, dist_world
from pacer.torch.timing import Empty, LoaderBusyTime, TimedCollate, TimedDataset

CHECKPOINT_FORMAT = "pacer.torch.data/1"


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
        if SESSION.loader is not None:
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
        self.client = SESSION.connect(client, batch_size)
        SESSION.process_group = process_group or SESSION.process_group
        self.client.register_dataset(name, num_records=num_records, shard_size=shard_size,
                                     num_epochs=epochs, shuffle="records" if shuffle else "none",
                                     seed=seed, batch_size=batch_size)
        SESSION.loader = self
        self._reader = None
        self._pipeline = deque()
        self._batch = batch_size
        self._step = 0              # steps handed out (the next step's number)
        self._handed = None         # sampler.Item of the batch handed out last
        self._done_pos = None       # the reader position the last declared batch reached
        self._last_real = None      # the data of the last batch with weight > 0
        self._last_real_info = None  # and its BatchInfo
        self._info = None            # the BatchInfo of the batch handed out last
        self._finished = False
        self._lockstep = False
        self.weight = 0             # samples of the batch handed out last that count
        self.plans_applied = 0
        self.repeats = 0            # steps this rank trained with weight 0
        self.tail_releases = 0      # times this rank handed its leases to waiting ranks
        self._release_pending = False
        self._resume_at = 0
        self._current = None        # the batch between the pipeline and its hand-out
        self._busy = LoaderBusyTime()  # the loader processes' busy time per batch
        self._handed_ns = 0          # when the batch handed out last was handed out

    # -- what users read --------------------------------------------------------------------
    def __len__(self):
        """An estimate of this rank's steps (the plan moves batches between ranks)."""
        world, _ = dist_world(SESSION.process_group)
        return max(1, math.ceil(len(self.dataset) * self.epochs / (world * self.batch_size)))

    @property
    def step(self):
        """Steps handed out so far (the number the next batch's step will have)."""
        return self._step

    @property
    def local_batch(self):
        """This rank's planned batch now."""
        return self._batch

    @property
    def total_weight(self):
        """N, the counted samples of the step in flight over all ranks: known after the backward
        through ``pacer.torch.DistributedDataParallel`` or after ``pacer.torch.weighted(loss)``
        (None before). 0: no rank trained a record this step (the gradient is zero; skip
        ``optimizer.step()`` to keep momentum and weight decay from moving the model)."""
        return SESSION.hook.last_total

    @property
    def batch_info(self):
        """The ``BatchInfo`` of the batch yielded last (None before the first): the dataset
        index and epoch of each of its samples, and which of them count as trained records
        (``weight`` of them; the others are repeats)."""
        return self._info

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self):
        if self._finished:
            raise RuntimeError(
                "pacer.torch.DataLoader: the data has ended (one pass over the loader covers all "
                f"{self.epochs} epoch(s); see docs/pytorch.md)")
        world, _ = dist_world(SESSION.process_group)
        self._lockstep = world > 1
        # With more than one rank, every step needs the model wrapped with
        # pacer.torch.DistributedDataParallel or the loss passed through pacer.torch.weighted:
        # either weights the ranks by their samples and agrees on the end of the data (checked
        # at every step, below: which of the two is known only once the loop body ran).
        if self._reader is None:
            self._reader = pacer.ShardReader(self.client, dataset=self.name)
        sampler = LeaseBatchSampler(self)
        timed = TimedDataset(self.dataset)
        torch_loader = torch.utils.data.DataLoader(timed, batch_sampler=sampler,
                                                   collate_fn=TimedCollate(self._collate, timed),
                                                   **self._torch_kwargs)
        it = iter(torch_loader)
        hook = SESSION.hook
        try:
            while True:
                stepped = self._consume_step()
                if stepped is not None and self._lockstep:
                    if hook.last_total is None:
                        raise RuntimeError(
                            "pacer.torch.DataLoader with torch.distributed (world size > 1): the "
                            "step ran no backward through a pacer.torch.DistributedDataParallel "
                            "model and no loss through pacer.torch.weighted (one of them weights "
                            "each rank's gradient by its batch and agrees on the end of the data; "
                            "every batch needs it, on every rank: docs/pytorch.md)")
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
                data = self._busy.unwrap(data, item)
                if item.weight == 0 and not self._lockstep:
                    continue  # nothing to train (see LeaseBatchSampler.__iter__): no step
                self._current = item
                if isinstance(data, Empty) or item.weight == 0:
                    data, info = self._repeat_batch()
                    self.repeats += 1
                else:
                    info = BatchInfo(self._step, item.ids, item.epochs, item.weight)
                    self._last_real, self._last_real_info = data, info
                self._info = info
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
        hook = SESSION.hook
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

    def _real_ahead(self, sampler):
        """Whether a batch with records follows the one being handed out."""
        return (any(p.weight for p in self._pipeline) or
                (sampler.stash is not None and sampler.stash[0].weight > 0))

    def _repeat_batch(self):
        """The data and BatchInfo of a step with nothing to train: this rank's last batch with
        records again, nothing counted."""
        if self._last_real is None:
            self._last_real = self._collate([self.dataset[0]] * self.min_batch)
            self._last_real_info = BatchInfo(self._step, [0] * self.min_batch, [-1] * self.min_batch, 0)
        return self._last_real, self._last_real_info.repeat(self._step)

    def _begin_step(self, item, ended):
        hook = SESSION.hook
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
        SESSION.timer.begin_step(self._step)
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
        wait = SESSION.hook.wait_ns() if self._lockstep else 0
        if wait and item.loader_ns:
            # While this rank waited for the others its loader processes were decoding the
            # next batches: as long as they were busy, the rank was not idle. Its cost is at
            # least the loaders' time for one batch.
            wall = time.monotonic_ns() - self._handed_ns
            wait = min(wait, max(0, wall - item.loader_ns))
        if wait:
            SESSION.timer.add(pacer.Phase.COMMUNICATION, wait)
        SESSION.timer.end_step(self._batch, item.weight)

    # -- checkpoints -------------------------------------------------------------------------
    def _barrier(self):
        if dist_world(SESSION.process_group)[0] > 1:
            dist.barrier(group=SESSION.process_group)

    def state_dict(self):
        """The data position of the model as it is now (after ``optimizer.step()`` on the batch
        handed out last), for ``torch.save({"model": ..., "data": loader.state_dict()})``.
        Collective: every rank calls it at the same step; one rank saves the file."""
        if self._reader is not None:
            pos = self._handed.end_pos if self._handed is not None else self._done_pos
            if pos is not None:
                self._reader.mark_consumed(through=pos)
        self.client.flush(30_000)
        world, rank = dist_world(SESSION.process_group)
        nonce = [secrets.token_hex(4)]
        if world > 1:
            dist.broadcast_object_list(nonce, src=0, group=SESSION.process_group)
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
        _, rank = dist_world(SESSION.process_group)
        self._barrier()  # no rank reads yet
        if rank == 0:
            self.client.restore_checkpoint(state["tag"])
        self._barrier()
        self._step = int(state["step"])
