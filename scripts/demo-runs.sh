#!/usr/bin/env bash
# Runs the demo N times (default 3) and prints one Markdown table row per run: the figures
# docs/demo.md quotes. Extra arguments go to demo/pacer_demo.py
# (`--mode ps`: the parameter-server demo, with its own columns).
#   scripts/demo-runs.sh [N] [demo args...]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
shift || true
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for i in $(seq 1 "$N"); do
  /usr/bin/python3 demo/pacer_demo.py --json --live off --out "$OUT/run-$i" "$@" > "$OUT/$i.json"
done
/usr/bin/python3 - "$OUT" "$N" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
ps = json.load(open(f"{out}/1.json")).get("mode") == "ps"
if ps:
    print("| # | job time none (s) | job time mitigated (s) | speed-up | last 5 % none / mitigated (s) "
          "| throughput / Σv_i none / mitigated | throughput / Σ samples per wall s none / mitigated "
          "| flagged after (s) | first action after (s) | actions executed | records expected = done "
          "| counted twice / missing | tail-backup pairs / records trained twice | AUC none / mitigated |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
else:
    print("| # | job time none (s) | job time mitigated (s) | speed-up | throughput / Σv_i after the plan "
          "| all-reduce per step (s) | throughput / (Σv_i + all-reduce) | flagged after (s) "
          "| first plan after the contention (s) | records expected = done | counted twice / missing "
          "| accuracy none / mitigated |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
rows = []
for i in range(1, n + 1):
    d = json.load(open(f"{out}/{i}.json"))
    rows.append(d)
    base, mit = d["runs"][0], d["runs"][-1]
    if ps:
        acts = ", ".join(f"{a['kind']}" + (" (rollback)" if (a["reason"] or "").startswith("rollback") else
                                           " (tail backups)" if (a["reason"] or "").startswith("tail backups") else "")
                         for a in d["actions"]) or "none"
        print(f"| {i} | {base['jct_s']} | {mit['jct_s']} | {d['speedup']:.2f}× "
              f"| {base['last_5pct_s']} / {mit['last_5pct_s']} "
              f"| {base['throughput_vs_bound']} / {mit['throughput_vs_bound']} "
              f"| {base['throughput_vs_wall_bound']} / {mit['throughput_vs_wall_bound']} "
              f"| {mit['detect_s']} | {mit['plan_s']} | {acts} "
              f"| {mit['records_expected']} = {mit['records_done']} "
              f"| {mit['records_duplicated']} / {mit['records_missing']} "
              f"| {mit['tail_backup_pairs']} / {mit['records_trained'] - mit['records_expected']} "
              f"| {base['auc']} / {mit['auc']} |")
        continue
    print(f"| {i} | {base['jct_s']} | {mit['jct_s']} | {d['speedup']:.2f}× | {mit['throughput_vs_bound']} "
          f"| {mit['sync_s']} | {mit['throughput_vs_bound_with_sync']} | {mit['detect_s']} | {mit['plan_s']} "
          f"| {mit['records_expected']} = {mit['records_done']} "
          f"| {mit['records_duplicated']} / {mit['records_missing']} | {base['accuracy']} / {mit['accuracy']} |")
if not ps:
    # One line per acceptance figure over the N runs (docs/demo.md quotes them).
    def span(vals, spec="{:.2f}"):
        vals = [v for v in vals if v is not None]
        return (spec.format(min(vals)) + "–" + spec.format(max(vals))) if vals else "-"
    mits = [d["runs"][-1] for d in rows]
    bases = [d["runs"][0] for d in rows]
    print()
    print(f"speed-up {span([d['speedup'] for d in rows])}× "
          f"({sum(1 for d in rows if (d['speedup'] or 0) >= 1.5)} of {n} runs ≥ 1.5×); "
          f"first plan {span([m['plan_s'] for m in mits], '{:.1f}')} s after the contention; "
          f"throughput / Σv_i after the plan {span([m['throughput_vs_bound'] for m in mits])}")
    once = all(r["records_duplicated"] == 0 and r["records_missing"] == 0 and
               r["records_done"] == r["records_expected"] for d in rows for r in d["runs"])
    dacc = [abs(m["accuracy"] - b["accuracy"]) for m, b in zip(mits, bases)
            if m["accuracy"] is not None and b["accuracy"] is not None]
    print(f"every record once in every run: {'yes' if once else 'NO'} (counted twice / missing: "
          f"{sum(r['records_duplicated'] or 0 for d in rows for r in d['runs'])} / "
          f"{sum(r['records_missing'] or 0 for d in rows for r in d['runs'])}); accuracy "
          f"{'unchanged' if dacc and max(dacc) <= 0.01 else 'CHANGED'} "
          f"(largest difference mitigated vs none {max(dacc) if dacc else float('nan'):.4f})")
PY
