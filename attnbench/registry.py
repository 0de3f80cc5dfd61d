"""The registry: every mechanism attnbench knows, in the order ``attnbench list`` shows them.

To add a mechanism, write ``attnbench/variants/<name>.py`` with its paths and a ``Mechanism``
record, then add one line to ``MECHANISMS`` below. Tests, ``list`` and the suites pick it up.
"""

from __future__ import annotations

from attnbench.core.errors import unknown
from attnbench.core.spec import Mechanism
from attnbench.variants import (
    aft,
    flash_mixed,
    flash_tiled,
    gau,
    grouped,
    linear,
    logn_softmax,
    retention,
    softmax,
)
from attnbench.variants.sparse import (
    atrous,
    bigbird,
    fixed,
    local,
    longnet,
    openai_sparse,
    strided,
)

MECHANISMS: tuple[Mechanism, ...] = (
    softmax.MECHANISM,
    logn_softmax.MECHANISM,
    flash_tiled.MECHANISM,
    grouped.MQA,
    grouped.GQA,
    local.MECHANISM,
    atrous.MECHANISM,
    openai_sparse.MECHANISM,
    strided.MECHANISM,
    fixed.MECHANISM,
    bigbird.MECHANISM,
    longnet.MECHANISM,
    aft.FULL,
    aft.LOCAL,
    aft.SIMPLE,
    aft.CONV,
    gau.MECHANISM,
    flash_mixed.FLASH,
    flash_mixed.MC_SOFTMAX,
    linear.MECHANISM,
    retention.MECHANISM,
)


def _index() -> dict[str, Mechanism]:
    names: dict[str, Mechanism] = {}
    for mech in MECHANISMS:
        for name in (mech.name, *mech.aliases):
            if name in names:
                raise RuntimeError(f"two mechanisms are registered as {name!r}")
            names[name] = mech
    return names


_BY_NAME = _index()


def names() -> list[str]:
    """Registered mechanism names, in registry order (aliases not included)."""
    return [m.name for m in MECHANISMS]


def get(name: str | Mechanism) -> Mechanism:
    """The mechanism called ``name`` (or one of its aliases); an error suggests close names."""
    if isinstance(name, Mechanism):
        return name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise unknown("mechanism", name, names()) from None


def families() -> list[str]:
    return list(dict.fromkeys(m.family for m in MECHANISMS))
