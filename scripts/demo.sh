#!/usr/bin/env bash
# The demo (until the full straggler demo lands): sets up this machine, builds, starts pacerd in a
# fresh data dir, runs 4 sample workers over a 2-epoch dataset, kill -9's pacerd twice while they
# work, and shows that every record was still counted done exactly once.
#   scripts/demo.sh            (outputs under ./demo-out)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
TARGETS="pacerd pacerctl pacer-consume pacer-ledger-check" scripts/build.sh >/dev/null
BIN=${BUILD_DIR:-build}/bin
OUT=demo-out
rm -rf "$OUT"; mkdir -p "$OUT"
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill -9 "$p" 2>/dev/null || true; done; pkill -9 -f "$OUT/data" 2>/dev/null || true; }
trap cleanup EXIT INT TERM

start_pacerd() {
  rm -f "$OUT/port.json"
  "$BIN/pacerd" --data-dir "$OUT/data" --listen "127.0.0.1:${PORT:-0}" --metrics-listen 127.0.0.1:0 \
    --port-file "$OUT/port.json" --lease-timeout-ms 3000 >>"$OUT/pacerd.log" 2>&1 &
  PACERD=$!
  for _ in $(seq 1 200); do [ -s "$OUT/port.json" ] && break; sleep 0.05; done
  PORT=$(sed -E 's/.*"port":([0-9]+).*/\1/' "$OUT/port.json")
}
start_pacerd
echo "pacerd serving on 127.0.0.1:$PORT (data dir $OUT/data)"
RECORDS=200000
for i in 0 1 2 3; do
  "$BIN/pacer-consume" --addr "127.0.0.1:$PORT" --token-file "$OUT/data/job.token" --worker-id "w$i" \
    --register-records $RECORDS --shard-size 500 --epochs 2 --shuffle shards --batch 50 --step-ms 2 \
    --quiet --ledger "$OUT/ledger-w$i" >"$OUT/worker-w$i.log" 2>&1 &
  pids+=($!)
done
for round in 1 2; do
  sleep 2
  "$BIN/pacerctl" --addr "127.0.0.1:$PORT" --data-dir "$OUT/data" datasets
  echo "--- kill -9 pacerd (round $round); workers keep retrying; restarting it from its journal"
  kill -9 "$PACERD"; wait "$PACERD" 2>/dev/null || true
  start_pacerd
done
for p in "${pids[@]}"; do wait "$p"; done
pids=()
"$BIN/pacerctl" --addr "127.0.0.1:$PORT" --data-dir "$OUT/data" datasets
cat "$OUT"/worker-w*.log | grep "end of data" || true
"$BIN/pacer-ledger-check" --records $RECORDS --epochs 2 "$OUT"/ledger-w*
kill "$PACERD"; wait "$PACERD" 2>/dev/null || true
