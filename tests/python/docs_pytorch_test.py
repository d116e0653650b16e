"""docs/pytorch.md and worker_sdk/python/README.md as written: every fenced block of them is run,
so a wrong flag, a missing import or a changed API fails here. The blocks are read from the doc itself; the test knows each by
its first line and fails on a block it does not know (a new or edited block needs a runner
below). What the test adds, and nothing else:

  - ports: pacerd listens on a port the OS picks (the doc's 127.0.0.1:7070 becomes its address
    in the commands; pacerctl gets it from PACER_ADDR, its documented variable) and torchrun's
    rendezvous port comes from PET_MASTER_PORT (torchrun's variable for --master_port);
  - the commands run in a temp folder where build/ and examples/ link to the real ones (and
    TMPDIR, where torchrun puts its logs, is in it);
  - the Python blocks get MyDataset and MyModel (the doc's placeholders) and run under two
    ranks on Gloo against a pacerd of the test (the ledger recipe with a checkpoint every 5
    steps instead of 200, for a short run; the pt.weighted loop with torch's DDP as
    written; its engine notes are prose, their numbers checked by torch_weighted_test.py);
    the checkpoint recipe's `...` (the loop body)
    is the per-sample-loss block plus the update of the migration;
  - the set-up's install and build commands are not run (they install system packages and
    build the tree this test runs from): the flag exists and the scripts are executable.
Every process is reaped; each wait has a deadline. Skips (77) without torch.
"""

import ast
import collections
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import unittest

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(77)

from pacerd_fixture import (Children, Pacerd, bin_path, free_port, log_tails, temp_dir, torch_rank_env,
                            wait_for)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "pytorch.md")
SDK_README = os.path.join(REPO, "worker_sdk", "python", "README.md")
DOC_ADDR = "127.0.0.1:7070"

# The doc's placeholders: a small map-style dataset and a model for it.
PRELUDE = '''
import torch
class MyDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 1024
    def __getitem__(self, i):
        x = torch.randn(8, generator=torch.Generator().manual_seed(int(i)))
        return x, int(x[:4].sum() > 0) + 2 * int(x[4:].sum() > 0)
def MyModel():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))
'''


def read_blocks(path):
    """[(language, text)] of the fenced blocks of a Markdown file, in order."""
    blocks, lang, lines = [], None, []
    with open(path) as f:
        for line in f:
            fence = re.match(r"^```(\S*)\s*$", line)
            if fence and lang is None:
                lang, lines = fence.group(1), []
            elif fence:
                blocks.append((lang, "".join(lines)))
                lang = None
            elif lang is not None:
                lines.append(line)
    return blocks


def commands(text):
    """The commands of a shell block: continuation lines joined, blank lines left out."""
    return [c for c in text.replace("\\\n", " ").splitlines() if c.strip()]


def first_line(text):
    return next((line for line in text.splitlines() if line.strip()), "")


class Blocks:
    """The doc's blocks by the first line the test knows them by."""

    KNOWN = {
        "setup": ("sh", "scripts/install-deps.sh --torch"),
        "migration": ("diff", " import torch, torch.distributed as dist"),
        "weighted": ("python", "import torch, torch.distributed as dist"),
        "per_sample": ("python", "per_sample = F.cross_entropy("),
        "checkpoint": ("python", "import os"),
        "ledger": ("python", "import json"),
        "pacerd": ("sh", "build/bin/pacerd --data-dir data &"),
        "torchrun": ("sh", "PACER_ADDR=127.0.0.1:7070 PACER_TOKEN=$(cat data/job.token)"),
        "agent": ("sh", "build/bin/pacerctl --data-dir data datasets reset train"),
    }

    def __init__(self):
        self.all = read_blocks(DOC)
        self.by_name = {}
        self.unknown = []
        for lang, text in self.all:
            name = next((n for n, (l, start) in self.KNOWN.items()
                         if l == lang and first_line(text).startswith(start)), None)
            if name is None or name in self.by_name:
                self.unknown.append((lang, first_line(text)))
            else:
                self.by_name[name] = text

    def __getitem__(self, name):
        return self.by_name[name]


BLOCKS = Blocks()


def diff_sides(diff):
    """(before, after) of a diff block: ' ' lines in both, '-' before, '+' after."""
    before, after = [], []
    for line in diff.splitlines():
        mark, rest = line[:1], line[1:]
        if mark in (" ", ""):
            before.append(rest)
            after.append(rest)
        elif mark == "-":
            before.append(rest)
        elif mark == "+":
            after.append(rest)
    return "\n".join(before) + "\n", "\n".join(after) + "\n"


