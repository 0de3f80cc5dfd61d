"""Writing results safely: folders that can be made (or a one-line reason why not), and files
written whole or not at all (a temporary name, then a rename; the temporary file removed when the
write fails, e.g. on a full disk)."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from attnbench.core.errors import AttnbenchError


def ensure_dir(path: Path | str, what: str = "output folder", create: bool = True) -> Path:
    """Make ``path`` (and its parents) or raise an AttnbenchError saying why it cannot be made:
    a parent that is a file, a folder without write permission, a read-only or full disk.
    ``create=False`` only checks, before any work, that it could be made."""
    path = Path(path)
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                where = "is" if ancestor == path else f"is under {ancestor}, which is"
                raise AttnbenchError(f"cannot use {path} as the {what}: it {where} a file")
            if not create and not os.access(ancestor, os.W_OK | os.X_OK):
                raise AttnbenchError(f"cannot create the {what} {path}: {ancestor} is read-only")
            break
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AttnbenchError(f"cannot create the {what} {path}: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise AttnbenchError(f"cannot write into the {what} {path}: permission denied")
    return path


def private_name(name: str) -> str:
    """``.NAME.HOST.PID.RANDOM.tmp``: a temporary name no other process, on this node or
    another one sharing the folder, can pick (shards of one run write into one folder)."""
    return f".{name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a private temporary file beside ``path`` (:func:`private_name`) for writing and
    rename it to ``path`` when the block ends without an error; on an error (a full disk, Ctrl-C)
    the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(private_name(path.name))
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A private temporary name beside ``path``, for a writer that wants a file name rather than
    an open file (``torch.save``): renamed to ``path`` when the block ends without an error; on
    an error the temporary file is removed and ``path`` is left as it was. The writer owns the
    file, so there is no fsync here (``atomic_open`` has one)."""
    path = Path(path)
    tmp = path.with_name(private_name(path.name))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_bytes_once(path: Path | str, data: bytes | None) -> None:
    """Write ``data`` at ``path`` whole or not at all, unless the file there already holds it
    (None: nothing to write). Makes the folder."""
    path = Path(path)
    if data is None or (path.exists() and path.read_bytes() == data):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        f.write(data)
