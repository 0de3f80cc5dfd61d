"""An injected slowdown, for the gate's sensitivity check (``attnbench gate --slow NAME:PATH``).

Does the gate catch a slowdown it is meant to catch? The only way to know is to make one: the
forward of one registered path made ``factor`` times slower, inside the processes of the
*current* side's runs only. :func:`launch_args` gives the interpreter arguments of such a run;
in it, :func:`inject` replaces the path in the registry record by a wrapper that busy-waits
(factor - 1) x the CPU time the real call took (the CI grid's clock is CPU time; a busy wait holds
its core, as a slow kernel would). No option of ``attnbench run speed`` slows anything down: the
slowdown exists only in a process the gate starts this way.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attnbench import registry
from attnbench.core.errors import AttnbenchError


@dataclass(frozen=True)
class Slowdown:
    """``impl`` (``NAME:PATH``, as results name it) made ``factor`` times slower."""

    impl: str
    factor: float

    @property
    def label(self) -> str:
        """``gqa:efficient x1.3``."""
        return f"{self.impl} x{self.factor:g}"


def checked(text: str, factor: float) -> Slowdown:
    """A slowdown of one registered path (an alias resolved to the name results use); errors
    say what is accepted."""
    if not factor > 1:
        raise AttnbenchError(f"--factor {factor}: accepted: a slowdown factor > 1 (e.g. 1.3)")
    mech, path = registry.resolve(text)
    if path is None:
        raise AttnbenchError(f"--slow {text}: accepted: NAME:PATH, one path to slow down")
    return Slowdown(f"{mech.name}:{path.name}", factor)


def slowed(fn: Callable[..., Any], factor: float) -> Callable[..., Any]:
    """``fn``, then a busy wait of (factor - 1) x the CPU time it took."""

    @functools.wraps(fn)  # keeps fn's signature: a path receives only the keywords it declares
    def slow(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        out = fn(*args, **kwargs)
        until = time.process_time() + (factor - 1) * (time.process_time() - t0)
        while time.process_time() < until:  # busy: a slow kernel holds its core
            pass
        return out

    return slow


def inject(impl: str, factor: float) -> None:
    """Replace ``NAME:PATH`` in the registry (this process only) by a slower copy."""
    mech, target = registry.resolve(impl)
    paths = tuple(
        dataclasses.replace(p, fn=slowed(p.fn, factor)) if p is target else p for p in mech.paths
    )
    slow = dataclasses.replace(mech, paths=paths)
    registry.MECHANISMS = tuple(slow if m is mech else m for m in registry.MECHANISMS)
    registry._BY_NAME = registry._index()


def launch_args(argv: Sequence[str], slow: Slowdown | None) -> list[str]:
    """The interpreter's arguments that run ``attnbench ARGV``: ``-m attnbench ...``, or, with a
    slowdown, ``-c`` code that injects it first and then runs the same command line."""
    if slow is None:
        return ["-m", "attnbench", *argv]
    code = "\n".join(
        [
            "import sys",
            "from attnbench.bench.slowdown import inject",
            f"inject({slow.impl!r}, {slow.factor!r})",
            "from attnbench.launch import main",
            f"sys.argv = {['attnbench', *argv]!r}",
            "main()",
        ]
    )
    return ["-c", code + "\n"]