def recipe_script(block, ckpt_every=None, inject=""):
    """The migrated script up to its loop, ``inject``, then the recipe ``block`` ("checkpoint" or
    "ledger") whose loop body (its ``...``) is the per-sample-loss block and the update; with
    ``ckpt_every`` the recipe's CKPT_EVERY (200 steps) becomes that."""
    _, after = diff_sides(BLOCKS["migration"])
    setup = after.split("\nfor x, y in loader:", 1)[0] + "\n"
    update = [line for line in after.splitlines() if "loss.backward()" in line]
    if len(update) != 1:
        raise AssertionError(f"the migration's update line: {update}")
    body = textwrap.indent(BLOCKS["per_sample"] + update[0].strip() + "\n", "    ")
    recipe = BLOCKS[block]
    if recipe.count("\n    ...\n") != 1:
        raise AssertionError(f"the {block} recipe has no single '    ...' loop body:\n{recipe}")
    recipe = recipe.replace("\n    ...\n", "\n" + body)
    if ckpt_every is not None:
        if recipe.count('CKPT, CKPT_EVERY = "ckpt.pt", 200') != 1:
            raise AssertionError(f"the {block} recipe's CKPT_EVERY line changed:\n{recipe}")
        recipe = recipe.replace('CKPT, CKPT_EVERY = "ckpt.pt", 200', f'CKPT, CKPT_EVERY = "ckpt.pt", {ckpt_every}')
    return PRELUDE + setup + inject + recipe + "print('DONE', loader.step)\n"


