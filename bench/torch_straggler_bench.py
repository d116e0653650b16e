#!/usr/bin/python3
"""A user's PyTorch DDP job with a straggler, without and with Pacer's mitigation, in one run.

The trainer is tests/python/docs_trainer.py (written only from docs/pytorch.md: a map-style
dataset whose __getitem__ costs real CPU, num_workers=2 loader processes, a BatchNorm MLP, no
StepTimer). 4 ranks run under one pacer-agent (each in its own CPU budget, --worker-cpu-limit,
its loader processes included), env:// rendezvous from the agent's torchrun variables. Once 15 %
of the records are done, one rank gets a 3x CPU quota (pacerctl contention). Two runs, each with
a fresh pacerd: policy demo-none (no mitigation) and demo-dedicated (batch plans; the
dedicated preset with windows short enough for a job of a minute).

With --seeds N the two runs are made once per seed (the trainer's --seed: the model's
initialisation and the loader's order), and the figures below are printed per seed and as means
over the seeds, the accuracy with and without the plan per seed and their mean difference.

Prints, per run, the job time, the accuracy, the straggler's measured speed against its
neighbours' (median) between the contention and the first plan after it, the CPU its process
tree got over that span (training process + loader processes, read from /proc) against its
neighbours' (the contention caps the whole tree: about 1/factor on an idle machine), the batch
plans executed (and how many came after the first one after the contention: "after
convergence"), the throughput after the last plan
against the balanced bound sum_i v_i (each rank's measured samples per second of its own
compute), and the exactly-once check of the model's view (every record once, from the ledger);
then the speed-up none / dedicated (job times), and the ratio of the steady throughputs (dedicated after
its last plan, none after the contention: the mitigation without the time it took to detect the
straggler and plan). Exits 1 when a record was lost or trained twice, or a run
failed; the figures are printed, not asserted.

    /usr/bin/python3 bench/torch_straggler_bench.py --bin build/bin [--records 60000] [--seeds 3]
        [--min-local-batch K] [--out DIR]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import torch_ledger  # noqa: E402
from pacerd_fixture import DOCS_TRAINER, Children, Pacerd  # noqa: E402

WORLD = 4
STRAGGLER = "w1"


CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root_pid):
    """{worker id: (CPU seconds of its training process, of its loader processes)} for the
    ranks under the agent ``root_pid``, read from /proc (utime + stime, whole process trees)."""
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(fields[1])
        cpu[int(d)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    children = {}
    for pid, pp in parent.items():
        children.setdefault(pp, []).append(pid)
    out = {}
    for pid in children.get(root_pid, []):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        wid = env.get(b"PACER_WORKER_ID", b"").decode()
        if not wid:
            continue
        stack, loaders = list(children.get(pid, [])), 0.0
        while stack:
            c = stack.pop()
            loaders += cpu.get(c, 0.0)
            stack.extend(children.get(c, []))
        out[wid] = (cpu.get(pid, 0.0), loaders)
    return out


def tree_cores(samples):
    """The cores each rank's training process and loader processes got over ``samples`` (polls
    with a "cpu" entry), the straggler's against the median of its neighbours'. A poll-to-poll
    decrease (a loader process exited, its CPU time gone from /proc) counts as nothing."""
    dt = samples[-1]["t"] - samples[0]["t"]
    per = {}
    for a, b in zip(samples, samples[1:]):
        for w in b["cpu"]:
            if w in a["cpu"]:
                acc = per.setdefault(w, [0.0, 0.0])
                for k in (0, 1):
                    acc[k] += max(0.0, b["cpu"][w][k] - a["cpu"][w][k])
    per = {w: [v / dt for v in acc] for w, acc in per.items()}
    others = [v for w, v in per.items() if w != STRAGGLER]
    if STRAGGLER not in per or not others:
        return None
    med = [sorted(v[k] for v in others)[len(others) // 2] for k in (0, 1)]
    return {"straggler_trainer": round(per[STRAGGLER][0], 3), "straggler_loaders": round(per[STRAGGLER][1], 3),
            "neighbours_trainer": round(med[0], 3), "neighbours_loaders": round(med[1], 3),
            "seconds": round(dt, 1)}


class Run:
    def __init__(self, args, policy, out, seed=0):
        self.args, self.policy, self.dir, self.seed = args, policy, out, seed
        self.children = Children()
        self.samples = []
        self.contention_t = None

    def ctl(self, *cmd, timeout=15):
        out = subprocess.run([os.path.join(self.args.bin, "pacerctl"), "--addr", self.addr, "--data-dir",
                              self.data, "--json", *cmd], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"pacerctl {' '.join(cmd)}: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def start(self):
        a = self.args
        policy = os.path.join(ROOT, "policies", f"demo-{self.policy}.yaml")
        if a.min_local_batch and self.policy == "dedicated":
            # the policy's floor on a rank's local batch (adjust_batch.min_local_batch)
            text = open(policy).read().replace("min_local_batch: 1", f"min_local_batch: {a.min_local_batch}")
            policy = os.path.join(self.dir, "policy.yaml")
            with open(policy, "w") as f:
                f.write(text)
        d = Pacerd(self.dir, heartbeat_interval_ms=500, bin_dir=a.bin, children=self.children,
                   extra_args=["--policy", policy,
                               "--job-mode", "sync", "--reconcile-interval-ms", "1000"])
        self.addr, self.data = d.address, d.data_dir
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(a.bin), "python"), OMP_NUM_THREADS="1")
        trainer = ["/usr/bin/python3", DOCS_TRAINER,
                   "--out", os.path.join(self.dir, "out"), "--records", str(a.records),
                   "--epochs", str(a.epochs), "--batch", str(a.batch), "--cost", str(a.cost),
                   "--seed", str(self.seed)]
        self.t0 = time.monotonic()
        self.agent = self.children.start(
            [os.path.join(a.bin, "pacer-agent"), "--addr", self.addr, "--token-file", d.token_file, "--node", "n0",
             "--workers", str(WORLD), "--heartbeat-ms", "500", "--metrics-ms", "500", "--max-restarts", "0",
             "--worker-cpu-limit", str(a.worker_cores), "--", *trainer],
            env=env, log_path=os.path.join(self.dir, "agent.log"))

    def poll(self):
        ds = self.ctl("datasets").get("datasets", [])
        done = sum(int(d.get("records_done_total", 0)) for d in ds)
        ws = self.ctl("workers").get("workers", [])
        workers = {w["id"]: float(w.get("speed", 0)) for w in ws}
        s = {"t": time.monotonic() - self.t0, "done": done, "sum_speed": sum(workers.values()),
             "workers": workers,
             "steps": {w["id"]: {k: round(float(w.get(k, 0)), 4) for k in ("compute_s", "comm_s", "wall_s")}
                       for w in ws},
             "batch": {w["id"]: int(w.get("local_batch", 0)) for w in ws},
             "cpu": tree_cpu(self.agent.pid)}
        self.samples.append(s)
        return s

    def watch(self):
        a = self.args
        expected = a.records * a.epochs
        while self.agent.poll() is None:
            if time.monotonic() - self.t0 > a.run_timeout_s:
                raise RuntimeError(f"run {self.policy} did not finish in {a.run_timeout_s} s")
            try:
                s = self.poll()
            except (RuntimeError, subprocess.TimeoutExpired, ValueError):
                time.sleep(0.5)
                continue
            if self.contention_t is None and s["done"] >= 0.15 * expected and len(s["workers"]) == WORLD:
                self.ctl("contention", STRAGGLER, str(a.factor), timeout=30)
                self.contention_t = s["t"]
                print(f"  [{self.policy}] {s['t']:.1f}s contention x{a.factor:g} on {STRAGGLER}", flush=True)
            time.sleep(0.5)
        self.jct_s = time.monotonic() - self.t0
        if self.agent.returncode != 0:
            raise RuntimeError(f"run {self.policy}: pacer-agent exited {self.agent.returncode} "
                               f"(see {self.dir}/agent.log)")
        self.actions = self.ctl("actions").get("actions", [])
        with open(os.path.join(self.dir, "samples.json"), "w") as f:
            json.dump({"samples": self.samples, "actions": self.actions}, f)

    def stop(self):
        self.children.kill_all()

    def report(self):
        a = self.args
        expected = a.records * a.epochs
        out = os.path.join(self.dir, "out")
        results = [json.load(open(os.path.join(out, f"result-{r}.json"))) for r in range(WORLD)]
        view, _ = torch_ledger.model_view(out)
        lost = sum(1 for i in range(a.records) if view[i] < a.epochs)
        dup = sum(1 for i in range(a.records) if view[i] > a.epochs)
        t0_wall = time.time() - (time.monotonic() - self.t0)
        plans = [x for x in self.actions if x.get("kind") == "ADJUST_BS" and x.get("outcome") == "executed"]
        plan_ts = [float(x.get("time_ms", 0)) / 1000 - t0_wall for x in plans]
        after_contention = [t for t in plan_ts if self.contention_t is not None and t >= self.contention_t]
        end_i = next((i for i, s in enumerate(self.samples) if s["done"] >= 0.95 * expected), len(self.samples) - 1)
        start = (after_contention[-1] + 2.0) if after_contention else ((self.contention_t or 0) + 2.0)
        win = [s for i, s in enumerate(self.samples) if s["t"] >= start and i <= end_i]
        tput = bound = None
        if len(win) >= 3:
            tput = (win[-1]["done"] - win[0]["done"]) / max(win[-1]["t"] - win[0]["t"], 1e-6)
            bound = sum(s["sum_speed"] for s in win[1:]) / (len(win) - 1)
        # The straggler's measured speed against its neighbours' (median), between the contention
        # and the first plan after it (without plans: until 90 % of the records, before ranks
        # run out of data): with its loader processes capped too, about 1/factor.
        first_plan = after_contention[0] if after_contention else float("inf")
        cw = [s for s in self.samples if self.contention_t is not None
              and self.contention_t + 2.0 <= s["t"] < first_plan and s["done"] < 0.9 * expected
              and len(s["workers"]) == WORLD]
        ratios = []
        for s in cw:
            others = sorted(v for k, v in s["workers"].items() if k != STRAGGLER)
            if others and others[len(others) // 2] > 0:
                ratios.append(s["workers"].get(STRAGGLER, 0) / others[len(others) // 2])
        rate = sorted(ratios)[len(ratios) // 2] if ratios else None
        # The CPU each rank's process tree got over the same span (cores): the training process
        # and its loader processes, the straggler against the median of its neighbours.
        cores = None
        cw = [s for s in cw if len(s.get("cpu", {})) == WORLD]
        if len(cw) >= 2 and cw[-1]["t"] > cw[0]["t"]:
            cores = tree_cores(cw)
        last_batch = self.samples[-1]["batch"] if self.samples else {}
        return {"policy": self.policy, "seed": self.seed, "jct_s": round(self.jct_s, 1),
                "straggler_rate_vs_neighbours": round(rate, 3) if rate else None,
                "cores_after_contention": cores,
                "local_batches_at_end": last_batch,
                "accuracy": results[0]["accuracy"], "checksums_equal": len({r["checksum"] for r in results}) == 1,
                "plans": len(plans), "plans_after_convergence": max(0, len(after_contention) - 1),
                "throughput": round(tput, 1) if tput else None, "bound": round(bound, 1) if bound else None,
                "throughput_over_bound": round(tput / bound, 3) if tput and bound else None,
                "lost": lost, "duplicated": dup, "repeats": [r["repeats"] for r in results],
                "tail_releases": [r.get("tail_releases", 0) for r in results],
                "samples": [r["samples"] for r in results]}


def fmt_cores(c, args):
    """The straggler's tree against its cap (the whole tree's CPU at the cap: the loader
    processes are capped with the trainer; the trainer alone at it: they are not)."""
    if not c:
        return "n/a"
    cap = args.worker_cores / args.factor
    return (f"{c['straggler_trainer']:.3f} + {c['straggler_loaders']:.3f} = "
            f"{c['straggler_trainer'] + c['straggler_loaders']:.3f} cores (cap {cap:.3f}), neighbours "
            f"{c['neighbours_trainer']:.3f} + {c['neighbours_loaders']:.3f} (limit {args.worker_cores:g} each)")


def summarise(reports, args):
    """One line per seed (none against dedicated), then the means over the seeds."""
    pairs = []
    for seed in range(args.seeds):
        by = {r["policy"]: r for r in reports if r["seed"] == seed}
        if "none" not in by or "dedicated" not in by:
            continue
        n, d = by["none"], by["dedicated"]
        pairs.append((n, d))
        steady = (f"{d['throughput'] / n['throughput']:.2f}x" if d["throughput"] and n["throughput"]
                  else "n/a")
        print(f"seed {seed}: speed-up none/dedicated: {n['jct_s'] / d['jct_s']:.2f}x (target >= 1.5); "
              f"steady throughput dedicated (after its last plan) / none (after the contention): {steady}; "
              f"throughput/bound after the plan: {d['throughput_over_bound']} (target >= 0.8); "
              f"plans after convergence: {d['plans_after_convergence']} (target <= 3); "
              f"straggler's rate / neighbours' (none, dedicated before its plan): "
              f"{n['straggler_rate_vs_neighbours']}, {d['straggler_rate_vs_neighbours']}; "
              f"straggler's trainer + loader processes in none: {fmt_cores(n['cores_after_contention'], args)}; "
              f"accuracy {n['accuracy']:.4f} vs {d['accuracy']:.4f}; "
              f"lost/duplicated: {n['lost']}/{n['duplicated']} and {d['lost']}/{d['duplicated']}", flush=True)
    if not pairs:
        return
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    speedups = [n["jct_s"] / d["jct_s"] for n, d in pairs]
    ratios = [d["throughput_over_bound"] for _, d in pairs if d["throughput_over_bound"] is not None]
    diffs = [100 * (d["accuracy"] - n["accuracy"]) for n, d in pairs]
    print(f"over {len(pairs)} seeds: speed-up {mean(speedups):.2f}x (per seed "
          f"{', '.join(f'{x:.2f}' for x in speedups)}; target >= 1.5); throughput/bound after the plan "
          f"{mean(ratios):.3f} (per seed {', '.join(f'{x:.3f}' for x in ratios)}; target >= 0.8); "
          f"accuracy none {mean([n['accuracy'] for n, _ in pairs]):.4f}, dedicated "
          f"{mean([d['accuracy'] for _, d in pairs]):.4f}, dedicated - none {mean(diffs):+.2f} points "
          f"(per seed {', '.join(f'{x:+.2f}' for x in diffs)}; target within 0.5)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--records", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64, help="each rank's starting batch")
    ap.add_argument("--cost", type=int, default=40, help="per-sample CPU work in __getitem__")
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--worker-cores", type=float, default=0.45)
    ap.add_argument("--run-timeout-s", type=float, default=900)
    ap.add_argument("--policies", default="none,dedicated")
    ap.add_argument("--seeds", type=int, default=1,
                    help="run the policies once per seed (the trainer's --seed: initialisation and order)")
    ap.add_argument("--min-local-batch", type=int, default=0,
                    help="demo-dedicated with adjust_batch.min_local_batch set to this (0: the preset's)")
    ap.add_argument("--out", default=None, help="keep the runs' files here (default: a temp dir, removed)")
    args = ap.parse_args()
    base = args.out or tempfile.mkdtemp(prefix="torch-bench-")
    reports = []
    ok = True
    try:
        for seed in range(args.seeds):
            for policy in args.policies.split(","):
                out = os.path.join(base, f"seed{seed}", policy)
                os.makedirs(out, exist_ok=True)
                run = Run(args, policy, out, seed)
                try:
                    print(f"run {policy} seed {seed}: {WORLD} ranks, {args.records} records, x{args.factor:g} on "
                          f"{STRAGGLER} from 15 % (load {os.getloadavg()[0]:.1f})", flush=True)
                    run.start()
                    run.watch()
                    r = run.report()
                except RuntimeError as e:
                    print(f"  FAILED: {e}", flush=True)
                    ok = False
                    continue
                finally:
                    run.stop()
                r["load_1min_at_end"] = round(os.getloadavg()[0], 1)
                print("  " + json.dumps(r), flush=True)
                ok = ok and r["lost"] == 0 and r["duplicated"] == 0 and r["checksums_equal"]
                reports.append(r)
        summarise(reports, args)
    finally:
        if not args.out:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
