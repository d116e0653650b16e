#!/usr/bin/env python3
"""Checks the lock annotations with clang's thread-safety analysis.

Every class that holds a mutex uses absl::Mutex with ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED
on what it guards. gcc, which builds Pacer, ignores the annotations, so this test compiles every
source file of the project that uses an absl::Mutex (in the file or in a project header it
includes) with
`clang++ -fsyntax-only -Wthread-safety -Werror`, using the flags of the real build from
compile_commands.json. A field read without its lock, or a lock-requiring helper called without
it, fails the test with clang's message (file, line, the mutex).

A std::mutex in project code outside the allow list fails it too: it cannot carry annotations.

Usage: thread_safety_test.py SOURCE_DIR BUILD_DIR. Exits 77 (skipped) without clang++.
"""
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

# Project directories whose code is checked (tests, benchmarks and generated code are not).
CHECKED_DIRS = ("agent", "cmd", "common", "controller", "journal", "monitor", "rendezvous",
                "sharding_service", "sim", "worker_sdk")
# std::mutex is allowed only where a standard-library API needs it: nowhere today.
STD_MUTEX_ALLOWED = set()


def project_files(src):
    for d in CHECKED_DIRS:
        for root, _, names in os.walk(os.path.join(src, d)):
            for n in names:
                if n.endswith((".h", ".cc")):
                    yield os.path.join(root, n)


def uses_absl_mutex(src, path):
    """The file, or a project header it includes directly, declares or uses an absl::Mutex."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if "absl::Mutex" in text:
        return True
    for inc in re.findall(r'^#include "([^"]+)"', text, flags=re.M):
        header = os.path.join(src, inc)
        if inc.split("/")[0] in CHECKED_DIRS and os.path.exists(header):
            with open(header, encoding="utf-8") as f:
                if "absl::Mutex" in f.read():
                    return True
    return False


def clang_command(entry, clang):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    keep = []
    it = iter(args[1:])
    for a in it:
        if a in ("-o", "-c"):
            next(it, None)
            continue
        if a.startswith(("-I", "-D", "-std=", "-isystem")) or a == "-pthread":
            keep.append(a)
            if a in ("-I", "-D", "-isystem"):
                keep.append(next(it, ""))
    return [clang, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unused-parameter",
            "-Wno-unknown-warning-option", *keep, entry["file"]]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, build = (os.path.abspath(a) for a in sys.argv[1:])
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    if clang is None:
        print("SKIP: no clang++ on PATH (install clang to check the lock annotations)")
        return 77

    failures = []
    std_mutex = re.compile(r"\bstd::(mutex|shared_mutex|recursive_mutex|timed_mutex)\b")
    for f in project_files(src):
        rel = os.path.relpath(f, src)
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                code = line.split("//", 1)[0]
                if std_mutex.search(code) and rel not in STD_MUTEX_ALLOWED:
                    failures.append(f"{rel}:{n}: std::mutex cannot carry lock annotations; use absl::Mutex")

    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    seen = set()
    entries = [e for e in entries if not (e["file"] in seen or seen.add(e["file"]))]
    checked = [e for e in entries
               if os.path.relpath(e["file"], src).split(os.sep)[0] in CHECKED_DIRS
               and not e["file"].startswith(build) and uses_absl_mutex(src, e["file"])]
    if not checked:
        failures.append("no source file with an absl::Mutex found in compile_commands.json")

    def run(entry):
        r = subprocess.run(clang_command(entry, clang), cwd=entry.get("directory", build),
                           capture_output=True, text=True)
        return entry["file"], r.returncode, r.stderr

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for path, rc, err in pool.map(run, checked):
            if rc != 0:
                failures.append(f"{os.path.relpath(path, src)}:\n{err}")

    print(f"checked {len(checked)} source files with clang -Wthread-safety")
    for msg in failures:
        print("FAIL", msg)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
