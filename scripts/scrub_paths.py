"""Rewrite the absolute paths of the machines results were made on into relative ones.

    python scripts/scrub_paths.py [FOLDER ...]      # default: results/

Sidecars, tables and logs record the command and the files a run read and wrote; on the machine
that made them these were absolute (``/work/main/suites/ci.toml``, ``/root/gpu-session/gpu/...``,
``/opt/torch/.venv/lib/python3.12/site-packages/...``). A result file must say nothing of that
machine's layout: each known prefix below becomes the path relative to what it stood for (the
checkout, the GPU session's work folder, the Python environment's site-packages, a scratch
folder). Text files only (PNG and other binaries are left alone); a JSON file is checked to
parse after the rewrite. Prints each file it changed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (pattern, replacement), applied in order: the longest, most specific prefixes first.
PREFIXES: list[tuple[re.Pattern[str], str]] = [
    # a Python environment's installed packages (tracebacks, warnings)
    (re.compile(r"/[^\s\"',:]*?/lib/python3\.\d+/site-packages/"), "site-packages/"),
    (re.compile(r"/root/\.pyenv/versions/[^/\s\"']+/bin/"), ""),
    (re.compile(r"/[^\s\"',:]*?/\.venv/bin/"), ""),  # a virtual environment's interpreter
    # the GPU runbook's work folder (scripts/gpu_session.sh) and earlier scratch folders
    (re.compile(r"/root/gpu-session/"), ""),
    (re.compile(r"/root/out/"), ""),
    (re.compile(r"/tmp/(?=[A-Za-z])"), ""),
    # checkouts: this one, CI's clean clones and worktrees beside them
    (re.compile(r"/work/main/"), ""),
    (re.compile(r"/work/main\b"), "."),
    (re.compile(r"/work/[\w.-]+/"), ""),  # a second checkout beside it (a git worktree)
]

TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".csv", ".log", ".txt", ".toml", ".xml"}


def scrub_text(text: str) -> str:
    for pattern, replacement in PREFIXES:
        text = pattern.sub(replacement, text)
    return text


def scrub_file(path: Path) -> bool:
    """Rewrite one file in place; True when it changed."""
    text = path.read_text(encoding="utf-8")
    new = scrub_text(text)
    if new == text:
        return False
    if path.suffix == ".json":
        json.loads(new)  # still a valid sidecar
    path.write_text(new, encoding="utf-8")
    return True


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv] or [ROOT / "results"]
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and scrub_file(path):
                print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
