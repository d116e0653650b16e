#!/usr/bin/env bash
# Builds with clang-14 and a sanitizer, then runs the unit, scenario and process tests under it.
#   scripts/sanitize.sh address   # ASan + UBSan, into build-asan
#   scripts/sanitize.sh thread    # TSan (suppressions: tests/tsan.supp), into build-tsan
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}
case "$kind" in address) dir=build-asan ;; thread) dir=build-tsan ;; *) echo "usage: $0 address|thread" >&2; exit 2 ;; esac
scripts/install-deps.sh --clang
BUILD_DIR=$dir scripts/build.sh -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DPACER_SANITIZE="$kind" -DPACER_BUILD_BENCH=OFF
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1"
export ASAN_OPTIONS="detect_leaks=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
cd "$dir" && ctest --output-on-failure -j 2 -L "unit|scenario|process"
