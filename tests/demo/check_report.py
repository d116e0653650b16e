#!/usr/bin/env python3
"""Opens a demo report.html in headless Chromium and checks that its charts render.

  check_report.py REPORT.html [--screenshot OUT.png] [--chromium PATH]

Loads the file with --dump-dom: the report's inline self-check script has set
data-charts / data-charts-rendered on <body> (a chart counts when every data line in it has a
laid-out, non-empty bounding box). Passes when at least 3 charts exist and all rendered, and
(with --screenshot) when Chromium wrote a PNG of the page. Exit 0 ok, 1 failed, 77 skipped
(no Chromium: install it with scripts/install-deps.sh --chromium).
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium(binary, profile, extra, url, timeout=90):
    # Own session: on a timeout the whole browser (renderer, GPU, zygote processes) is killed.
    p = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        raise
    return p.returncode, out, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--screenshot")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    a = ap.parse_args()
    if not a.chromium:
        print("check_report: SKIP: chromium not installed (scripts/install-deps.sh --chromium)")
        return 77
    url = "file://" + os.path.abspath(a.report)
    with tempfile.TemporaryDirectory(prefix="pacer-chromium-") as profile:
        rc, dom, err = chromium(a.chromium, profile, ["--dump-dom"], url)
        m = re.search(r'<body[^>]*data-charts="(\d+)"[^>]*data-charts-rendered="(\d+)"', dom)
        if rc != 0 or not m:
            print(f"check_report: FAIL: no self-check result in the DOM (chromium rc {rc})\n{err[-2000:]}")
            return 1
        charts, rendered = int(m.group(1)), int(m.group(2))
        print(f"check_report: {rendered} of {charts} charts rendered")
        if charts < 3 or rendered != charts:
            return 1
        if a.screenshot:
            shot = os.path.abspath(a.screenshot)
            if os.path.exists(shot):
                os.remove(shot)
            rc, _, err = chromium(a.chromium, profile, [f"--screenshot={shot}", "--window-size=1200,1900"], url)
            if not os.path.exists(shot):
                print(f"check_report: FAIL: no screenshot (chromium rc {rc})\n{err[-2000:]}")
                return 1
            with open(shot, "rb") as f:
                head = f.read(24)
            if head[:8] != b"\x89PNG\r\n\x1a\n":
                print("check_report: FAIL: the screenshot is not a PNG")
                return 1
            w, h = struct.unpack(">II", head[16:24])
            print(f"check_report: screenshot {shot} ({w}x{h}, {os.path.getsize(shot)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
