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
          "| all-reduce per step (s) | throughput / (Σv_i + all-reduce) | flagged after (s) | plan after (s) "
          "| records expected = done | counted twice / missing | accuracy none / mitigated |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for i in range(1, n + 1):
    d = json.load(open(f"{out}/{i}.json"))
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
PY
