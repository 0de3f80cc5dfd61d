"""Logs that say nothing of the machine they were made on: its absolute prefixes made relative.

A sidecar's paths are made portable as it is written (:mod:`attnbench.runtime.portable`). A log is
the output of another program (a speed run's messages, a traceback, a warning) and holds paths
that attnbench did not write: the checkout (``/work/main/suites/ci.toml``), a scratch folder,
the Python environment's ``.../lib/python3.12/site-packages/...``. :func:`scrub_text` rewrites
each known prefix below into the path relative to what it stood for; the gate writes the logs of
its runs through it. :func:`scrub_folder` does the same to the text files of a folder made by
hand (a log captured by a shell redirect) before it is committed:

    python -c "from attnbench.runtime.scrub import scrub_folder; scrub_folder('results/NEW')"

Text files only (PNG and other binaries are left alone); a JSON file is checked to parse after
the rewrite.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: (pattern, replacement), applied in order: the longest, most specific prefixes first.
PREFIXES: list[tuple[re.Pattern[str], str]] = [
    # a Python environment's installed packages (tracebacks, warnings)
    (re.compile(r"/[^\s\"',:]*?/lib/python3\.\d+/site-packages/"), "site-packages/"),
    (re.compile(r"/root/\.pyenv/versions/[^/\s\"']+/bin/"), ""),
    (re.compile(r"/[^\s\"',:]*?/\.venv/bin/"), ""),  # a virtual environment's interpreter
    # the GPU session's work folder and earlier scratch folders
    (re.compile(r"/root/gpu-session/"), ""),
    (re.compile(r"/root/out/"), ""),
    (re.compile(r"/tmp/(?=[A-Za-z])"), ""),
    # checkouts: this one, CI's clean clones and worktrees beside them
    (re.compile(r"/work/main/"), ""),
    (re.compile(r"/work/main\b"), "."),
    (re.compile(r"/work/[\w.-]+/"), ""),  # a second checkout beside it (a git worktree)
]

TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".csv", ".log", ".txt", ".toml", ".xml"}


def scrub_text(text: str, root: Path | None = None) -> str:
    """``text`` with each known machine prefix rewritten; ``root`` (a checkout anywhere else,
    e.g. the one the gate runs) first, as ``.``."""
    if root is not None:
        prefix = str(Path(root).resolve())
        text = text.replace(prefix + "/", "").replace(prefix, ".")
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


def scrub_folder(folder: Path | str) -> list[Path]:
    """Rewrite every text file under ``folder``; the files changed."""
    return [
        path
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file() and path.suffix in TEXT_SUFFIXES and scrub_file(path)
    ]
