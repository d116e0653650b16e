"""Pacer worker SDK for Python (docs/design.md §6).

The classes come from the C++ core (pacer._pacer, pybind11):

- ``Client(address=..., token=..., worker_id=...)``: connects and registers; arguments left out
  come from PACER_ADDR / PACER_JOB / PACER_WORKER_ID / PACER_TOKEN / PACER_NODE. A background
  reporter batches progress, step statistics and lease renewals.
- ``ShardReader(client, dataset=...)``: record ids of leased shards (prefetched); iterate it or
  call ``next(n, blocking)``; ``mark_consumed()`` after training on what it handed out;
  ``save_checkpoint(tag)`` / ``restore_checkpoint(tag)``.
- ``StepTimer(client)``: ``begin_step``, ``with timer.data_wait():``, ``with
  timer.communication():``, ``end_step(local_batch, samples)``.
- ``client.batch_plan(step)``: the ``LocalBatch`` in force at a step.
- EXCLUDE_WORKERS: ``Client(..., honors_exclusion=True)`` opts in; ``client.excluded`` says
  when the job's steps do not wait for this worker; ``reader.release_all()`` hands the leases
  back, ``reader.resume()`` leases again (worker_sdk/README.md, "Exclusion").

Every failure raises a subclass of ``pacer.Error`` (a RuntimeError) named for its status code
(``UnavailableError``, ``UnauthenticatedError``, ``InvalidArgumentError``, ...), with the
message, and ``code`` naming the code. PyTorch helpers live in ``pacer.torch``.
"""

from pacer._pacer import (  # noqa: F401
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    Client,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    LocalBatch,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ShardReader,
    StepTimer,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    mint_credential,
)

Outcome = ShardReader.Outcome
Blocking = ShardReader.Blocking
Phase = StepTimer.Phase
