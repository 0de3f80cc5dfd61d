"""The registry: every mechanism attnbench knows, in the order ``attnbench list`` shows them.

To add a mechanism, write ``attnbench/variants/<name>.py`` with its paths and a ``Mechanism``
record, then add one line to ``MECHANISMS`` below. Tests, ``list`` and the suites pick it up.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnbench.core.errors import unknown
from attnbench.core.spec import Mechanism, PathSpec
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
    ssmax,
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
    ssmax.MECHANISM,
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


def resolve(
    text: str, mechanisms: Sequence[Mechanism] | None = None
) -> tuple[Mechanism, PathSpec | None]:
    """``NAME`` or ``NAME:PATH`` (the ``--impl`` form everywhere) -> (mechanism, path or None),
    both names checked: against ``mechanisms`` when given (a suite's own list), else the
    registry. An unknown name is an error that lists the known ones and suggests close names."""
    name, _, path = text.partition(":")
    name, path = name.strip(), path.strip()
    if mechanisms is None:
        mech = get(name)
    else:
        mech = next((m for m in mechanisms if name in (m.name, *m.aliases)), None)
        if mech is None:
            raise unknown("mechanism", name, [m.name for m in mechanisms])
    return mech, (mech.path(path) if path else None)


def families() -> list[str]:
    return list(dict.fromkeys(m.family for m in MECHANISMS))
