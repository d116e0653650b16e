#!/usr/bin/env bash
# Runs pacer-sim on every shipped scenario (sim/scenarios/*.yaml) with the default policies
# (four baselines, two presets) and prints one table per scenario, in Markdown-ready code
# blocks, then one summary table over them all (scripts/sim-summary.py: each preset against the
# best baseline and the bound); SVG plots and JSON go to ${OUT:-sim-out}/. Usage:
#   scripts/sim-report.sh                  # every scenario (large-mixed takes minutes)
#   SKIP=large-mixed scripts/sim-report.sh # leave some out (space-separated names)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-sim-out}
SKIP=${SKIP:-}
if [ ! -x "$BUILD_DIR/bin/pacer-sim" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja >/dev/null
  cmake --build "$BUILD_DIR" --target pacer-sim
fi
mkdir -p "$OUT"
status=0
for f in sim/scenarios/*.yaml; do
  name=$(basename "$f" .yaml)
  case " $SKIP " in *" $name "*) continue ;; esac
  echo "### $name"
  echo
  echo '```'
  "$BUILD_DIR/bin/pacer-sim" --scenario "$f" --svg "$OUT/$name.svg" --json-file "$OUT/$name.json" \
    | tee "$OUT/$name.txt" || status=$?
  echo '```'
  echo
done
echo "### Summary"
echo
python3 scripts/sim-summary.py "$OUT" || status=$?
exit $status
