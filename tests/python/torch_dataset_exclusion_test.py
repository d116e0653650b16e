"""pacer.torch.LeasedShardDataset carrying out EXCLUDE_WORKERS (lockstep=True, client=...) with
a real ShardReader against a pacerd subprocess. The exclusion state comes from a stand-in for
the client's ``excluded`` property (pacerd cannot be driven into deciding one from here; the C
API test covers a real decision reaching an opted-in client): while excluded the dataset hands
its leases back once and yields empty batches marked ``excluded`` (weight 0), another worker
finishes the data meanwhile (every record exactly once), and when included again it resumes
and sees the end of the data.

Skips (exit 77, ctest SKIP_RETURN_CODE) with a message when torch cannot be imported.
"""

import sys
import unittest

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

import pacer
import pacer.torch as pt
from pacerd_fixture import Pacerd, temp_dir


class Exclusion:
    """What the dataset reads of the client: ``excluded``."""

    def __init__(self):
        self.excluded = False


class DatasetExclusionTest(unittest.TestCase):
    def setUp(self):
        self.tmp = temp_dir()
        self.pacerd = Pacerd(self.tmp.name)

    def tearDown(self):
        self.pacerd.stop()
        self.tmp.cleanup()

    def client(self, worker_id):
        return pacer.Client(address=self.pacerd.address, token=self.pacerd.token, worker_id=worker_id,
                            honors_exclusion=True)

    def test_excluded_rank_hands_leases_back_and_yields_weight_zero_batches(self):
        with self.client("w0") as c0, self.client("w1") as c1:
            c0.register_dataset("train", num_records=400, shard_size=50, num_epochs=1)
            r0 = pacer.ShardReader(c0, dataset="train")
            state = Exclusion()
            ds = pt.LeasedShardDataset(r0, load=lambda ids: list(ids), batch_size=25, lockstep=True,
                                       client=state)
            it = iter(ds)
            seen = []
            while len(seen) < 75:  # the second lease half read
                b = next(it)
                self.assertFalse(b.excluded)
                self.assertFalse(b.end_of_data)
                seen.extend(b.ids)
                ds.mark_consumed()
            state.excluded = True
            for _ in range(3):
                b = next(it)
                self.assertTrue(b.excluded)
                self.assertEqual((b.ids, b.data, b.end_of_data), ([], [], False))
                self.assertTrue(r0.holding_off)
            # The other worker finishes the data with the leases w0 handed back.
            r1 = pacer.ShardReader(c1, dataset="train")
            while True:
                outcome, ids = r1.next(25)
                seen.extend(ids)
                r1.mark_consumed()
                if not ids:
                    self.assertEqual(outcome, pacer.Outcome.END_OF_DATA)
                    break
            self.assertEqual(sorted(seen), list(range(400)), "every record exactly once")
            state.excluded = False
            b = next(it)
            self.assertFalse(r0.holding_off, "resumed when included again")
            self.assertFalse(b.excluded)
            self.assertEqual(b.ids, [])
            self.assertTrue(b.end_of_data)
            c1.close()
            c0.close()

    def test_client_needs_lockstep(self):
        with self.assertRaises(ValueError):
            pt.LeasedShardDataset(object(), load=list, lockstep=False, client=Exclusion())


if __name__ == "__main__":
    unittest.main(verbosity=2)
