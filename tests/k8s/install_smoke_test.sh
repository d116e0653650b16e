#!/usr/bin/env bash
# k8s_install_test: the installed tree run the way the image runs it (Containerfile,
# docs/kubernetes.md "Images").
#   1. `cmake --install BUILD --prefix ROOT/opt/pacer` (the build stage's last step);
#   2. every shared library the installed programs and the Python module load comes from a
#      package of `scripts/install-deps.sh --runtime --python` (or the slim base: libc, libstdc++);
#   3. the root is made read-only (chmod -R a-w; the image runs readOnlyRootFilesystem) and every
#      program runs as an unprivileged user (setpriv, uid/gid 10001 as in the image; skipped with
#      a note when not root) with its data dir on a separate writable dir (the PVC) and the
#      tokens / certificates in files like mounted Secrets (0440);
#   4. pacerd serves TLS from the tree; pacer-probe (the pod's probe) says SERVING; pacer-agent
#      registers over TLS and runs a worker; pacerd restarts on the same data dir (plaintext on
#      loopback) and pacerctl talks to it; `import pacer` works from the tree;
#   5. nothing was written outside the data dir.
# Usage: install_smoke_test.sh BUILD_DIR SOURCE_DIR. Exit 0 pass, 1 fail.
set -uo pipefail
BUILD=$1
SRC=$2
# Under /tmp, not TEST_TMPDIR: uid 10001 must be able to reach it, and a build tree may lie
# below a directory only root can enter (/root).
T=$(mktemp -d /tmp/pacer-install-smoke.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  chmod -R u+w "$T" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$T"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
# Waits (deadline in tenths of a second) for a command to succeed.
wait_for() { local n=$1; shift; for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }

PREFIX=$T/root/opt/pacer
cmake --install "$BUILD" --prefix "$PREFIX" >"$T/install.log" 2>&1 || fail "cmake --install"
for b in pacerd pacer-agent pacerctl pacer-probe; do [ -x "$PREFIX/bin/$b" ] || fail "$b not installed"; done
PYDIR=$PREFIX/lib/python3/dist-packages
[ -f "$PYDIR/pacer/__init__.py" ] || fail "the pacer Python module is not installed"
[ -f "$PYDIR/pacer/torch/__init__.py" ] || fail "the pacer.torch package is not installed"

# 2. Runtime libraries: the --runtime list, nothing more.
runtime=$(bash -c 'source <(sed -n "/^runtime_pkgs=(/,/)/p" "$1"); echo "${runtime_pkgs[@]}"' _ "$SRC/scripts/install-deps.sh")
[ -n "$runtime" ] || fail "no runtime_pkgs list in scripts/install-deps.sh"
allowed=" $runtime python3 libc6 libstdc++6 libgcc-s1 "
libs=$(for f in "$PREFIX"/bin/pacerd "$PREFIX"/bin/pacer-agent "$PREFIX"/bin/pacerctl "$PREFIX"/bin/pacer-probe \
           "$PYDIR"/pacer/_pacer*.so; do ldd "$f" | awk '$3 ~ /^\// {print $3}'; done | xargs -r readlink -f | sort -u)
# One dpkg query for all (Debian 12 is merged-/usr: a library may be listed under /lib or /usr/lib).
owners=$(dpkg -S $(for l in $libs; do echo "$l" "${l#/usr}"; done) 2>/dev/null)
for lib in $libs; do
  pkg=$(echo "$owners" | awk -F': ' -v a="$lib" -v b="${lib#/usr}" '$2 == a || $2 == b {print $1; exit}')
  pkg=${pkg%%:*}  # multi-arch: libfoo:amd64
  [ -n "$pkg" ] || fail "$lib is loaded but no Debian package owns it"
  case "$allowed" in *" $pkg "*) ;; *) fail "$lib ($pkg) is needed but missing from install-deps.sh --runtime";; esac
done
echo "runtime libraries: all from install-deps.sh --runtime"

# 3. Read-only root, an unprivileged user, a data volume, Secrets as files.
mkdir -p "$T/data" "$T/secrets/tokens" "$T/secrets/tls"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=pacer-ca \
  -keyout "$T/ca.key" -out "$T/secrets/tls/ca.crt" >"$T/openssl.log" 2>&1 || fail "openssl CA"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=pacerd \
  -keyout "$T/secrets/tls/tls.key" -out "$T/server.csr" >>"$T/openssl.log" 2>&1 || fail "openssl CSR"
printf 'subjectAltName=DNS:pacerd,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$T/ext"
openssl x509 -req -in "$T/server.csr" -CA "$T/secrets/tls/ca.crt" -CAkey "$T/ca.key" -CAcreateserial \
  -days 2 -extfile "$T/ext" -out "$T/secrets/tls/tls.crt" >>"$T/openssl.log" 2>&1 || fail "openssl sign"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/secrets/tokens/job.token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/secrets/tokens/admin.token"