def workdir(tmp):
    """A folder where the doc's relative paths work: build/ and examples/ link to the real ones."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(bin_path("pacerd"))))
    cwd = os.path.join(tmp, "work")
    os.makedirs(cwd)
    os.symlink(build, os.path.join(cwd, "build"))
    os.symlink(os.path.join(REPO, "examples"), os.path.join(cwd, "examples"))
    return cwd


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACER_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


class DocsPytorchTest(unittest.TestCase):
    def test_every_block_has_a_runner(self):
        self.assertEqual(BLOCKS.unknown, [],
                         "docs/pytorch.md has blocks this test does not run: give them a runner")
        self.assertEqual(sorted(BLOCKS.by_name), sorted(Blocks.KNOWN))
        self.assertEqual([(lang, first_line(text)) for lang, text in read_blocks(SDK_README)],
                         [("sh", "PYTHONPATH=build/python /usr/bin/python3 -c 'import pacer, pacer.torch'"),
                          ("python", "import torch, torch.distributed as dist")],
                         "worker_sdk/python/README.md's blocks changed: give them a runner")

    def test_sdk_readme(self):
        """The README's import check in a folder with build/, and its script under two ranks."""
        (_, check), (_, script) = read_blocks(SDK_README)
        with temp_dir() as tmp:
            cwd = workdir(tmp)
            for command in commands(check):
                r = subprocess.run(["bash", "-c", command], cwd=cwd, env=clean_env(), timeout=120,
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
            with Pacerd(tmp) as d:
                self.run_ranks(PRELUDE + script, tmp, d, "readme")

    def test_setup(self):
        lines = commands(BLOCKS["setup"])
        self.assertEqual(len(lines), 3, lines)
        install, build, check = lines
        # Not run: the install flag exists, the build script is there.
        flag = shlex.split(install, comments=True)
        self.assertEqual(flag[0], "scripts/install-deps.sh")
        with open(os.path.join(REPO, flag[0])) as f:
            script = f.read()
        for arg in flag[1:]:
            self.assertIn(f"{arg})", script, f"scripts/install-deps.sh does not take {arg}")
        self.assertTrue(os.access(os.path.join(REPO, flag[0]), os.X_OK))
        self.assertTrue(os.access(os.path.join(REPO, shlex.split(build, comments=True)[0]), os.X_OK))
        with temp_dir() as tmp:
            cwd = workdir(tmp)
            r = subprocess.run(["bash", "-c", check], cwd=cwd, env=clean_env(), timeout=120,
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)

    def run_ranks(self, script, tmp, d, name, world=2, timeout_s=240):
        path = os.path.join(tmp, f"{name}.py")
        with open(path, "w") as f:
            f.write(script)
        out = os.path.join(tmp, name)
        os.makedirs(out, exist_ok=True)
        port = free_port()
        with Children() as children:
            for r in range(world):
                children.start([sys.executable, path], env=torch_rank_env(d, r, world, port), cwd=out,
                               log_path=f"{tmp}/{name}-r{r}.log")
            codes = children.wait_all(timeout_s=timeout_s)
        self.assertEqual(codes, [0] * world, log_tails(tmp, name) + "\n--- script\n" + script)
        return out

    def test_migration(self):
        before, after = diff_sides(BLOCKS["migration"])
        compile(before, "before", "exec")  # the plain DDP script parses too
        with temp_dir() as tmp, Pacerd(tmp) as d:
            self.run_ranks(PRELUDE + after + "print('DONE', loader.step)\n", tmp, d, "migration")
            with open(f"{tmp}/migration-r0.log") as f:
                self.assertIn("DONE", f.read())

    def test_weighted_loop(self):
        """The pt.weighted loop (torch's DDP, no hook) under two ranks, to the end of the data."""
        with temp_dir() as tmp, Pacerd(tmp) as d:
            self.run_ranks(PRELUDE + BLOCKS["weighted"] + "print('DONE', loader.step)\n", tmp, d, "weighted")
            with open(f"{tmp}/weighted-r0.log") as f:
                self.assertIn("DONE", f.read())

    def test_checkpoint_recipe(self):
        """A first start (its step-0 checkpoint), then a start that resumes from that file."""
        script = recipe_script("checkpoint")
        with temp_dir() as tmp, Pacerd(tmp) as d:
            out = self.run_ranks(script, tmp, d, "checkpoint")
            self.assertTrue(os.path.exists(os.path.join(out, "ckpt.pt")))
            self.run_ranks(script, tmp, d, "checkpoint")

    def test_ledger_recipe_runs(self):
        """The recipe with a ledger, a first start and a resume from its last checkpoint: every
        (epoch, index) once in the ledger (kill -9 of the job and of a rank:
        torch_ledger_recipe_test.py)."""
        script = recipe_script("ledger", ckpt_every=5)
        with temp_dir() as tmp, Pacerd(tmp) as d:
            self.run_ranks(script, tmp, d, "ledger")
            out = self.run_ranks(script, tmp, d, "ledger")
            seen = collections.Counter()
            for r in range(2):
                with open(os.path.join(out, f"ledger-{r}.jsonl")) as f:
                    for line in f:
                        seen.update(tuple(p) for p in json.loads(line)["records"])
        self.assertEqual(set(seen), {(e, i) for e in range(3) for i in range(1024)})
        self.assertEqual([p for p, n in seen.items() if n > 1], [])

    def test_ledger_keep_steps_before(self):
        """keep_steps_before() keeps the lines of earlier steps and drops a line cut by a crash."""
        tree = ast.parse(BLOCKS["ledger"])
        func = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "keep_steps_before"]
        self.assertEqual(len(func), 1, "the ledger recipe defines keep_steps_before")
        with temp_dir() as tmp:
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                scope = {"os": os, "json": json, "LEDGER": "ledger-1.jsonl"}
                exec(ast.get_source_segment(BLOCKS["ledger"], func[0]), scope)
                with open("ledger-1.jsonl", "w") as f:
                    for step in range(6):
                        f.write('{"step": %d, "records": [[0, %d]]}\n' % (step, step))
                    f.write('{"step": 6, "rec')
                scope["keep_steps_before"](4)
                with open("ledger-1.jsonl") as f:
                    self.assertEqual([line for line in f], ['{"step": %d, "records": [[0, %d]]}\n' % (s, s)
                                                            for s in range(4)])
                scope["keep_steps_before"](0)
                self.assertEqual(os.path.getsize("ledger-1.jsonl"), 0)
            finally:
                os.chdir(cwd)

    def test_running_it(self):
        """pacerd as the doc starts it, the example under torchrun, then reset and pacer-agent."""
        with temp_dir() as tmp, Children() as children:
            cwd = workdir(tmp)
            start = commands(BLOCKS["pacerd"])
            self.assertEqual(len(start), 1, start)
            argv = shlex.split(start[0])
            self.assertEqual(argv[-1], "&")
            port_file = os.path.join(tmp, "pacerd.port")
            pacerd = children.start(argv[:-1] + ["--listen", "127.0.0.1:0", "--metrics-listen", "",
                                                 "--port-file", port_file],
                                    cwd=cwd, env=clean_env(), log_path=os.path.join(tmp, "pacerd.log"))

            def port():
                if pacerd.poll() is not None:
                    raise RuntimeError(f"pacerd exited: {log_tails(tmp)}")
                try:
                    with open(port_file) as f:
                        return int(f.read().split('"port":')[1].split(",")[0].strip(" }\n"))
                except (OSError, IndexError, ValueError):
                    return None

            addr = f"127.0.0.1:{wait_for(port, 60, 'pacerd serving')}"
            env = clean_env(PACER_ADDR=addr, PET_MASTER_PORT=str(free_port()), TMPDIR=tmp)
            for block in ("torchrun", "agent"):
                for i, command in enumerate(commands(BLOCKS[block])):
                    command = command.replace(DOC_ADDR, addr)
                    log = os.path.join(tmp, f"{block}-{i}.log")
                    p = children.start(["bash", "-c", command], cwd=cwd, env=env, log_path=log)
                    try:
                        code = p.wait(timeout=300)
                    except subprocess.TimeoutExpired:
                        children.stop(p, grace_s=5)
                        raise AssertionError(f"{command}: not done within 300 s\n" + log_tails(tmp, block))
                    self.assertEqual(code, 0, f"{command}\n" + log_tails(tmp, block))


if __name__ == "__main__":
    unittest.main(verbosity=2)
