#!/usr/bin/env python3
"""deploy/monitoring/pacer-alerts.yml under promtool: `promtool check rules` (syntax, PromQL,
templates) and `promtool test rules pacer-alerts.test.yml` (the unit tests), and every alert
of the rules file has at least one unit test (an alert_rule_test naming it) that expects it
to fire. Exits 77 (skipped) only when promtool is not installed.

    rules_test.py SOURCE_DIR
"""
import os
import re
import shutil
import subprocess
import sys


def main():
    src = sys.argv[1]
    if shutil.which("promtool") is None:
        print("SKIP: promtool not installed (Debian package 'prometheus'; scripts/install-deps.sh installs it)")
        return 77
    d = os.path.join(src, "deploy", "monitoring")
    rules, tests = os.path.join(d, "pacer-alerts.yml"), os.path.join(d, "pacer-alerts.test.yml")
    for argv in (["promtool", "check", "rules", rules], ["promtool", "test", "rules", tests]):
        r = subprocess.run(argv, capture_output=True, text=True, cwd=d)
        print(" ".join(argv[:3]) + ":", (r.stdout + r.stderr).strip().replace("\n", " | "))
        if r.returncode != 0:
            print("FAIL: %s exited %d" % (" ".join(argv), r.returncode))
            return 1
    alerts = re.findall(r"^\s*- alert:\s*(\S+)", open(rules).read(), re.M)
    text = open(tests).read()
    # An alert is covered when some alert_rule_test names it and expects a non-empty alert list.
    firing = set()
    for m in re.finditer(r"alertname:\s*(\S+)\s*\n\s*exp_alerts:\s*\n\s*- exp_labels", text):
        firing.add(m.group(1))
    untested = [a for a in alerts if a not in firing]
    if not alerts:
        print("FAIL: no alert found in " + rules)
        return 1
    if untested:
        print("FAIL: alerts without a unit test that makes them fire: " + ", ".join(untested))
        return 1
    print("PASS: %d alerts, each with a firing unit test: %s" % (len(alerts), ", ".join(alerts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
