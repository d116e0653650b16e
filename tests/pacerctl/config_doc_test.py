#!/usr/bin/env python3
"""ctest config_doc: docs/configuration.md lists every flag that every binary's --help prints.

Runs `BINARY --help` for each binary (and the demo's script), collects every `--flag` it
prints, and fails naming each flag missing from the binary's section of docs/configuration.md
(the `## NAME` heading up to the next `## `); --help and --version are documented once, in
the conventions section. A binary missing from the build fails too: the list below is the
installed set, so a new binary must be added here and documented.
  config_doc_test.py BIN_DIR SOURCE_DIR
"""
import os
import re
import subprocess
import sys

BINARIES = ["pacerd", "pacerctl", "pacer-agent", "pacer-ps", "pacer-sim", "pacer-policy",
            "pacer-consume", "pacer-ledger-check", "pacer-train-mlp", "pacer-train-ctr",
            "pacer-probe"]
COMMON = {"help", "version"}
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def sections(doc):
    out, name = {}, None
    for line in doc.splitlines():
        m = re.match(r"^## (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def main():
    bin_dir, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with open(os.path.join(src, "docs", "configuration.md")) as f:
        doc = sections(f.read())
    helps = {}
    for b in BINARIES:
        path = os.path.join(bin_dir, b)
        if not os.path.exists(path):
            print(f"FAIL {b}: not built in {bin_dir}")
            helps[b] = None
            continue
        p = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
        helps[b] = p.stdout + p.stderr if p.returncode == 0 else None
        if p.returncode != 0:
            print(f"FAIL {b} --help: exit {p.returncode}")
    p = subprocess.run([sys.executable, os.path.join(src, "demo", "pacer_demo.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    helps["pacer-demo"] = p.stdout if p.returncode == 0 else None
    missing, checked = [], 0
    for b, text in helps.items():
        if text is None:
            missing.append(f"{b}: --help failed")
            continue
        section = next((v for k, v in doc.items() if k == b), None)
        if section is None:
            missing.append(f"{b}: no '## {b}' section")
            continue
        documented = set(FLAG.findall(section))
        for flag in sorted(set(FLAG.findall(text)) - COMMON):
            checked += 1
            if flag not in documented:
                missing.append(f"{b}: --{flag}")
    for m in missing:
        print("FAIL missing from docs/configuration.md: " + m)
    print(f"{checked} flags of {len(helps)} binaries checked; {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
