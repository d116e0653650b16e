#!/usr/bin/env bash
# The demo (README's first command): sets up this machine, builds what the demo needs, and runs
# demo/pacer_demo.py -- pacerd, two agents with two pacer-train-mlp workers each, real CPU
# contention on one worker, the same job under policy `none` and then the AntDT-DD preset; a
# summary table, demo-out/report.html and (--json) the summary as JSON. `--mode ps`: the
# parameter-server example (pacer-ps, pacer-train-ctr) under `none` and then AntDT-ND.
#   scripts/demo.sh [--mode ps] [--quick] [--json] [--policy FILE] [--out DIR] ...   (demo/pacer_demo.py --help)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh >&2
TARGETS="pacerd pacerctl pacer-agent pacer-train-mlp pacer-train-ctr pacer-ps pacer-ledger-check" scripts/build.sh >/dev/null
# Debian's python3 when present (the demo needs only the standard library).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
exec "$PY" demo/pacer_demo.py "$@"
