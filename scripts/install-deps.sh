#!/usr/bin/env bash
# Installs Pacer's build and test dependencies from Debian's packages, idempotently:
# apt-get runs only when dpkg says a package is missing.
#   scripts/install-deps.sh            build + test deps
#   scripts/install-deps.sh --torch    also python3-torch (PyTorch examples)
#   scripts/install-deps.sh --clang    also clang-14 + sanitizer runtimes
#   scripts/install-deps.sh --containers  also podman, runc and debootstrap (the `container` tests,
#                                      docs/containers.md)
#   scripts/install-deps.sh --runtime  only the shared libraries the installed programs need (the
#                                      slim image's run stage; Containerfile); with --python also
#                                      python3 for the `pacer` module (the trainer base image)
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config ccache curl
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      librocksdb-dev libboost-dev libboost-program-options-dev prometheus-cpp-dev
      libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
      pybind11-dev python3-dev libabsl-dev nlohmann-json3-dev
      libssl-dev  # libssl-dev: TLS to the Kubernetes API (agent/kube_client.cc, Boost.Beast), TLS files (common/tls.cc)
      openssl     # openssl: the tests make their CA and certificates with it (tests/tls, tests/pacerd/tls_test.cc)
      prometheus  # prometheus: promtool + the server, for tests/monitoring/ (docs/metrics.md)
      python3-kubernetes python3-yaml)  # offline validation of deploy/ (tests/k8s, docs/kubernetes.md)
# `kubectl kustomize` for tests/k8s: the machine's kubectl, else Debian's (kubernetes-client).
command -v kubectl >/dev/null 2>&1 || pkgs+=(kubernetes-client)
# What pacerd, pacer-agent, pacerctl, pacer-probe, pacer-ps and the Python module link (ldd).
runtime_pkgs=(ca-certificates libabsl20220623 libboost-program-options1.74.0 libbz2-1.0 libc-ares2
              libcivetweb1 libgflags2.2 libgrpc++1.51 libgrpc29 liblz4-1 libprometheus-cpp-core1.0
              libprometheus-cpp-pull1.0 libprotobuf32 libre2-9 librocksdb7.8 libsnappy1v5 libssl3
              libyaml-cpp0.7 libzstd1 zlib1g)
runtime=0
for arg in "$@"; do
  case "$arg" in
    --runtime) runtime=1 ;;
    --python) runtime_pkgs+=(python3) ;;
    --torch) pkgs+=(python3-torch python3-numpy) ;;
    --clang) pkgs+=(clang-14 libclang-rt-14-dev) ;;
    --containers) pkgs+=(podman runc debootstrap) ;;
    --chromium) pkgs+=(chromium) ;;
    *) echo "install-deps: unknown option '$arg'" >&2; exit 2 ;;
  esac
done
if [ "$runtime" = 1 ]; then pkgs=("${runtime_pkgs[@]}"); fi

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
