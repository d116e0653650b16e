#!/usr/bin/env bash
# Configures and builds Pacer into ./build (Release with debug info, ccache when present).
#   scripts/build.sh [extra cmake args...]   e.g. -DPACER_SANITIZE=address -DCMAKE_CXX_COMPILER=clang++-14
#   TARGETS="pacerd pacerctl" scripts/build.sh   builds only those targets
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 "$@"
fi
if [ -n "${TARGETS:-}" ]; then
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target $TARGETS
else
  cmake --build "$BUILD_DIR" -j "$(nproc)"
fi
