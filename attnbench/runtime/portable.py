"""Result files that say nothing of the machine they were made on: no absolute paths.

A sidecar records the command and the files a run read and wrote. Written as typed, those hold
the machine's layout (``/home/alice/...``, the virtual environment's ``/.../bin/attnbench``), and
a committed result file would carry them into the repository. :func:`portable` rewrites every
absolute path in a JSON-like value (or a string) before it is written:

* under the working directory (the checkout, when run from it): relative to it;
* anywhere else: relative to the folder the file is written in (``out``), so that a run's own
  checkpoints read ``checkpoints/O-seed0.pt`` wherever the run was;
* the ``attnbench`` executable itself (``argv[0]``, also ``python -m attnbench``'s
  ``.../attnbench/__main__.py``): ``attnbench``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: An absolute POSIX path inside a string: a "/" not preceded by a word character, ":", "/" or
#: "." (so neither a URL's "https://" nor a relative "a/b" nor "./x"), up to a space, a quote,
#: "=", "," or ";".
_ABSOLUTE = re.compile(r"(?<![\w:/.~])/[^\s'\",;=]+")


def portable(value: Any, out: Path | str) -> Any:
    """``value`` (a string, or lists / dicts of them, anything else as it is) with every absolute
    path rewritten as the module says; ``out``: the folder the result file is written in."""
    base = (Path.cwd().resolve(), Path(out).resolve())
    return _walk(value, base)


def _walk(value: Any, base: tuple[Path, Path]) -> Any:
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda found: _relative(found.group(0), base), value)
    if isinstance(value, Path):
        return _walk(str(value), base)
    if isinstance(value, Mapping):
        return {key: _walk(item, base) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(item, base) for item in value]
    return value


def _relative(text: str, base: tuple[Path, Path]) -> str:
    cwd, out = base
    path = Path(text)
    if (path.name, path.parent.name) in (("attnbench", "bin"), ("__main__.py", "attnbench")):
        return "attnbench"  # the executable, or python -m attnbench
    try:
        return str(path.relative_to(cwd)) or "."
    except ValueError:
        return os.path.relpath(path, out)
