"""Reads the ledgers tests/python/docs_trainer.py writes and checks the model's view.

Each rank appends {"start": attempt, "resumed": {"attempt": a, "step": s} | null} when an attempt
starts and {"attempt", "step", "ids"} for every step whose batch counted. The final model
descends from a chain of attempts: the last attempt trained steps >= s_last, on top of the
checkpoint attempt a saved at step s_last, which trained steps in [s_a, s_last) on top of its
own checkpoint, and so on. The model's view is the records of those steps, over all ranks.
"""

import collections
import glob
import json
import os


def read(out_dir):
    starts = {}    # attempt -> resumed (None or {"attempt", "step"})
    steps = collections.defaultdict(list)  # attempt -> [(step, ids)]
    for path in sorted(glob.glob(os.path.join(out_dir, "ledger-*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by kill -9
                if "start" in e:
                    starts[e["start"]] = e["resumed"]
                else:
                    steps[e["attempt"]].append((e["step"], e["ids"]))
    return starts, steps


def model_view(out_dir):
    """Counter of record id -> times the final model trained on it; and the chain of
    (attempt, first step, end step) it descends from."""
    starts, steps = read(out_dir)
    if not starts:
        raise AssertionError(f"no attempt started in {out_dir}")
    attempt = max(starts)
    end = None
    chain = []
    view = collections.Counter()
    while True:
        resumed = starts.get(attempt)
        first = resumed["step"] if resumed else 0
        chain.append((attempt, first, end))
        for step, ids in steps.get(attempt, []):
            if step >= first and (end is None or step < end):
                view.update(ids)
        if resumed is None:
            break
        attempt, end = resumed["attempt"], first
    return view, list(reversed(chain))


def assert_exactly_once(testcase, out_dir, records, epochs):
    view, chain = model_view(out_dir)
    missing = [i for i in range(records) if view[i] < epochs]
    extra = [i for i in range(records) if view[i] > epochs]
    stray = [i for i in view if not 0 <= i < records]
    testcase.assertEqual((len(missing), len(extra), len(stray)), (0, 0, 0),
                         f"chain {chain}: {len(missing)} records seen fewer than {epochs} times "
                         f"(e.g. {missing[:5]}), {len(extra)} more often (e.g. {extra[:5]}), "
                         f"stray {stray[:5]}")
    return chain
