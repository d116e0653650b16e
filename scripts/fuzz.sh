#!/usr/bin/env bash
# The long fuzz run (docs/security.md, "Fuzzing"): the fuzz targets built with clang-14,
# libFuzzer, ASan and UBSan into build-fuzz, then pacer_rpc_fuzz run for MINUTES (default 10)
# against an in-process pacerd under libFuzzer's RSS limit, and sharding_state_fuzz for a fifth
# of that. Not part of scripts/test.sh or CI, which run the short smoke runs (ctest -L fuzz).
#   scripts/fuzz.sh [MINUTES] [libFuzzer flags...]   e.g. scripts/fuzz.sh 30 -jobs=2 -workers=2
# New inputs go to build-fuzz/<target>_corpus (kept between runs), crashes to
# build-fuzz/<target>_artifacts/. Replay one with build-fuzz/bin/<target> FILE, or with the gcc
# build's bin/<target> FILE (the same checks, without the sanitizers).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
shift || true
dir=${BUILD_DIR:-build-fuzz}
scripts/install-deps.sh --clang
BUILD_DIR=$dir TARGETS="pacer_rpc_fuzz sharding_state_fuzz policy_loader_fuzz" scripts/build.sh \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DPACER_SANITIZE=address \
  -DPACER_FUZZ=ON -DPACER_BUILD_BENCH=OFF
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TEST_TMPDIR=${TEST_TMPDIR:-$(mktemp -d)}
run() {  # run TARGET SECONDS SEED_CORPUS [flags...]
  local target=$1 seconds=$2 seeds=$3
  shift 3
  mkdir -p "$dir/${target}_corpus" "$dir/${target}_artifacts"
  "$dir/bin/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len=65536 -timeout=120 -print_final_stats=1 -artifact_prefix="$dir/${target}_artifacts/" "$@" \
    "$dir/${target}_corpus" "$seeds"
}
run pacer_rpc_fuzz $((minutes * 60)) tests/fuzz/rpc_fuzz_corpus "$@"
run sharding_state_fuzz $((minutes * 12)) tests/fuzz/sharding_state_corpus "$@"
