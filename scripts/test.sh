#!/usr/bin/env bash
# Sets up a Debian 12 machine (idempotently), builds, and runs every test: ctest, every label
# (unit, scenario, process, chaos, demo, fuzz; README.md, "Tests").
# Usage: scripts/test.sh [ctest args...], e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --torch --chromium --clang  # clang: thread_safety_test
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j 2 "$@"
