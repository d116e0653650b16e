#!/usr/bin/env python3
"""The repository stands alone for anyone who clones it: no file refers to a path outside it
(the team's notes folder beside the checkout, or an absolute path of the machine it was written
on), and
every relative link in a Markdown file points at a file or folder that exists in the repository.

Usage: repo_links_test.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys

ROOT = os.path.realpath(sys.argv[1])
SKIP_DIRS = {".git", "node_modules", "__pycache__"}
TEXT_EXT = {".md", ".cc", ".h", ".c", ".py", ".txt", ".yaml", ".yml", ".json", ".sh", ".in", ".cmake",
            ".proto", ".html", ".toml", ""}
NOTES = ".." + "/" + "shared"  # spelt in pieces, so this file does not refer to it itself
OUTSIDE = [
    (re.compile(re.escape(NOTES) + r"\b"), "the notes folder beside the checkout"),
    (re.compile(r"(?<![\w.])/work/(?:main|shared)\b"), "/work/..."),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def files():
    try:  # the files of the checkout (what a clone has), when git is there
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True)
        return [f for f in out.stdout.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        listed = []
        for d, dirs, names in os.walk(ROOT):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
            listed += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
        return listed


def main():
    problems = []
    checked = links = 0
    for rel in files():
        path = os.path.join(ROOT, rel)
        if os.path.splitext(rel)[1] not in TEXT_EXT or not os.path.isfile(path):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        checked += 1
        for n, line in enumerate(text.splitlines(), 1):
            for pattern, what in OUTSIDE:
                if pattern.search(line):
                    problems.append(f"{rel}:{n}: refers to {what}, outside the repository: {line.strip()[:120]}")
        if not rel.endswith(".md"):
            continue
        for m in LINK.finditer(text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):  # http:, mailto:, a pure #anchor
                continue
            links += 1
            resolved = os.path.realpath(os.path.join(os.path.dirname(path), target))
            line = text.count("\n", 0, m.start()) + 1
            if not resolved.startswith(ROOT + os.sep) and resolved != ROOT:
                problems.append(f"{rel}:{line}: link '{target}' leaves the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{rel}:{line}: link '{target}' points at nothing")
    for p in problems:
        print("FAIL", p)
    print(f"{checked} files, {links} relative Markdown links checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
