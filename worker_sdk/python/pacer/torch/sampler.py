"""The torch DataLoader's batch sampler of ``pacer.torch.DataLoader``: runs in the trainer process
and cuts batches of the planned size from the records this rank leases (``pacer.ShardReader``).

A batch is never smaller than the loader's ``min_batch``: a batch cut short by a lease boundary
is topped up from what is prefetched, and a rank's last records, when fewer, are repeated
evenly. A step with nothing to train on yields an empty batch (weight 0).
"""

import math

import pacer


class Item:
    """One batch handed to the torch DataLoader: its weight (distinct records; 0 for a step
    without data) and the reader position just past its records."""

    __slots__ = ("weight", "end_pos", "size", "loader_ns")

    def __init__(self, weight, end_pos, size=0):
        self.weight = weight
        self.end_pos = end_pos
        self.size = size    # samples the loader processes decode (weight, or more when topped up)
        self.loader_ns = 0  # the loader processes' busy time for this batch (timing.LoaderBusyTime)


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
        item = Item(len(ids), ld._reader.records_read)
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
