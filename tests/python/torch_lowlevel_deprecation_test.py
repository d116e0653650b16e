"""The low-level pacer.torch API is deprecated (docs/pytorch.md, "Moving off the low-level API"):
each piece warns with a DeprecationWarning that names its replacement and the migration note,
from the caller's line; what stays does not warn: pacer.torch's own step state (the
DistributedDataParallel path), and LeasedShardDataset with client= (EXCLUDE_WORKERS). No pacerd
needed: the warnings come before any use of the client. Skips (77) without torch.
"""

import sys
import unittest
import warnings

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

import pacer.torch as pt
from pacer.torch.step import StepState

NOTE = 'docs/pytorch.md, "Moving off the low-level API"'


class DeprecationTest(unittest.TestCase):
    def caught(self, fn):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                fn()
            except Exception:  # noqa: BLE001  (the warning comes first; the stand-in args may fail later)
                pass
        return [x for x in w if issubclass(x.category, DeprecationWarning)]

    def assert_deprecated(self, fn, replacement):
        w = self.caught(fn)
        self.assertEqual(len(w), 1, [str(x.message) for x in w])
        self.assertIn(replacement, str(w[0].message))
        self.assertIn(NOTE, str(w[0].message))
        self.assertEqual(w[0].filename, __file__, "the warning points at the caller's line")

    def test_each_piece_warns(self):
        self.assert_deprecated(lambda: pt.LeasedShardDataset(None, lambda ids: ids, 8), "pacer.torch.DataLoader")
        self.assert_deprecated(lambda: pt.WeightedAverageState(), "pacer.torch.DistributedDataParallel")
        self.assert_deprecated(lambda: pt.timed_step(None, 0, 8), "DataLoader times every step")
        self.assert_deprecated(lambda: pt.BatchPlanCallback(None), "applies the batch plan")
        self.assert_deprecated(lambda: pt.all_ranks_done(True), "ends on every rank")

    def test_what_stays_does_not_warn(self):
        self.assertEqual(self.caught(StepState), [])
        self.assertEqual(self.caught(lambda: pt.LeasedShardDataset(None, lambda ids: ids, 8, lockstep=True,
                                                                   client=object())), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
