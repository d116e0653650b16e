#!/usr/bin/env python3
"""ctest demo_verdict: the demo report's figures tell the truth, checked on the functions the
report is made with (no demo run: seconds):
  - the verdict explains the figure: a job that ended shortly after its plan says so ("too
    short to gain; run without --quick"), no plan / no detection say that, a real gain says by
    how much;
  - the tail of the records never has a negative duration: the 95 % crossing is interpolated
    between polls and the last poll (after the end) is dated at the end;
  - chart axes get 1-2-5 steps with enough ticks (a 9 s run: 0, 1, 2, ..., not 0 and 5).
  demo_verdict_test.py DEMO_PY
"""
import importlib.util
import sys
import types


def load(path):
    spec = importlib.util.spec_from_file_location("pacer_demo", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def main():
    demo = load(sys.argv[1])
    failures = []

    def expect(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    args = types.SimpleNamespace(mode="allreduce", quick=True, straggler="w1")

    def summary(speedup, **mit):
        run = {"jct_s": 20.0, "detect_s": 1.5, "plan_s": 3.0, "after_plan_s": 1.2,
               "throughput_vs_bound": None}
        run.update(mit)
        return {"speedup": speedup, "runs": [{"jct_s": 19.0}, run]}

    v = demo.verdict(args, summary(0.94))
    expect("1.2 s after the first batch plan" in v and "too short to gain" in v and
           "run without --quick" in v, f"short job after the plan: {v!r}")
    v = demo.verdict(args, summary(None, plan_s=None, after_plan_s=None))
    expect("before a batch plan was executed" in v, f"no plan: {v!r}")
    v = demo.verdict(args, summary(None, detect_s=None, plan_s=None, after_plan_s=None))
    expect("was not flagged" in v, f"no detection: {v!r}")
    v = demo.verdict(types.SimpleNamespace(mode="allreduce", quick=False, straggler="w1"),
                     summary(1.31, jct_s=60.0, after_plan_s=40.0, throughput_vs_bound=0.91))
    expect("1.31× faster" in v and "0.91 of the balanced bound" in v and "--quick" not in v,
           f"a real gain: {v!r}")
    v = demo.verdict(args, summary(0.98, jct_s=60.0, after_plan_s=40.0))
    expect("not faster" in v, f"a plan that did not pay: {v!r}")

    # The tail: the job ended at 9.0 s; polls at 8.2 s (90 %) and 9.4 s (100 %, after the end:
    # the demo measures against the end, 9.0 s): 95 % is crossed at 8.6 s, 0.4 s before it.
    samples = [{"t": 7.0, "done": 800}, {"t": 8.2, "done": 900}, {"t": 9.0, "done": 1000}]
    t95 = demo.crossing_time(samples, 950)
    expect(abs(t95 - 8.6) < 1e-9 and 9.0 - t95 >= 0, f"95 % crossing interpolated: {t95}")
    expect(demo.crossing_time(samples, 2000) is None, "a level never reached: None")
    expect([demo.tick_label(v) for v in (0, 0.2, 5, 20000, 4e9)] == ["0", "0.2", "5", "20000", "4000000000"],
           "tick labels: plain numbers")

    for span, target in ((9, 8), (25.3, 8), (150, 8), (0.7, 5), (43000, 5)):
        t = demo.ticks(span, target)
        steps = {round(b - a, 9) for a, b in zip(t, t[1:])}
        expect(len(t) >= 4 and len(steps) == 1 and t[-1] <= span + 1e-9,
               f"ticks({span}): {len(t)} evenly spaced ticks {t[:4]}...")
    print("PASS" if not failures else f"{len(failures)} FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
