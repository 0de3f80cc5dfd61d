"""The registry as plain data, and a snapshot of it that ``attnbench list`` reads without
importing torch (importing torch alone takes 1.5-2.5 s on a 2-core machine).

The snapshot, ``attnbench/data/registry.json``, holds every mechanism as :func:`describe` gives it
and a fingerprint of the source files that define the registry. :func:`entries` uses it only when
the fingerprint matches the installed sources; otherwise (a mechanism added or edited since) it
builds the same data from the live registry, so what ``list`` shows is never stale. After
changing a mechanism, refresh the snapshot with ``python -m attnbench.catalogue`` (a test fails
until then, saying so).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench import capabilities

if TYPE_CHECKING:
    from attnbench.spec import Mechanism

PACKAGE = Path(__file__).resolve().parent
SNAPSHOT = PACKAGE / "data" / "registry.json"
#: Parts of the package that do not define the registry (their edits keep the snapshot valid).
NOT_REGISTRY = ("cli", "bench", "extrapolation", "measure", "data")


def fingerprint() -> str:
    """SHA-256 over the Python sources that define mechanisms, paths and parameters."""
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] not in NOT_REGISTRY and p.name != "catalogue.py"
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
    }


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def live() -> list[dict[str, Any]]:
    """Every registered mechanism, described from the registry itself (imports torch)."""
    from attnbench import registry

    return [describe(m) for m in registry.MECHANISMS]


def snapshot() -> list[dict[str, Any]] | None:
    """The snapshot's mechanisms, or None when it is missing or older than the sources."""
    try:
        data = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data["mechanisms"] if data.get("fingerprint") == fingerprint() else None


def entries(device_type: str) -> list[dict[str, Any]]:
    """Every mechanism as :func:`describe` gives it, each path with ``available`` and ``reason``
    (why it cannot run on ``device_type``) added: from the snapshot when it is current."""
    found = snapshot()
    if found is None:
        found = live()
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


def write_snapshot(path: Path = SNAPSHOT) -> Path:
    """Write the snapshot of the live registry (``python -m attnbench.catalogue``)."""
    from attnbench.outputs import write_text

    data = {"fingerprint": fingerprint(), "mechanisms": live()}
    write_text(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return path


if __name__ == "__main__":
    print(f"wrote {write_snapshot()}")
