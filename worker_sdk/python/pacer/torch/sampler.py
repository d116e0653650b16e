"""The torch DataLoader's batch sampler of ``pacer.torch.DataLoader``: runs in the trainer process
and cuts batches of the planned size from the records this rank leases (``pacer.ShardReader``).

A batch is never smaller than the loader's ``min_batch``: a batch cut short by a lease boundary
is topped up from what is prefetched, and a rank's last records, when fewer, are repeated
evenly. A step with nothing to train on yields an empty batch (weight 0).

``BatchInfo`` tells the training loop which records the batch it was handed holds.
"""

import math

import pacer


class Item:
    """One batch handed to the torch DataLoader: its weight (records handed out by the reader;
    0 for a step without data), the reader position just past its records, and the dataset
    indices the loader processes decode with the epoch each was leased in (the first ``weight``
    are the records; any after them repeat those)."""

    __slots__ = ("weight", "end_pos", "size", "loader_ns", "ids", "epochs")

    def __init__(self, weight, end_pos, size=0):
        self.weight = weight
        self.end_pos = end_pos
        self.size = size    # samples the loader processes decode (weight, or more when topped up)
        self.loader_ns = 0  # the loader processes' busy time for this batch (timing.LoaderBusyTime)
        self.ids = ()
        self.epochs = ()


class BatchInfo:
    """The records of one batch that ``pacer.torch.DataLoader`` yielded (``loader.batch_info``).

    Sample k of the batch (row k of a default-collated batch: ``collate_fn`` gets the samples
    in this order) is ``dataset[indices[k]]`` of epoch ``epochs[k]``; ``counted[k]`` says
    whether it counts as a trained record. ``weight`` is the number of counted samples (the
    ``loader.weight`` of the batch) and ``step`` the batch's step (``loader.step - 1`` while the
    loop body runs).

    Samples that do not count are repeats: when a rank's last records are fewer than
    ``min_batch``, each is repeated the same number of times and only its first occurrence,
    at the front of the batch, counts (``indices[weight:]`` repeats ``indices[:weight]``); a
    step with nothing to train (``weight == 0``) repeats this rank's previous batch, none of it
    counted (before this rank had a batch with records: ``dataset[0]``, with epoch -1).
    Counted samples are distinct within an epoch; without an epoch barrier a batch may span
    the end of one epoch and the start of the next, so one index can be counted twice in it,
    with two different epochs."""

    __slots__ = ("step", "indices", "epochs", "counted", "weight")

    def __init__(self, step, indices, epochs, weight):
        self.step = step
        self.indices = tuple(indices)
        self.epochs = tuple(epochs)
        self.weight = weight
        self.counted = (True,) * weight + (False,) * (len(self.indices) - weight)

    @property
    def records(self):
        """The counted samples as ``(epoch, index)`` pairs: the records this step trained on."""
        return list(zip(self.epochs[:self.weight], self.indices[:self.weight]))

    def repeat(self, step):
        """This batch again with nothing counted (a step with nothing to train)."""
        return BatchInfo(step, self.indices, self.epochs, 0)

    def __len__(self):
        return len(self.indices)

    def __repr__(self):
        return (f"BatchInfo(step={self.step}, weight={self.weight}, indices={list(self.indices)}, "
                f"epochs={list(self.epochs)})")


class LeaseBatchSampler:
    """The torch DataLoader's batch sampler: runs in the trainer process and cuts batches from
    the leased records. Every yielded index list is recorded in ``loader._pipeline``."""

    def __init__(self, loader):
        self.loader = loader
        self.ended = False
        self.stash = None  # (item, ids) computed ahead by peek()

    def _take(self):
        ld = self.loader
        if self.ended or ld._release_pending:
            return Item(0, ld._reader.records_read), []
        if ld._reader.holding_off:
            if ld._step < ld._resume_at:
                return Item(0, ld._reader.records_read), []
            ld._reader.resume()
        n = max(ld._batch, ld.min_batch)
        # Without lockstep the reader may block until data comes, but not while batches of this
        # rank's records are still in the loader processes: the end of the data (or the next
        # lease) can come only after they are trained and declared, which waits for this call.
        blocking = (pacer.Blocking.UNTIL_PREFETCHED if ld._lockstep or self.in_flight()
                    else pacer.Blocking.UNTIL_DATA)
        outcome, ids, epochs = ld._reader.next(n, blocking, epochs=True)
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
            outcome, ids, epochs = ld._reader.next(n, blocking, epochs=True)
        if outcome == pacer.Outcome.END_OF_DATA:
            self.ended = True
        elif 0 < len(ids) < ld.min_batch:
            # A lease boundary cut the batch short: top it up from what is prefetched.
            outcome, more, more_epochs = ld._reader.next(n - len(ids), pacer.Blocking.UNTIL_PREFETCHED,
                                                         epochs=True)
            ids += more
            epochs += more_epochs
            if outcome == pacer.Outcome.END_OF_DATA:
                self.ended = True
        item = Item(len(ids), ld._reader.records_read)
        if 0 < len(ids) < ld.min_batch:
            # Still short (the rank's last records): repeat every record the same number of
            # times, so that the batch mean equals the mean over the distinct records and
            # BatchNorm sees at least min_batch samples; the weight stays the distinct count.
            times = math.ceil(ld.min_batch / len(ids))
            ids, epochs = ids * times, epochs * times
        item.size = len(ids)
        item.ids, item.epochs = tuple(ids), tuple(epochs)
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
