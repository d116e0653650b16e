"""Processes of a demo run: every process whose command line names the run's folder."""
import os


def procs_naming(path, exclude):
    """(pid, command line) of live processes naming `path`, except those naming `exclude`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmd and exclude not in cmd:
            found.append((int(pid), cmd[:200]))
    return found
