"""The registry as plain data, cached so that ``attnbench list`` answers without importing torch
(importing torch alone takes 1.5-2.5 s on a 2-core machine).

The cache is a JSON file named after a fingerprint of the source files that define the registry
(``registry-<fingerprint>.json`` in attnbench's cache folder: ``$ATTNBENCH_CACHE``, else
``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``). It is written by the first ``list``
after any change to a mechanism, a path or a parameter (that one ``list`` builds the description
from the live registry, importing torch), so it cannot go stale and nothing needs refreshing by
hand. A cache folder that cannot be written only costs the speed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.core import capabilities
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import write_text

if TYPE_CHECKING:
    from attnbench.core.spec import Mechanism

PACKAGE = Path(__file__).resolve().parent.parent
#: Parts of the package that do not define the registry (their edits keep the cache valid).
NOT_REGISTRY = ("cli", "bench", "extrapolation", "measure", "runtime", "render", "data")


def cache_dir() -> Path:
    """Where attnbench caches what it can rebuild (the registry description)."""
    if os.environ.get("ATTNBENCH_CACHE"):
        return Path(os.environ["ATTNBENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnbench"


def cache_file() -> Path:
    """The cache file of the registry as the installed sources define it."""
    return cache_dir() / f"registry-{fingerprint()[:20]}.json"


def fingerprint() -> str:
    """SHA-256 over the Python sources that define mechanisms, paths and parameters."""
    digest = hashlib.sha256()
    files = sorted(
        p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in NOT_REGISTRY
    )
    for p in files:
        digest.update(p.relative_to(PACKAGE).as_posix().encode())
        digest.update(b"\0")
        digest.update(p.read_bytes().replace(b"\r\n", b"\n"))
    return digest.hexdigest()


def describe(mech: Mechanism) -> dict[str, Any]:
    """One registry entry as plain data (each path with the requirement names it needs)."""
    return {
        "name": mech.name,
        "aliases": list(mech.aliases),
        "family": mech.family,
        "description": mech.description,
        "source": mech.source,
        "sources": [s.plain() for s in mech.sources],
        "time": mech.time,
        "memory": mech.memory,
        "causal": mech.causal,
        "bidirectional": mech.bidirectional,
        "backward": mech.backward,
        "dtypes": [str(d).removeprefix("torch.") for d in mech.dtypes],
        "params": {p.name: _plain(p.default) for p in mech.params},
        "params_text": {p.name: p.text(p.default) for p in mech.params},
        "extra_inputs": [e.name for e in mech.extra_inputs],
        "paths": [
            {
                "name": p.name,
                "kind": p.kind,
                "memory": p.memory,
                "requires": [r.name for r in p.requires],
            }
            for p in mech.paths
        ],
        "decode": [
            {"name": p.name, "memory": p.memory, "requires": [r.name for r in p.requires]}
            for p in mech.decode
        ],
        "no_decode": mech.no_decode,
    }


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def live() -> list[dict[str, Any]]:
    """Every registered mechanism, described from the registry itself (imports torch)."""
    from attnbench import registry

    return [describe(m) for m in registry.MECHANISMS]


def cached(path: Path | None = None) -> list[dict[str, Any]] | None:
    """The cached description of the registry (at ``path``, default :func:`cache_file`), or None
    when there is none for these sources."""
    try:
        return json.loads((path or cache_file()).read_text(encoding="utf-8"))["mechanisms"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def described() -> list[dict[str, Any]]:
    """Every mechanism as :func:`describe` gives it: from the cache, else from the live registry
    (then cached; a cache that cannot be written is skipped silently)."""
    path = cache_file()  # the fingerprint reads every registry source: once
    found = cached(path)
    if found is None:
        found = live()
        with contextlib.suppress(OSError, AttnbenchError):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps({"mechanisms": found}, ensure_ascii=False))
    return found


def entries(device_type: str) -> list[dict[str, Any]]:
    """Every mechanism as :func:`describe` gives it, each path with ``available`` and ``reason``
    (why it cannot run on ``device_type``) added."""
    found = described()
    for entry in found:
        for path in entry["paths"]:
            path["reason"] = capabilities.reasons(path["requires"], device_type)
            path["available"] = not path["reason"]
            for name in path["requires"]:  # a library-backed path: its package, as installed
                key = name.removeprefix("package:")
                if key != name and key in capabilities.PACKAGES:
                    distribution = capabilities.PACKAGES[key][0]
                    path["package"] = distribution
                    path["package_version"] = capabilities.package_version(distribution)
    return found
