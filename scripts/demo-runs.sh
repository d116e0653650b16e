#!/usr/bin/env bash
# Runs the demo N times (default 3) and prints one Markdown table row per run: the figures
# docs/demo.md and the closing notes quote. Extra arguments go to demo/pacer_demo.py.
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
print("| # | job time none (s) | job time mitigated (s) | speed-up | throughput / Σv_i after the plan "
      "| all-reduce per step (s) | throughput / (Σv_i + all-reduce) | flagged after (s) | plan after (s) "
      "| records expected = done | counted twice / missing | accuracy none / mitigated |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for i in range(1, n + 1):
    d = json.load(open(f"{out}/{i}.json"))
    base, mit = d["runs"][0], d["runs"][-1]
    print(f"| {i} | {base['jct_s']} | {mit['jct_s']} | {d['speedup']:.2f}× | {mit['throughput_vs_bound']} "
          f"| {mit['sync_s']} | {mit['throughput_vs_bound_with_sync']} | {mit['detect_s']} | {mit['plan_s']} "
          f"| {mit['records_expected']} = {mit['records_done']} "
          f"| {mit['records_duplicated']} / {mit['records_missing']} | {base['accuracy']} / {mit['accuracy']} |")
PY
