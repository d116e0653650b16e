#!/usr/bin/env bash
# The long fuzz run (docs/security.md, "Fuzzing"): pacer_rpc_fuzz built with clang-14, libFuzzer,
# ASan and UBSan into build-fuzz, then run for MINUTES (default 10) against an in-process pacerd,
# under libFuzzer's RSS limit. Not part of scripts/test.sh or CI, which run the short smoke run
# (ctest pacer_rpc_fuzz_smoke) instead.
#   scripts/fuzz.sh [MINUTES] [libFuzzer flags...]   e.g. scripts/fuzz.sh 30 -jobs=2 -workers=2
# New inputs go to build-fuzz/rpc_fuzz_corpus (kept between runs), crashes to
# build-fuzz/rpc_fuzz_artifacts/. Replay one with: build-fuzz/bin/pacer_rpc_fuzz FILE, or with the
# gcc build's bin/pacer_rpc_fuzz FILE (the same checks, without the sanitizers).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
shift || true
dir=${BUILD_DIR:-build-fuzz}
scripts/install-deps.sh --clang
BUILD_DIR=$dir TARGETS="pacer_rpc_fuzz policy_loader_fuzz" scripts/build.sh \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DPACER_SANITIZE=address \
  -DPACER_FUZZ=ON -DPACER_BUILD_BENCH=OFF
mkdir -p "$dir/rpc_fuzz_corpus" "$dir/rpc_fuzz_artifacts"
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TEST_TMPDIR=${TEST_TMPDIR:-$(mktemp -d)}
"$dir/bin/pacer_rpc_fuzz" -max_total_time=$((minutes * 60)) -rss_limit_mb=2048 -malloc_limit_mb=2048 \
  -max_len=65536 -timeout=120 -print_final_stats=1 -artifact_prefix="$dir/rpc_fuzz_artifacts/" "$@" \
  "$dir/rpc_fuzz_corpus" tests/fuzz/rpc_fuzz_corpus
