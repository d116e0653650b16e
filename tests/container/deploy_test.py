#!/usr/bin/python3
"""container_deploy_test: Pacer's images built and run in podman (docs/containers.md).

  1. A Debian 12 base image from Debian's archive (debootstrap --variant=minbase, trimmed like
     debian:12-slim, `podman import`): no registry is needed.
  2. `cmake --install BUILD` into ROOT/opt/pacer, then the Containerfile's `pacer` and `trainer`
     targets with `--build-context build=ROOT` (the build tree is not compiled again) and
     examples/torch_ddp/Containerfile (trainer + PyTorch + train.py); each build's time and the
     images' sizes are printed. The images: OCI labels (version = CMake's project version,
     licence), user 10001, no compiler, make, cmake or ninja in them.
  3. The deployment, host network, every server on loopback (ports picked free at run time):
     pacerd in one container (TLS, data on a named volume, read-only root without tmpfs,
     /usr/bin and /usr/sbin hidden: no shell or tool needed, every capability dropped,
     no-new-privileges); two trainer containers, each `pacer-agent --workers 2 --nnodes 2`
     running two ranks of examples/torch_ddp/train.py (Gloo, 4 ranks, env:// rendezvous at the
     MASTER_ADDR/MASTER_PORT the agents set; pt.DataLoader + pt.DistributedDataParallel; each
     rank writes --ledger: the (epoch, index) pairs of every step). Once the job is under way
     `pacerctl contention w3 5` (run inside pacerd's container) slows one rank; the controller's
     batch plan must reach every rank (their ledgers carry the plan version) and shrink w3's
     batch. Then pacerd's container is killed (SIGKILL), removed, and a new one starts on the same
     volume: the records done it reports are never fewer than before the kill, and the job ends.
  4. Every rank exits 0; records done (pacerd) = records x epochs; the ranks' ledgers hold every
     (epoch, index) pair exactly once (0 counted twice, 0 missing); equal parameter checksums.
  5. Security, read inside the running containers (/proc/PID/status and mountinfo of their
     processes, `podman top`): uid/gid 10001, no capabilities (effective, permitted, bounding),
     NoNewPrivs, a read-only root; a write to the trainer's root fails.

podman runs with a private configuration and storage in this test's temp dir (CONTAINERS_CONF:
runtime runc, cgroupfs, no default ulimits; CONTAINERS_STORAGE_CONF): nothing is read from or
written to the machine's podman state, and everything the test made is removed at the end, on
failure too; a run killed by ctest is cleaned up by the next run. Skips (exit 77) with a message
where podman, runc or debootstrap is missing or not root.

Usage: deploy_test.py BUILD_DIR SOURCE_DIR. Env: TEST_TMPDIR (ctest), PACER_CONTAINER_DEADLINE_S,
PACER_CONTAINER_BASE_TAR (a file: the base's root tarball is kept there and reused while it
exists, instead of a debootstrap per run), PACER_CONTAINER_TLS=0 (plaintext on loopback).
"""

import collections
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
DEADLINE = time.monotonic() + float(os.environ.get("PACER_CONTAINER_DEADLINE_S", "840"))
# About 45 s of training for four ranks on a loaded 2-core machine: time for the contention, the
# plan and a pacerd restart before the data ends. A wide hidden layer makes compute, which the
# contention slows, the larger part of a step (with train.py's default width Gloo and Python
# overhead dominate and a slowed rank hardly shows).
RECORDS, EPOCHS, BATCH, HIDDEN = 98304, 2, 32, 4096
# Factor 5: at 3, on a machine loaded to 12 by other builds, the foreign load slowed other ranks
# more than the contention slowed w3 (in a container the agent's hogs cannot gain priority).
SLOW_WORKER, FACTOR = "w3", 5
# PACER_CONTAINER_TLS=0: plaintext on loopback instead of TLS (to tell a TLS problem from others).
TLS = os.environ.get("PACER_CONTAINER_TLS", "1") != "0"
TAG = "localhost/pacer-test"
PASSED = []


def log(msg):
    print(msg, flush=True)


def fail(msg):
    raise AssertionError(msg)


