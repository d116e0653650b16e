"""Tests of the Python module `pacer` against a real pacerd subprocess on loopback.

Bad input: a wrong token, an unreachable pacerd (short retry budget) and a missing worker id
raise pacer.Error subclasses carrying the message, never hang or crash. Also: connecting from
the PACER_* environment, reading every record of a dataset exactly once through ShardReader (a
second worker then finds nothing left), checkpoint/restore of the data position, StepTimer
reports reaching pacerd, the batch plan, and that blocking calls release the GIL.

Exclusion (EXCLUDE_WORKERS): the pacerd subprocess cannot be driven into deciding one here (that
is tests/sdk/c_api_test.cc, on a simulated clock, and tests/pacerd/exclusion_test.cc), so this
checks the opt-in and the reader's side: ``honors_exclusion=True`` connects, ``excluded`` is
False and ``exclusion_version`` 0 while pacerd decided nothing; ``release_all()`` hands the
leases back (another worker then finishes the dataset, every record read exactly once),
``next`` says WAIT until ``resume()``, and ``release_all`` releases the GIL.
"""

import os
import socket
import sys
import threading
import time
import unittest

import pacer
from pacerd_fixture import Pacerd, temp_dir, wait_for

# A bound, never-listening socket: connections to it are refused and no one else can take
# the port while the test runs.
_closed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
_closed.bind(("127.0.0.1", 0))
UNREACHABLE = f"127.0.0.1:{_closed.getsockname()[1]}"


class BadInputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = temp_dir()
        cls.pacerd = Pacerd(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.pacerd.stop()
        cls.tmp.cleanup()

    def test_wrong_token_raises_unauthenticated(self):
        with self.assertRaises(pacer.UnauthenticatedError) as cm:
            pacer.Client(address=self.pacerd.address, token="not-the-token", worker_id="w0",
                         connect_budget_ms=5_000)
        e = cm.exception
        self.assertIsInstance(e, pacer.Error)
        self.assertIsInstance(e, RuntimeError)
        self.assertEqual(e.code, "UNAUTHENTICATED")
        self.assertTrue(e.status_message)
        self.assertIn(e.status_message, str(e))

    def test_minted_credential_acts_only_as_its_worker(self):
        cred = pacer.mint_credential(self.pacerd.token, "worker", "w-cred")
        self.assertTrue(cred.startswith("pacer-cred-v1:worker:w-cred:"))
        self.assertNotIn(self.pacerd.token, cred)
        with pacer.Client(address=self.pacerd.address, token=cred, worker_id="w-cred",
                          connect_budget_ms=5_000):
            pass
        with self.assertRaises(pacer.PermissionDeniedError) as cm:
            pacer.Client(address=self.pacerd.address, token=cred, worker_id="w-other",
                         connect_budget_ms=5_000)
        self.assertIn("cannot act as worker 'w-other'", cm.exception.status_message)
        with self.assertRaises(pacer.InvalidArgumentError):
            pacer.mint_credential(self.pacerd.token, "boss", "w0")
        with self.assertRaises(pacer.InvalidArgumentError):
            pacer.mint_credential(cred, "worker", "w0")  # minting needs the job token itself

    def test_unreachable_pacerd_raises_unavailable_within_budget(self):
        start = time.monotonic()
        with self.assertRaises(pacer.UnavailableError) as cm:
            pacer.Client(address=UNREACHABLE, token="t", worker_id="w0", connect_budget_ms=1_000,
                         rpc_timeout_ms=500)
        self.assertIn(UNREACHABLE, str(cm.exception))
        # The budget bounds the retries: no hang (a generous bound for a loaded machine).
        self.assertLess(time.monotonic() - start, 30)

    def test_missing_worker_id_raises_invalid_argument(self):
        saved = os.environ.pop("PACER_WORKER_ID", None)
        try:
            with self.assertRaises(pacer.InvalidArgumentError) as cm:
                pacer.Client(address=self.pacerd.address, token=self.pacerd.token, connect_budget_ms=1_000)
            self.assertIn("worker", str(cm.exception).lower())
        finally:
            if saved is not None:
                os.environ["PACER_WORKER_ID"] = saved

    def test_unknown_dataset_raises(self):
        with pacer.Client(address=self.pacerd.address, token=self.pacerd.token, worker_id="w-unknown",
                          call_budget_ms=5_000) as c:
            r = pacer.ShardReader(c, dataset="no-such-dataset")
            with self.assertRaises(pacer.Error) as cm:
                r.next(10)
            self.assertIn("no-such-dataset", str(cm.exception))

    def test_invalid_arguments_raise(self):
        with self.assertRaises(pacer.InvalidArgumentError):
            pacer.Client(address=self.pacerd.address, token=self.pacerd.token, worker_id="w",
                         initial_micro_batch=0)
        with pacer.Client(address=self.pacerd.address, token=self.pacerd.token, worker_id="w-args") as c:
            with self.assertRaises(pacer.InvalidArgumentError):
                pacer.ShardReader(c, dataset="x").next(0)

    def test_blocking_connect_releases_the_gil(self):
        # While one thread retries an unreachable pacerd inside C++, this thread keeps running.
        result = {}

        def connect():
            try:
                pacer.Client(address=UNREACHABLE, token="t", worker_id="w0", connect_budget_ms=3_000,
                             rpc_timeout_ms=500)
            except pacer.Error as e:
                result["error"] = e

        t = threading.Thread(target=connect)
        samples = [time.monotonic()]
        t.start()
        while t.is_alive():
            samples.append(time.monotonic())
            time.sleep(0.001)
        t.join()
        self.assertIsInstance(result.get("error"), pacer.UnavailableError)
        gaps = [b - a for a, b in zip(samples, samples[1:])]
        # With the GIL held the main thread would stall for the whole ~3 s budget.
        self.assertLess(max(gaps), 1.5, f"main thread stalled {max(gaps):.2f} s")


class ReadingTest(unittest.TestCase):
    def setUp(self):
        self.tmp = temp_dir()
        self.pacerd = Pacerd(self.tmp.name)

    def tearDown(self):
        self.pacerd.stop()
        self.tmp.cleanup()

    def client(self, worker_id, **kw):
        return pacer.Client(address=self.pacerd.address, token=self.pacerd.token, worker_id=worker_id, **kw)

    def test_connects_from_environment(self):
        env = {"PACER_ADDR": self.pacerd.address, "PACER_TOKEN": self.pacerd.token,
               "PACER_WORKER_ID": "env-worker", "PACER_JOB": "job1"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with pacer.Client() as c:
                self.assertEqual(c.worker_id, "env-worker")
                self.assertEqual(c.address, self.pacerd.address)
                self.assertGreater(c.incarnation, 0)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_reads_every_record_once_and_progress_is_counted(self):
        with self.client("w0", initial_micro_batch=16) as c:
            self.assertTrue(c.register_dataset("train", num_records=1000, shard_size=100, num_epochs=1))
            self.assertFalse(c.register_dataset("train", num_records=1000, shard_size=100, num_epochs=1))
            self.assertEqual(c.batch_plan(0).micro_batch, 16)
            r = pacer.ShardReader(c, dataset="train")
            timer = pacer.StepTimer(c)
            seen = []
            step = 0
            while True:
                timer.begin_step(step, 64)
                with timer.data_wait():
                    outcome, ids = r.next(64)
                if not ids:
                    self.assertEqual(outcome, pacer.Outcome.END_OF_DATA)
                    break
                seen.extend(ids)
                timer.note_progress(len(ids))  # the running step's progress, for the heartbeat
                r.mark_consumed()
                report = timer.end_step(64, len(ids))
                self.assertEqual(report["samples"], len(ids))
                step += 1
            self.assertEqual(sorted(seen), list(range(1000)))
            self.assertEqual(r.leases_read, 10)
            c.flush(30_000)
            stats = c.stats()
            self.assertEqual(stats["completions_acked"], 10)
            self.assertGreaterEqual(stats["steps_sent"], 1)
            c.check_health()
            del r
        # Every record is counted done: another worker finds nothing left.
        with self.client("w1") as c2:
            outcome, ids = pacer.ShardReader(c2, dataset="train").next(10)
            self.assertEqual((outcome, ids), (pacer.Outcome.END_OF_DATA, []))

    def test_iteration_and_checkpoint_restore(self):
        with self.client("w0") as c:
            c.register_dataset("train", num_records=400, shard_size=100, num_epochs=1, shuffle="none")
            r = pacer.ShardReader(c, dataset="train")
            first = []
            for rid in r:
                first.append(rid)
                if len(first) == 200:
                    break
            r.mark_consumed()
            r.save_checkpoint("half")
            rest = list(r)
            r.mark_consumed()
            self.assertEqual(sorted(first + rest), list(range(400)))
            c.flush(30_000)
            r.restore_checkpoint("half")
            again = list(r)
            r.mark_consumed()
            # Back at the checkpoint: what was done then stays done, the rest comes again.
            self.assertEqual(sorted(again), sorted(rest))


class ExclusionTest(unittest.TestCase):
    def setUp(self):
        self.tmp = temp_dir()
        self.pacerd = Pacerd(self.tmp.name)

    def tearDown(self):
        self.pacerd.stop()
        self.tmp.cleanup()

    def client(self, worker_id, **kw):
        return pacer.Client(address=self.pacerd.address, token=self.pacerd.token, worker_id=worker_id, **kw)

    def test_opt_in_and_not_excluded_until_pacerd_decides(self):
        with self.client("w-default") as c:
            self.assertFalse(c.honors_exclusion)
        with self.client("w-opt-in", honors_exclusion=True) as c:
            self.assertTrue(c.honors_exclusion)
            # Heartbeats carry the opt-in; nothing was decided, so nothing changes.
            hb = c.stats()["heartbeats_ok"]
            wait_for(lambda: c.stats()["heartbeats_ok"] >= hb + 2, 30, "two heartbeats")
            self.assertFalse(c.excluded)
            self.assertEqual(c.exclusion_version, 0)
            c.check_health()

    def test_release_all_hands_leases_to_another_worker_each_record_once(self):
        seen = []
        with self.client("w0", honors_exclusion=True) as c0, \
                self.client("w1", honors_exclusion=True) as c1:
            c0.register_dataset("train", num_records=400, shard_size=50, num_epochs=1)
            r0 = pacer.ShardReader(c0, dataset="train")
            # 75 records: the second lease is half read, so at least it goes back.
            while len(seen) < 75:
                outcome, ids = r0.next(25)
                self.assertEqual(outcome, pacer.Outcome.RECORDS)
                seen.extend(ids)
            self.assertEqual(len(seen), 75)
            self.assertFalse(r0.holding_off)
            with self.assertRaises(pacer.InvalidArgumentError):
                r0.release_all(timeout_ms=0)
            released = r0.release_all(timeout_ms=10_000)
            self.assertGreaterEqual(released, 1)
            self.assertTrue(r0.holding_off)
            self.assertEqual(r0.release_all(), 0, "idempotent")
            # Holding off: nothing is leased, WAIT at once even when asked to block.
            self.assertEqual(r0.next(25), (pacer.Outcome.WAIT, []))
            # The other worker finishes the dataset.
            r1 = pacer.ShardReader(c1, dataset="train")
            while True:
                outcome, ids = r1.next(25)
                seen.extend(ids)
                r1.mark_consumed()
                if not ids:
                    self.assertEqual(outcome, pacer.Outcome.END_OF_DATA)
                    break
            self.assertEqual(sorted(seen), list(range(400)), "every record exactly once")
            # Included again: leasing goes on and finds the data done.
            r0.resume()
            self.assertFalse(r0.holding_off)
            self.assertEqual(r0.next(25), (pacer.Outcome.END_OF_DATA, []))
            del r0, r1

    def test_release_all_releases_the_gil(self):
        # pacerd stopped: release_all waits for an acknowledgement that never comes, in C++.
        c = self.client("w-gil", honors_exclusion=True, rpc_timeout_ms=500, call_budget_ms=5_000)
        c.register_dataset("train", num_records=100, shard_size=50, num_epochs=1)
        r = pacer.ShardReader(c, dataset="train")
        outcome, ids = r.next(10)
        self.assertEqual(len(ids), 10)
        self.pacerd.stop()
        result = {}

        def release():
            try:
                result["released"] = r.release_all(timeout_ms=2_000)
            except pacer.Error as e:
                result["error"] = e

        t = threading.Thread(target=release)
        samples = [time.monotonic()]
        t.start()
        while t.is_alive():
            samples.append(time.monotonic())
            time.sleep(0.001)
        t.join()
        self.assertIn("error", result, "pacerd is gone: the release cannot be acknowledged")
        self.assertTrue(r.holding_off, "leasing stays stopped after a failed release")
        gaps = [b - a for a, b in zip(samples, samples[1:])]
        self.assertLess(max(gaps), 1.0, f"main thread stalled {max(gaps):.2f} s")
        c.close(flush_timeout_ms=100)  # first: the reader's destructor then does not retry
        del r


if __name__ == "__main__":
    unittest.main(verbosity=2)
