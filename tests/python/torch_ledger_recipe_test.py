"""docs/pytorch.md's checkpoint recipe with a ledger, as written, through two crashes
(issue 27, acceptance 2): 4 ranks under pacer-agent (the doc's agent command with --workers 4),
a checkpoint every 4 steps; the whole job killed with kill -9 after a few steps but before the
first checkpoint after the recipe's step-0 one, and started again as the doc says (the same
command); then one rank killed with kill -9 after a later checkpoint, which the agent answers by
restarting the group. At the end:

  - the ledger (the union of the ranks' ledger-<rank>.jsonl) holds every (epoch, index) of the
    run exactly once;
  - it is what the final model trained on: a journal the test keeps beside the recipe (every
    batch handed out, every checkpoint saved and resumed from, per process) gives the chain of
    checkpoints the final model descends from, and the records of that chain are the ledger's.

The script is docs_pytorch_test.recipe_script("ledger"): the doc's placeholders and blocks,
with CKPT_EVERY 4 instead of 200 and, between the set-up and the recipe, the test's journal
and its kill points. A kill point holds a rank before it trains a given step (it flushes the
ledger's buffer, as a longer run does every 8 KiB, so the lines of the steps after the last
checkpoint are on disk; writes its pid to `held`; and waits), so the test kills at a step it
chose, not after a sleep. The other ranks wait in that step's all-reduce; their own buffered
lines are lost with them, as a crash loses them. Every process is
reaped; each wait has a deadline. Skips (77) without torch.
"""

import collections
import json
import os
import signal
import sys
import unittest

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

from docs_pytorch_test import recipe_script
from pacerd_fixture import Children, Pacerd, bin_path, log_tails, temp_dir, wait_for

WORLD, RECORDS, EPOCHS, CKPT_EVERY = 4, 1024, 3, 4  # the doc's placeholders: 1024 records, 3 epochs

