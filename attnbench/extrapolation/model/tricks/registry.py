"""The evaluation-time tricks there are: every module of this package that defines ``TRICK`` (a
:class:`~.base.Trick`), found when this module is imported. Adding a trick is adding its module.

They are listed (in help, errors, :data:`TRICKS`) in the order of :data:`LISTED`, then any other
by module name.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from attnbench.extrapolation.model.tricks.base import Trick

#: The order the tricks are listed in; a trick not named here comes after them.
LISTED = ("logn", "temperature", "yarn", "yarn-dim", "local", "chunk", "ntk", "pi", "rerope",
          "leaky", "hwfa")  # fmt: skip
#: Modules of the package that are not tricks.
MACHINERY = ("base", "mixer", "registry", "row")


def _discover() -> dict[str, Trick]:
    package = __name__.rpartition(".")[0]
    found: list[Trick] = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        if info.name in MACHINERY:
            continue
        trick = getattr(importlib.import_module(f"{package}.{info.name}"), "TRICK", None)
        if isinstance(trick, Trick):
            found.append(trick)
    order = {name: i for i, name in enumerate(LISTED)}
    found.sort(key=lambda t: order.get(t.name, len(order)))
    names = [t.name for t in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two evaluation-time tricks share a name: {sorted(names)}")
    return {t.name: t for t in found}


#: Every trick by name.
REGISTRY: dict[str, Trick] = _discover()
#: Every trick's one line, by name.
TRICKS: dict[str, str] = {name: t.summary for name, t in REGISTRY.items()}