RUN=()
if [ "$(id -u)" = 0 ]; then
  RUN=(setpriv --reuid=10001 --regid=10001 --clear-groups --)
  chown -R 10001:10001 "$T/data"
  chown -R root:10001 "$T/secrets"
  chmod 0440 "$T"/secrets/tokens/* "$T"/secrets/tls/*
  chmod 0750 "$T/secrets" "$T/secrets/tokens" "$T/secrets/tls"
  chmod 0755 "$T"
else
  echo "note: not root, so the programs run as $(id -un), not as uid 10001"
  chmod 0400 "$T"/secrets/tokens/* "$T"/secrets/tls/*
fi
chmod -R a-w "$T/root"
touch "$T/marker"
sleep 0.01  # file times: anything written after the marker is newer

cd / || fail "cd /"
run() { env -i PATH=/usr/bin:/bin "${RUN[@]}" "$@"; }
PORTFILE=$T/data/port.json
start_pacerd() {
  rm -f "$PORTFILE"
  env -i PATH=/usr/bin:/bin "${RUN[@]}" "$PREFIX/bin/pacerd" --data-dir="$T/data/data" --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
    --job-token-file="$T/secrets/tokens/job.token" --admin-token-file="$T/secrets/tokens/admin.token" \
    --port-file="$PORTFILE" "$@" >>"$T/pacerd.log" 2>&1 &
  PACERD=$!
  PIDS+=("$PACERD")
  wait_for 300 test -s "$PORTFILE" || fail "pacerd did not start"
  PORT=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['port'])" "$PORTFILE")
}
stop_pacerd() {
  kill -TERM "$PACERD"
  wait "$PACERD"
  local rc=$?
  [ "$rc" = 0 ] || fail "pacerd exited $rc on SIGTERM"
}

# 4a. TLS, as in the pod.
start_pacerd --tls-cert="$T/secrets/tls/tls.crt" --tls-key="$T/secrets/tls/tls.key"
probe=("$PREFIX/bin/pacer-probe" --addr="127.0.0.1:$PORT" --tls-ca="$T/secrets/tls/ca.crt" --server-name=pacerd)
wait_for 100 run "${probe[@]}" || fail "pacer-probe over TLS: $(run "${probe[@]}" 2>&1)"
echo "pacer-probe over TLS: $(run "${probe[@]}" 2>&1)"
run "$PREFIX/bin/pacer-probe" --addr="127.0.0.1:$PORT" --plaintext --timeout-ms=1000 >/dev/null 2>&1 &&
  fail "pacer-probe in plaintext reached the TLS pacerd"
run "$PREFIX/bin/pacer-agent" --addr="127.0.0.1:$PORT" --tls-ca="$T/secrets/tls/ca.crt" \
  --token-file="$T/secrets/tokens/job.token" --node=smoke-node --no-nvml --heartbeat-ms=100 \
  -- /bin/sleep 2 >"$T/agent.log" 2>&1
rc=$?
[ "$rc" = 0 ] || fail "pacer-agent exited $rc"
grep -q "registered with pacerd" "$T/agent.log" || fail "pacer-agent did not register over TLS"
echo "pacer-agent: registered over TLS, worker ran, exit 0"
stop_pacerd

# 4b. The same data dir again (a restarted pod), plaintext on loopback for pacerctl.
start_pacerd
run "$PREFIX/bin/pacer-probe" --addr="127.0.0.1:$PORT" --plaintext >/dev/null || fail "pacer-probe after the restart"
run "$PREFIX/bin/pacerctl" --addr="127.0.0.1:$PORT" --token-file="$T/secrets/tokens/admin.token" status \
  >"$T/pacerctl.log" 2>&1 || fail "pacerctl status"
echo "pacerctl status: ok ($(wc -l <"$T/pacerctl.log") lines)"
stop_pacerd
run env PYTHONPATH="$PYDIR" PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -c \
  "import sys, pacer, pacer._pacer; sys.exit(0 if pacer.__file__.startswith(sys.argv[1]) else 1)" "$PYDIR" \
  >"$T/python.log" 2>&1 || fail "import pacer from the installed tree"
echo "import pacer: ok"

# 5. Written: only the data dir (and the logs this script itself redirects).
# (In $T, and — as root — anywhere by uid 10001; /tmp is shared with other builds, so only the
# uid tells ours apart.)
written=$(find "$T" -xdev -newer "$T/marker" -type f 2>/dev/null |
  grep -v -e "^$T/data/" -e "^$T/[a-z]*\.log$" || true)
if [ "$(id -u)" = 0 ]; then
  other=$(find / -xdev -newer "$T/marker" -user 10001 -type f 2>/dev/null | grep -v "^$T/data/" || true)
  written="$written$other"
fi
[ -z "$written" ] || fail "written outside the data dir: $written"
[ -d "$T/data/data" ] || fail "no data dir"
echo "nothing written outside the data dir ($(find "$T/data" -type f | wc -l) files in it)"
echo "k8s_install_test: passed"