# The test's journal and kill points, put between the script's set-up and the recipe. It never
# changes what the recipe does: it wraps the loader's state_dict / load_state_dict and its
# iteration to note, per process, the checkpoints saved and resumed from and every batch handed
# out; at the step named in the file `hold` (for its rank) a rank stops and waits to be killed.
JOURNAL = r'''
import json as _json, os as _os, signal as _signal, uuid as _uuid
_PROC = _uuid.uuid4().hex
_journal = open(f"journal-{dist.get_rank()}.jsonl", "a")
def _note(**entry):
    _journal.write(_json.dumps(dict(proc=_PROC, **entry)) + "\n")
    _journal.flush()
_note(start=_os.getpid())
_state_dict, _load_state_dict = loader.state_dict, loader.load_state_dict
def _saving():
    state = _state_dict()
    _note(saved=state["tag"], at=state["step"])
    return state
def _resuming(state):
    _load_state_dict(state)
    _note(resumed=state["tag"], at=state["step"])
loader.state_dict, loader.load_state_dict = _saving, _resuming
class _Journaled(type(loader)):
    def __iter__(self):
        for batch in super().__iter__():
            info = self.batch_info
            _note(step=info.step, records=info.records)
            try:
                with open("hold") as f:
                    hold = tuple(int(v) for v in f.read().split())
            except OSError:
                hold = None
            if hold == (dist.get_rank(), info.step):
                # The worst case for the recipe: the ledger's buffered lines reached the file
                # (as they do every 8 KiB in a longer run), so the lines of steps after the last
                # checkpoint are on disk when the kill comes.
                globals()["ledger"].flush()
                with open("held.tmp", "w") as f:
                    f.write(str(_os.getpid()))
                _os.replace("held.tmp", "held")
                while True:
                    _signal.pause()
            yield batch
loader.__class__ = _Journaled
'''


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class LedgerRecipeTest(unittest.TestCase):
    def test_kill_before_first_checkpoint_and_after(self):
        script = recipe_script("ledger", ckpt_every=CKPT_EVERY, inject=JOURNAL)
        with temp_dir() as tmp, Pacerd(tmp) as d, Children() as children:
            out = os.path.join(tmp, "job")
            os.makedirs(out)
            path = os.path.join(tmp, "train.py")
            with open(path, "w") as f:
                f.write(script)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PACER_")}

            def agent(phase):
                # docs/pytorch.md, "Running it": pacer-agent --addr ... --token-file ... --workers N -- python3 script
                return children.start([bin_path("pacer-agent"), "--addr", d.address, "--token-file", d.token_file,
                                       "--workers", str(WORLD), "--", sys.executable, path],
                                      env=env, cwd=out, log_path=os.path.join(tmp, f"agent-{phase}.log"))

            def held(proc, phase):
                def check():
                    if proc.poll() is not None:
                        raise AssertionError(f"the agent exited ({proc.returncode}) before the kill point\n"
                                             + log_tails(tmp, "agent"))
                    try:
                        with open(os.path.join(out, "held")) as f:
                            return int(f.read())
                    except (OSError, ValueError):
                        return None
                pid = wait_for(check, 120, f"phase {phase}: a rank at its kill point")
                os.remove(os.path.join(out, "held"))
                os.remove(os.path.join(out, "hold"))
                return pid

            def journal():
                return {r: read_jsonl(os.path.join(out, f"journal-{r}.jsonl")) for r in range(WORLD)}

            def hold(rank, step):
                with open(os.path.join(out, "hold"), "w") as f:
                    f.write(f"{rank} {step}")

            # 1. Rank 1 stops before step 3 (the first checkpoint after step 0 is at step 4):
            # kill -9 of the whole job (the agent; its workers die with it), then the same command.
            hold(1, 3)
            first = agent(1)
            held(first, 1)
            saved = [e["at"] for es in journal().values() for e in es if "saved" in e]
            # Rank 1 handed out step 3, so every rank trained steps 0-2 (their all-reduces).
            trained = sum(len(e["records"]) for es in journal().values() for e in es
                          if "records" in e and e["step"] < 3)
            self.assertEqual(sorted(set(saved)), [0], "phase 1 got past the first checkpoint")
            self.assertGreater(trained, 0, "phase 1 trained nothing before the kill")
            pids = [e["start"] for es in journal().values() for e in es if "start" in e]
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 60,
                     "the ranks of the killed job gone")

            # 2. The job again; rank 2 stops before step 6, after the checkpoint at step 4:
            # kill -9 of that rank; the agent restarts the group, which resumes from step 4.
            hold(2, 6)
            second = agent(2)
            victim = held(second, 2)
            saved = [e["at"] for es in journal().values() for e in es if "saved" in e]
            self.assertIn(CKPT_EVERY, saved, "phase 2 saved no checkpoint after step 0")
            os.kill(victim, signal.SIGKILL)
            try:
                code = second.wait(timeout=180)
            except Exception:
                raise AssertionError("the restarted job did not finish\n" + log_tails(tmp, "agent"))
            self.assertEqual(code, 0, log_tails(tmp, "agent"))
            with open(os.path.join(tmp, "agent-2.log")) as f:
                self.assertIn("restarting the group", f.read())

            ledger = collections.Counter()
            for r in range(WORLD):
                for e in read_jsonl(os.path.join(out, f"ledger-{r}.jsonl")):
                    ledger.update(tuple(p) for p in e["records"])
            view, chains = model_view(journal())

        want = {(e, i) for e in range(EPOCHS) for i in range(RECORDS)}
        missing = sorted(want - set(ledger))
        twice = sorted(p for p, n in ledger.items() if n > 1)
        self.assertEqual((len(missing), len(twice), sorted(set(ledger) - want)), (0, 0, []),
                         f"ledger: {len(missing)} records missing (e.g. {missing[:5]}), "
                         f"{len(twice)} twice (e.g. {twice[:5]})")
        self.assertEqual(view, ledger, f"the ledger is not what the final model trained on (chains {chains})")
        print(f"PASS: {sum(ledger.values())} ledger records over {WORLD} ranks, each (epoch, index) once, "
              f"= the final model's chain of checkpoints {chains[0]}")


def model_view(journal):
    """The records the final model trained on: per rank, from its last process back through the
    checkpoints each process resumed from, the batches of the steps before the checkpoint that
    was resumed. Returns the Counter of (epoch, index) and each rank's chain [(process, from
    step, to step)]."""
    view = collections.Counter()
    chains = []
    for rank, entries in journal.items():
        procs = [e["proc"] for e in entries if "start" in e]
        saver = {e["saved"]: e["proc"] for e in entries if "saved" in e}
        resumed = {e["proc"]: (e["resumed"], e["at"]) for e in entries if "resumed" in e}
        steps = collections.defaultdict(dict)  # proc -> step -> records (a step handed out once)
        for e in entries:
            if "records" in e:
                steps[e["proc"]][e["step"]] = e["records"]
        proc, end, chain = procs[-1], None, []
        while True:
            tag, first = resumed.get(proc, (None, 0))
            chain.append((proc[:6], first, end))
            for step, records in steps[proc].items():
                if step >= first and (end is None or step < end):
                    view.update(tuple(p) for p in records)
            if tag is None:
                break
            proc, end = saver[tag], first
        chains.append(list(reversed(chain)))
    return view, chains


if __name__ == "__main__":
    unittest.main(verbosity=2)
