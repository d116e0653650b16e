#!/usr/bin/env python3
"""One Markdown table over pacer-sim's JSON reports (scripts/sim-report.sh writes them to
sim-out/NAME.json): per scenario, the balanced bound, `none`, the best baseline, each preset,
the best preset against the best baseline, and the share of the bound's gain over `none` that
the best preset reaches. Usage: scripts/sim-summary.py [DIR]   (default: sim-out)
"""
import json
import pathlib
import sys

BASELINES = ("none", "backup-workers", "lb-bsp", "timeout-relaunch")
PRESETS = ("dedicated", "non-dedicated")


def hours(s):
    return f"{s / 3600:.2f}h" if s >= 3600 else f"{s / 60:.1f}m"


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "sim-out")
    reports = sorted(out.glob("*.json"))
    if not reports:
        sys.exit(f"sim-summary: no pacer-sim JSON reports in {out}/ (run scripts/sim-report.sh first)")
    print("| scenario | bound | none | best baseline | dedicated | non-dedicated | best preset / best baseline | share of the bound's gain |")
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for path in reports:
        try:
            r = json.loads(path.read_text())
            runs = {p["name"]: p for p in r["policies"]}
            bound = r["bound_jct_s"]
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"sim-summary: {path}: not a pacer-sim report ({e})")
        if any(p["records_lost"] or p["records_duplicated"] for p in runs.values()):
            failed += 1
        finished = {n: p for n, p in runs.items() if p["finished"]}
        base = [n for n in BASELINES if n in finished]
        pre = [n for n in PRESETS if n in finished]
        if "none" not in finished or not base or not pre:
            print(f"| {r['scenario']} | {hours(bound)} | (a run missing or unfinished) ||||||")
            continue
        best_b = min(base, key=lambda n: finished[n]["jct_s"])
        best_p = min(pre, key=lambda n: finished[n]["jct_s"])
        jb, jp, jn = finished[best_b]["jct_s"], finished[best_p]["jct_s"], finished["none"]["jct_s"]

        def cell(n):
            if n not in finished:
                return "—"
            p = finished[n]
            return f"{hours(p['jct_s'])} ({p['efficiency']:.3f})"

        room = jn - bound
        share = f"{(jn - jp) / room:.2f}" if room > 0.01 * jn else "— (none is within 1 % of the bound)"
        print(f"| {r['scenario']} | {hours(bound)} | {cell('none')} | {best_b} {cell(best_b)} | "
              f"{cell('dedicated')} | {cell('non-dedicated')} | {best_p} {jp / jb:.3f} | {share} |")
    print()
    print("JCT (efficiency against the bound; above 1: relaunches moved work off slow nodes or servers "
          "that the bound keeps). Share of the bound's gain: (JCT none − JCT best preset) / "
          "(JCT none − bound).")
    if failed:
        sys.exit(f"sim-summary: {failed} scenario(s) lost or double-counted records")


if __name__ == "__main__":
    main()
