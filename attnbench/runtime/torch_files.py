"""Why a file that ``torch.load`` could not read is unreadable, in words: empty, truncated, not a
torch file at all, or one written by another version. ``torch.load`` says it with an exception
that names none of that (``RuntimeError: PytorchStreamReader failed reading zip archive: failed
finding central directory`` for a file cut short, ``UnpicklingError`` for a text file).

A torch file (``torch.save`` since torch 1.6) is a zip archive holding ``data.pkl`` and the
tensors' storages; a zip archive's directory is at its end, so a file cut short (a copy that
stopped, a disk that filled up before attnbench wrote files whole) has none. Older torch wrote
a bare pickle, which begins with the pickle protocol's byte 0x80.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

ZIP_MAGIC = b"PK\x03\x04"
PICKLE_MAGIC = b"\x80"


def why_unreadable(path: Path | str, error: BaseException) -> str:
    """The reason ``path`` could not be loaded by torch, as the end of a sentence (``it is
    truncated: ...``), from the file itself; ``error`` (what torch raised) fills in where the
    file looks whole."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    if size == 0:
        return "it is empty (a write that never finished, or a file made by hand)"
    if head.startswith(ZIP_MAGIC):
        return _archive_reason(path, size, error)
    if head.startswith(PICKLE_MAGIC):
        return (
            "it is in the file format of torch before 1.6, or another program's pickle: not a "
            "checkpoint this version writes"
        )
    if _looks_like_text(head):
        begins = head[:24].decode(errors="replace")
        return f"it is a text file, not a checkpoint (it begins {begins!r})"
    return f"it is not a torch file (it begins with bytes {head[:8].hex(' ')})"


def _archive_reason(path: Path, size: int, error: BaseException) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            broken = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError):
        return (
            f"it is truncated ({size} bytes, the end of the archive missing: a copy or a write "
            "that was cut short)"
        )
    if not any(name.endswith("data.pkl") for name in names):
        return "it is a zip archive but not a torch file (no data.pkl in it)"
    if broken is not None:
        return f"it is damaged (the archive's {broken} does not match its checksum)"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        "it was written by another version of torch or attnbench, or holds objects a checkpoint "
        f"does not ({type(error).__name__}: {first[:160]})"
    )


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch.isprintable() or ch in "\n\r\t" for ch in text)