def left(cap=None):
    """Seconds until the test's own deadline (kept under ctest's TIMEOUT so cleanup runs)."""
    s = DEADLINE - time.monotonic()
    if s <= 0:
        fail("the test's deadline passed")
    return min(s, cap) if cap else s


def run(argv, check=True, timeout=None, quiet=False, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout or left(), **kw)
    if check and p.returncode != 0:
        fail(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def wait_for(what, cond, timeout_s, interval=0.2):
    """Polls cond() until it returns a true value (returned) or the deadline."""
    end = time.monotonic() + left(timeout_s)
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    fail(f"{what}: not within {timeout_s} s")


def free_port():
    """A loopback port free right now, for a server that binds it itself (host network)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preflight():
    missing = [t for t in ("podman", "runc", "debootstrap", "openssl") if not shutil.which(t)]
    if missing:
        log(f"SKIP: {', '.join(missing)} not installed (scripts/install-deps.sh --containers)")
        sys.exit(77)
    if os.geteuid() != 0:
        log("SKIP: the container test runs rootful podman (and debootstrap): run it as root")
        sys.exit(77)


class Podman:
    """podman with this test's own containers.conf and storage (under `root`)."""

    def __init__(self, root):
        self.root = root
        conf = os.path.join(root, "containers.conf")
        storage = os.path.join(root, "storage.conf")
        with open(conf, "w") as f:
            f.write("[containers]\n"
                    "default_ulimits = []\n"          # the sandbox refuses to raise rlimits
                    "[engine]\n"
                    'cgroup_manager = "cgroupfs"\n'
                    'runtime = "runc"\n'              # crun rejects a hybrid cgroup layout
                    f'tmp_dir = "{root}/run/libpod"\n'
                    'events_logger = "file"\n'
                    "[network]\n"
                    f'network_config_dir = "{root}/networks"\n')
        with open(storage, "w") as f:
            f.write(f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/storage"\nrunroot = "{root}/run/storage"\n')
        self.env = dict(os.environ, CONTAINERS_CONF=conf, CONTAINERS_STORAGE_CONF=storage,
                        TMPDIR=os.path.join(root, "tmp"))
        os.makedirs(self.env["TMPDIR"], exist_ok=True)

    def __call__(self, *args, check=True, timeout=None, **kw):
        return run(["podman", *args], check=check, timeout=timeout, env=self.env, **kw)

    def cleanup(self):
        """Removes every container, volume and image in this storage, then the storage."""
        for args in (("rm", "--all", "--force", "--time", "0"), ("volume", "rm", "--all", "--force"),
                     ("rmi", "--all", "--force")):
            try:
                subprocess.run(["podman", *args], env=self.env, capture_output=True, timeout=120)
            except (subprocess.TimeoutExpired, OSError):
                pass
        # overlay mounts podman may have left under the storage
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[1].startswith(self.root + "/")]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)


def cleanup_previous(record):
    """A run that ctest killed (SIGKILL: no cleanup) left its dir named in `record`."""
    try:
        with open(record) as f:
            old = f.read().strip()
    except OSError:
        return
    if old.startswith(tempfile.gettempdir() + "/pacer-container-test.") and os.path.isdir(old):
        log(f"removing what a killed earlier run left: {old}")
        Podman(old).cleanup()
        shutil.rmtree(old, ignore_errors=True)
    os.unlink(record)


