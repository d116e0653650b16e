#!/usr/bin/env bash
# Installs Pacer's build and test dependencies from Debian's packages, idempotently:
# apt-get runs only when dpkg says a package is missing.
# etcd-server's postinst starts a system etcd on 2379/2380; this script keeps it from starting
# (a policy-rc.d that denies every start while apt-get runs) and stops and disables one that runs
# anyway. Nothing in Pacer uses a system etcd: the tests start their own members.
#   scripts/install-deps.sh            build + test deps
#   scripts/install-deps.sh --torch    also python3-torch (PyTorch examples)
#   scripts/install-deps.sh --clang    also clang-14 + sanitizer runtimes (the fuzzers, the sanitizer
#                                      builds, thread_safety_test)
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
      python3-kubernetes python3-yaml  # offline validation of deploy/ (tests/k8s, docs/kubernetes.md)
      etcd-server etcd-client)  # the etcd journal's tests start 3-member clusters (tests/testing/etcd_cluster.h)
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

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# Stops and disables the system etcd that etcd-server's package sets up, under systemd or
# sysvinit; silent when it neither runs nor starts at boot.
quiet_system_etcd() {
  installed etcd-server || return 0
  if [ -d /run/systemd/system ]; then
    if systemctl is-enabled --quiet etcd.service 2>/dev/null || systemctl is-active --quiet etcd.service; then
      echo "install-deps: stopping and disabling the system etcd (systemd)"
      $SUDO systemctl disable --now etcd.service >/dev/null 2>&1 || true
    fi
  fi
  if [ -x /etc/init.d/etcd ] && compgen -G "/etc/rc[2345].d/S[0-9][0-9]etcd" >/dev/null; then
    echo "install-deps: disabling the system etcd at boot (update-rc.d)"
    $SUDO update-rc.d etcd disable >/dev/null 2>&1 || true
  fi
  # The package runs its daemon as user etcd; etcd processes of other users (tests) are left alone.
  if getent passwd etcd >/dev/null && pgrep -u etcd -x etcd >/dev/null; then
    echo "install-deps: stopping the system etcd"
    if [ -x /etc/init.d/etcd ]; then $SUDO /etc/init.d/etcd stop >/dev/null 2>&1 || true; fi
    local pids
    pids=$(pgrep -u etcd -x etcd || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || $SUDO kill -KILL $pids 2>/dev/null || true
  fi
}

missing=()
for p in "${pkgs[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  quiet_system_etcd
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"

# While apt-get runs, a policy-rc.d that answers 101 ("action forbidden") to every invoke-rc.d
# keeps postinst scripts from starting daemons. One already there that forbids starting etcd is
# kept; any other is set aside and put back afterwards; ours is removed only if we created it.
policy=/usr/sbin/policy-rc.d
policy_saved=""
policy_created=0
restore_policy() {
  if [ -n "$policy_saved" ]; then
    $SUDO mv -f "$policy_saved" "$policy"
  elif [ "$policy_created" = 1 ]; then
    $SUDO rm -f "$policy"
  fi
}
if [ -x "$policy" ] && { "$policy" etcd start >/dev/null 2>&1; [ $? -eq 101 ]; }; then
  :  # it already forbids starting etcd
else
  if [ -e "$policy" ]; then
    policy_saved=$($SUDO mktemp /tmp/policy-rc.d.XXXXXX)
    $SUDO cp -p "$policy" "$policy_saved"
  else
    policy_created=1
  fi
  trap restore_policy EXIT
  printf '#!/bin/sh\n# scripts/install-deps.sh: no daemon starts while packages install.\nexit 101\n' |
    $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
quiet_system_etcd
echo "install-deps: done"
