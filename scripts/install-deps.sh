#!/usr/bin/env bash
# Installs Pacer's build and test dependencies from Debian's packages, idempotently:
# apt-get runs only when dpkg says a package is missing.
#   scripts/install-deps.sh            build + test deps
#   scripts/install-deps.sh --torch    also python3-torch (PyTorch examples)
#   scripts/install-deps.sh --clang    also clang-14 + sanitizer runtimes
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config ccache curl
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      librocksdb-dev libboost-dev libboost-program-options-dev prometheus-cpp-dev
      libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
      pybind11-dev python3-dev libabsl-dev nlohmann-json3-dev
      libssl-dev  # libssl-dev: TLS to the Kubernetes API (agent/kube_client.cc, Boost.Beast)
      prometheus)  # prometheus: promtool + the server, for tests/monitoring/ (docs/metrics.md)
for arg in "$@"; do
  case "$arg" in
    --torch) pkgs+=(python3-torch python3-numpy) ;;
    --clang) pkgs+=(clang-14 libclang-rt-14-dev) ;;
    --chromium) pkgs+=(chromium) ;;
    *) echo "install-deps: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