def make_base(pm, t):
    """localhost/pacer-test/debian:12 from Debian's archive, trimmed like debian:12-slim."""
    t0 = time.monotonic()
    cached = os.environ.get("PACER_CONTAINER_BASE_TAR")
    if cached and os.path.exists(cached):
        with open(cached, "rb") as f:
            pm("import", "-", f"{TAG}/debian:12", stdin=f, timeout=left(300))
        return time.monotonic() - t0
    rootfs = os.path.join(t, "rootfs")
    p = run(["debootstrap", "--variant=minbase", "bookworm", rootfs, "http://deb.debian.org/debian"],
            check=False, timeout=left(400))
    if p.returncode != 0:
        fail(f"debootstrap failed (needs deb.debian.org):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    with open(os.path.join(rootfs, "etc/apt/sources.list"), "w") as f:
        f.write("deb http://deb.debian.org/debian bookworm main\n"
                "deb http://deb.debian.org/debian bookworm-updates main\n"
                "deb http://deb.debian.org/debian-security bookworm-security main\n")
    # what debian:12-slim leaves out, now and in every later package
    with open(os.path.join(rootfs, "etc/dpkg/dpkg.cfg.d/slim"), "w") as f:
        for d in ("doc/*", "man/*", "info/*", "locale/*", "groff/*", "lintian/*", "linda/*"):
            f.write(f"path-exclude /usr/share/{d}\n")
        f.write("path-include /usr/share/doc/*/copyright\n")
    for pattern in ("var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/lib/apt/lists/*",
                    "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*", "usr/share/doc/*/*"):
        for path in glob.glob(os.path.join(rootfs, pattern)):
            if os.path.basename(path) == "copyright" or os.path.islink(os.path.dirname(path)):
                continue  # (a doc dir may be a link to another package's)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    tarball = cached or os.path.join(t, "rootfs.tar")
    run(["tar", "-C", rootfs, "--numeric-owner", "-cf", tarball, "."])
    shutil.rmtree(rootfs)
    with open(tarball, "rb") as f:
        pm("import", "-", f"{TAG}/debian:12", stdin=f, timeout=left(300))
    if not cached:
        os.unlink(tarball)
    return time.monotonic() - t0


def project_version():
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        return re.search(r"project\(pacer VERSION ([0-9.]+)", f.read()).group(1)


def image_size_mb(pm, ref):
    return int(pm("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip()) / 1e6


def build_images(pm, t, version):
    root = os.path.join(t, "install")
    run(["cmake", "--install", BUILD, "--prefix", os.path.join(root, "opt/pacer")])
    try:
        rev = run(["git", "-C", SRC, "rev-parse", "HEAD"], check=False).stdout.strip()
    except OSError:
        rev = ""
    times = {}
    common = ["build", "--network", "host", "-f", os.path.join(SRC, "Containerfile"),
              "--build-arg", f"BUILD_BASE={TAG}/debian:12", "--build-arg", f"RUN_BASE={TAG}/debian:12",
              "--build-arg", f"PACER_VERSION={version}", "--build-arg", f"PACER_REVISION={rev}",
              "--build-context", f"build={root}"]
    for target, name in (("pacer", "pacerd"), ("trainer", "trainer")):
        t0 = time.monotonic()
        pm(*common, "--target", target, "-t", f"{TAG}/{name}:{version}", SRC, timeout=left(600))
        times[name] = time.monotonic() - t0
    t0 = time.monotonic()
    pm("build", "--network", "host", "-f", os.path.join(SRC, "examples/torch_ddp/Containerfile"),
       "--build-arg", f"TRAINER_IMAGE={TAG}/trainer:{version}", "-t", f"{TAG}/torch-ddp-example:{version}",
       os.path.join(SRC, "examples/torch_ddp"), timeout=left(900))
    times["torch-ddp-example"] = time.monotonic() - t0
    shutil.rmtree(root)
    return times


def check_images(pm, version):
    for name in ("pacerd", "trainer", "torch-ddp-example"):
        ref = f"{TAG}/{name}:{version}"
        info = json.loads(pm("image", "inspect", ref).stdout)[0]
        labels = info.get("Labels") or info.get("Config", {}).get("Labels") or {}
        if labels.get("org.opencontainers.image.version") != version:
            fail(f"{ref}: label version {labels.get('org.opencontainers.image.version')!r}, not {version}")
        if labels.get("org.opencontainers.image.licenses") != "Apache-2.0":
            fail(f"{ref}: licence label {labels.get('org.opencontainers.image.licenses')!r}")
        if "org.opencontainers.image.source" not in labels:
            fail(f"{ref}: no source label")
        user = info.get("User") or info.get("Config", {}).get("User")
        if user != "10001:10001":
            fail(f"{ref}: runs as {user!r}, not 10001:10001")
        mnt = pm("image", "mount", ref).stdout.strip()
        try:
            tools = [p for p in ("usr/bin/gcc", "usr/bin/g++", "usr/bin/cc", "usr/bin/c++", "usr/bin/make",
                                 "usr/bin/cmake", "usr/bin/ninja", "usr/bin/ld", "usr/bin/ccache")
                     if os.path.lexists(os.path.join(mnt, p))]
            headers = os.path.exists(os.path.join(mnt, "usr/include/grpcpp"))
            if tools or headers:
                fail(f"{ref} holds build tools: {tools}{' + gRPC headers' if headers else ''}")
        finally:
            pm("image", "unmount", ref)
    log(f"images: labels version={version}, licenses=Apache-2.0; user 10001:10001; "
        "no gcc/cc/c++/make/cmake/ninja/ld/ccache, no -dev headers")


def make_secrets(t):
    """Token and TLS files as Kubernetes mounts them (0440, group 10001), per container."""
    s = os.path.join(t, "secrets")
    dirs = {k: os.path.join(s, k) for k in ("pacerd-tokens", "pacerd-tls", "trainer")}
    for d in dirs.values():
        os.makedirs(d)
    key, csr, ext = (os.path.join(t, n) for n in ("ca.key", "server.csr", "ext"))
    ca = os.path.join(dirs["pacerd-tls"], "ca.crt")
    run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-days", "2", "-subj", "/CN=pacer-test-ca", "-keyout", key, "-out", ca])
    run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-subj", "/CN=pacerd", "-keyout", os.path.join(dirs["pacerd-tls"], "tls.key"), "-out", csr])
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:pacerd,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", key, "-CAcreateserial", "-days", "2",
         "-extfile", ext, "-out", os.path.join(dirs["pacerd-tls"], "tls.crt")])
    for name in ("job.token", "admin.token"):
        with open(os.path.join(dirs["pacerd-tokens"], name), "w") as f:
            f.write(os.urandom(32).hex())
    shutil.copy(os.path.join(dirs["pacerd-tokens"], "job.token"), dirs["trainer"])
    shutil.copy(ca, dirs["trainer"])
    os.chmod(s, 0o755)
    for d in dirs.values():
        os.chown(d, 0, 10001)
        os.chmod(d, 0o750)
        for f in os.listdir(d):
            os.chown(os.path.join(d, f), 0, 10001)
            os.chmod(os.path.join(d, f), 0o440)
    return dirs


def proc_status(pid):
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    with open(f"/proc/{pid}/mountinfo") as f:
        root = [line.split() for line in f if line.split()[4] == "/"]
    return fields, (root[-1][5].split(",")[0] if root else "?")


def check_security(pm, name, expect_hidden_bin):
    """uid/gid, capabilities, no_new_privs, read-only root of the container's main process."""
    pid = int(pm("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())
    st, root_mode = proc_status(pid)
    uids, gids = st["Uid"].split(), st["Gid"].split()
    caps = {k: st[k] for k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb")}
    problems = []
    if set(uids) != {"10001"} or set(gids) != {"10001"}:
        problems.append(f"uid {uids} gid {gids}")
    if any(int(v, 16) for v in caps.values()):
        problems.append(f"capabilities {caps}")
    if st.get("NoNewPrivs") != "1":
        problems.append(f"NoNewPrivs {st.get('NoNewPrivs')}")
    if root_mode != "ro":
        problems.append(f"root mounted {root_mode}")
    top = pm("top", name, "pid", "user", "args").stdout.strip().splitlines()
    if expect_hidden_bin:
        p = pm("exec", name, "/bin/sh", "-c", "true", check=False)
        if p.returncode == 0:
            problems.append("a shell runs in pacerd's container")
    if problems:
        fail(f"{name}: " + "; ".join(problems))
    return (f"{name}: pid 1 = {' '.join(top[1].split()[2:])[:60]}; uid/gid 10001; CapEff/CapPrm/CapBnd 0; "
            f"NoNewPrivs 1; root ro" + ("; /usr/bin, /usr/sbin hidden (no shell)" if expect_hidden_bin else ""))


class Deployment:
    def __init__(self, pm, t, version, secrets):
        self.pm, self.t, self.version, self.secrets = pm, t, version, secrets
        self.port = free_port()
        self.master_port = free_port()
        self.out = os.path.join(t, "out")
        os.makedirs(self.out)
        os.chown(self.out, 10001, 10001)
        self.addr = f"127.0.0.1:{self.port}"

    def start_pacerd(self):
        # Read-only root without podman's tmpfs: as readOnlyRootFilesystem in deploy/base; the
        # programs' own directory stays, the system's shells and tools are hidden.
        self.pm("run", "-d", "--name", "pacerd", "--network", "host", "--read-only", "--read-only-tmpfs=false",
                "--cap-drop", "all", "--security-opt", "no-new-privileges", "--timeout", str(int(left()) + 30),
                "--mount", "type=tmpfs,destination=/usr/bin,ro=true,notmpcopyup",
                "--mount", "type=tmpfs,destination=/usr/sbin,ro=true,notmpcopyup",
                "-v", "pacer-data:/var/lib/pacer",
                "-v", f"{self.secrets['pacerd-tokens']}:/etc/pacer/tokens:ro",
                "-v", f"{self.secrets['pacerd-tls']}:/etc/pacer/tls:ro",
                f"{TAG}/pacerd:{self.version}",
                "--data-dir=/var/lib/pacer/data", f"--listen={self.addr}", "--metrics-listen=127.0.0.1:0",
                "--job-token-file=/etc/pacer/tokens/job.token", "--admin-token-file=/etc/pacer/tokens/admin.token",
                *(["--tls-cert=/etc/pacer/tls/tls.crt", "--tls-key=/etc/pacer/tls/tls.key"] if TLS else []),
                "--policy=/opt/pacer/share/pacer/policies/demo-dedicated.yaml", "--job-mode=sync",
                "--heartbeat-interval-ms=250", "--reconcile-interval-ms=500")
        t0 = time.monotonic()

        def serving():
            if self.pm("inspect", "--format", "{{.State.Running}}", "pacerd").stdout.strip() != "true":
                fail("pacerd's container stopped:\n" + self.pm("logs", "pacerd", check=False).stderr[-3000:])
            p = self.pm("exec", "pacerd", "/opt/pacer/bin/pacer-probe", f"--addr={self.addr}",
                        *(["--tls-ca=/etc/pacer/tls/ca.crt", "--server-name=pacerd"] if TLS else ["--plaintext"]),
                        check=False)
            return p.returncode == 0
        wait_for("pacerd serving (pacer-probe)", serving, 120, interval=0.3)
        return time.monotonic() - t0

    def ctl(self, *cmd, check=True):
        p = self.pm("exec", "pacerd", "/opt/pacer/bin/pacerctl", f"--addr={self.addr}",
                    "--token-file=/etc/pacer/tokens/admin.token",
                    *(["--tls-ca=/etc/pacer/tls/ca.crt", "--tls-server-name=pacerd"] if TLS else []),
                    "-o", "json", *cmd, check=False, timeout=left(60))
        if p.returncode != 0:
            if check:
                fail(f"pacerctl {' '.join(cmd)} exited {p.returncode}: {p.stdout[-1000:]}{p.stderr[-1000:]}")
            return None
        return json.loads(p.stdout)

    def records_done(self):
        d = self.ctl("datasets", check=False)
        if d is None:
            return None
        return sum(int(x.get("records_done_total", 0)) for x in d.get("datasets", []))

    def start_trainer(self, node_rank):
        name = f"trainer-{node_rank}"
        self.pm("run", "-d", "--name", name, "--network", "host", "--read-only",
                "--cap-drop", "all", "--security-opt", "no-new-privileges", "--timeout", str(int(left()) + 30),
                "-e", "OMP_NUM_THREADS=1",
                "-v", f"{self.secrets['trainer']}:/etc/pacer/job:ro", "-v", f"{self.out}:/out",
                f"{TAG}/torch-ddp-example:{self.version}",
                "/opt/pacer/bin/pacer-agent", f"--addr={self.addr}",
                *(["--tls-ca=/etc/pacer/job/ca.crt", "--tls-server-name=pacerd"] if TLS else []),
                "--token-file=/etc/pacer/job/job.token", f"--node={name}",
                "--job=torch-ddp", "--workers=2", "--nnodes=2", f"--node-rank={node_rank}",
                "--master-addr=127.0.0.1", f"--master-port={self.master_port}", "--no-nvml",
                "--heartbeat-backoff-max-ms=1000", "--max-restarts=0", "--",
                "python3", "/opt/train/train.py", "--records", str(RECORDS), "--epochs", str(EPOCHS),
                "--batch", str(BATCH), "--hidden", str(HIDDEN), "--ledger", "/out", "--result-dir", "/out")
        return name

    def running(self, name):
        return self.pm("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"

    def exit_code(self, name):
        return int(self.pm("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip())

    def ledger_plans(self):
        """worker -> {plan version: local batch} from the ledgers so far (versions > 0); rank r
        is worker wR (pacer-agent's worker ids)."""
        out = {}
        for w in range(4):
            plans = out.setdefault(f"w{w}", {})
            try:
                with open(os.path.join(self.out, f"ledger-{w}.jsonl")) as f:
                    for line in f:
                        try:
                            e = json.loads(line)
                        except ValueError:
                            continue  # a line being written
                        if e.get("plan", 0) > 0:
                            plans[e["plan"]] = e["batch"]
            except OSError:
                pass
        return out


def count_ledgers(out):
    """The ranks' ledgers: (epoch, index) pairs trained, how many of the expected ones are
    missing or counted more than once, and how many are not in the data set at all."""
    seen = collections.Counter()
    for w in range(4):
        with open(os.path.join(out, f"ledger-{w}.jsonl")) as f:
            for line in f:
                seen.update((e, i) for e, i in json.loads(line)["records"])
    expected = [(e, i) for e in range(EPOCHS) for i in range(RECORDS)]
    missing = sum(1 for p in expected if seen[p] == 0)
    twice = sum(1 for p in expected if seen[p] > 1)
    stray = sum(1 for (e, i) in seen if not (0 <= e < EPOCHS and 0 <= i < RECORDS))
    return sum(seen.values()), missing, twice, stray


def deploy(pm, t, version):
    secrets = make_secrets(t)
    pm("volume", "create", "pacer-data")
    d = Deployment(pm, t, version, secrets)
    up = d.start_pacerd()
    log(f"pacerd serving in {up:.1f} s ({'TLS' if TLS else 'plaintext'} on {d.addr}, data on volume pacer-data)")
    log(check_security(pm, "pacerd", expect_hidden_bin=True))

    t_job = time.monotonic()
    trainers = [d.start_trainer(0), d.start_trainer(1)]
    total = RECORDS * EPOCHS

    def progressed(fraction):
        def cond():
            for n in trainers:
                if not d.running(n):
                    fail(f"{n} exited ({d.exit_code(n)}) early:\n" + pm("logs", n, check=False).stdout[-3000:])
            done = d.records_done()
            return done is not None and done >= fraction * total and done
        return cond

    wait_for("10 % of the records done", progressed(0.10), 300)
    log(check_security(pm, "trainer-0", expect_hidden_bin=False))
    w = pm("exec", "trainer-0", "python3", "-c", "open('/opt/pacer/x', 'w')", check=False)
    if w.returncode == 0 or "Read-only file system" not in w.stderr:
        fail(f"a write to the trainer's root did not fail as read-only: {w.stderr[-500:]}")
    before_contention = max((v for p in d.ledger_plans().values() for v in p), default=0)
    c = d.ctl("contention", SLOW_WORKER, str(FACTOR))
    t_contention = time.monotonic()
    log(f"pacerctl contention {SLOW_WORKER} {FACTOR}: {c.get('state')} "
        f"({(d.records_done() or 0) * 100 // total} % of the records done)")

    def plan_reached():
        """A plan made after the contention that every rank has trained under, with the slowed
        rank's batch the smallest."""
        if not all(d.running(n) for n in trainers):
            fail("a trainer ended before a batch plan for the slowed rank reached every rank "
                 f"(the job is too short): {d.ledger_plans()}")
        plans = d.ledger_plans()
        common = set.intersection(*(set(p) for p in plans.values()))
        for v in sorted(v for v in common if v > before_contention):
            batches = {w: p[v] for w, p in plans.items()}
            if batches[SLOW_WORKER] < min(b for w, b in batches.items() if w != SLOW_WORKER):
                return v, batches
        return None
    version, batches = wait_for("a batch plan for the slowed rank in every rank's ledger", plan_reached, 240,
                                interval=0.5)
    log(f"batch plan v{version} reached every rank {time.monotonic() - t_contention:.1f} s after the "
        "contention: local batches " + ", ".join(f"{w} {b}" for w, b in sorted(batches.items())))

    before = d.records_done()
    if before is None or before >= 0.9 * total:
        fail(f"the job is too short to restart pacerd mid-run ({before} of {total} records done)")
    pm("kill", "--signal", "KILL", "pacerd")
    pm("rm", "--force", "pacerd")
    t_kill = time.monotonic()
    up = d.start_pacerd()
    after = wait_for("records done after the restart", lambda: d.records_done(), 60)
    log(f"pacerd killed (SIGKILL) at {before} of {total} records done ({100 * before // total} %) and "
        f"started again in a new container on the same volume: serving after {time.monotonic() - t_kill:.1f} s, "
        f"reports {after} records done")
    if after < before:
        fail(f"the restarted pacerd lost progress: {after} records done < {before} before the kill")

    def finished():
        return not any(d.running(n) for n in trainers)
    wait_for("the trainers finishing", finished, 600, interval=0.5)
    job_s = time.monotonic() - t_job
    codes = {n: d.exit_code(n) for n in trainers}
    if any(codes.values()):
        fail(f"trainer exit codes {codes}:\n" + "\n".join(pm("logs", n, check=False).stdout[-3000:]
                                                           for n in trainers))
    done = d.records_done()
    results = []
    for w in range(4):
        with open(os.path.join(d.out, f"result-{w}.json")) as f:
            results.append(json.loads(f.read()))
    counted, missing, twice, stray = count_ledgers(d.out)
    log(f"job: {job_s:.1f} s; records done (pacerd) {done} = expected {total}: {done == total}; ledgers: "
        f"{counted} record visits, {twice} counted twice, {missing} missing, {stray} stray")
    for r in results:
        log("  " + json.dumps({k: r[k] for k in ("worker", "steps", "samples", "accuracy", "plan_version",
                                                 "local_batch", "seconds")}))
    if done != total or missing or twice or stray or counted != total:
        fail("not every record exactly once")
    if len({r["checksum"] for r in results}) != 1:
        fail(f"parameter checksums differ: {[r['checksum'] for r in results]}")
    acts = d.ctl("actions").get("actions", [])
    executed = [a for a in acts if a.get("kind") == "ADJUST_BS" and a.get("outcome") == "executed"]
    log(f"pacerd's audit after the restart: {len(executed)} executed ADJUST_BS plan(s) of {len(acts)} actions")
    if not executed:
        fail("the restarted pacerd lost the executed plan from its audit trail")
    return job_s


def main():
    preflight()
    tmp = os.environ.get("TEST_TMPDIR")
    record = os.path.join(tmp, "previous-run") if tmp else None
    if record:
        cleanup_previous(record)
    # Under /tmp: uid 10001 in the containers must reach the mounted dirs (a build tree may lie
    # below /root).
    t = tempfile.mkdtemp(prefix="pacer-container-test.", dir=tempfile.gettempdir())
    os.chmod(t, 0o755)
    if record:
        with open(record, "w") as f:
            f.write(t)
    pm = Podman(t)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ok = False
    try:
        version = project_version()
        base_s = make_base(pm, t)
        log(f"base image {TAG}/debian:12 (debootstrap minbase, trimmed, podman import): {base_s:.1f} s, "
            f"{image_size_mb(pm, TAG + '/debian:12'):.1f} MB")
        times = build_images(pm, t, version)
        for name, s in times.items():
            log(f"podman build {name}: {s:.1f} s, image {image_size_mb(pm, f'{TAG}/{name}:{version}'):.1f} MB")
        check_images(pm, version)
        deploy(pm, t, version)
        ok = True
    finally:
        if not ok:
            for n in ("pacerd", "trainer-0", "trainer-1"):
                p = subprocess.run(["podman", "logs", "--tail", "40", n], env=pm.env, capture_output=True, text=True)
                if p.returncode == 0:
                    log(f"--- podman logs {n}\n{p.stdout}{p.stderr}")
        pm.cleanup()
        shutil.rmtree(t, ignore_errors=True)
        if record and os.path.exists(record):
            os.unlink(record)
    log("container_deploy_test: passed")


if __name__ == "__main__":
    main()
