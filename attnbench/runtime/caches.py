"""The on-disk compile and autotune caches a run uses, so that a second run on the same machine
skips what the first one compiled and autotuned.

What is cached, and where (each folder is made on first use):

* Inductor (``torch.compile``: the FlexAttention paths, ``linear:compiled``): its FX graph and
  generated kernels, in ``TORCHINDUCTOR_CACHE_DIR``. Torch's default is
  ``/tmp/torchinductor_<user>``, which a reboot or a fresh machine's tmpfs empties.
* Triton (attnbench's kernels, FLA's, SageAttention's, and Inductor's generated ones): compiled
  kernels in ``TRITON_CACHE_DIR``, and, with ``TRITON_CACHE_AUTOTUNING=1``, the winning
  configuration of every ``@triton.autotune`` call beside them. Without the latter every process
  autotunes again: FLA's chunk kernels took 30 s (forward) and 95 s (forward + backward) of
  their first call on an H100 (results/speed/nvidia-h100, round 3).

The folders: ``--cache-dir DIR`` (``DIR/inductor``, ``DIR/triton``) when given; else each
variable as the environment already sets it; else ``$ATTNBENCH_CACHE_DIR``, else
``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``. Triton reads
``TRITON_CACHE_AUTOTUNING`` when a kernel's ``@triton.autotune`` decorator runs (at import of the
library that defines it), so :func:`compile_caches` is entered before any kernel module is
imported; torch and Triton read the two folders when they compile.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The variables torch and Triton read; the first two name folders.
INDUCTOR_VAR = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VAR = "TRITON_CACHE_DIR"
AUTOTUNE_VAR = "TRITON_CACHE_AUTOTUNING"
#: attnbench's own override of the root folder (``--cache-dir`` wins over it).
ROOT_VAR = "ATTNBENCH_CACHE_DIR"


@dataclass(frozen=True)
class CompileCaches:
    """Where a run's compiled kernels and autotuning results go."""

    inductor: Path
    triton: Path
    #: Where each folder came from: "--cache-dir", the variable's name, or "default".
    sources: Mapping[str, str]

    def environment(self) -> dict[str, str]:
        """The variables to set for torch and Triton (and for a child process)."""
        return {
            INDUCTOR_VAR: str(self.inductor),
            TRITON_VAR: str(self.triton),
            AUTOTUNE_VAR: "1",
        }

    def describe(self) -> dict[str, str]:
        """For a sidecar or an environment record."""
        return {
            "inductor": str(self.inductor),
            "triton": str(self.triton),
            "autotuning_cached": "1",
            **{f"{k}_from": v for k, v in self.sources.items()},
        }


def cache_root(env: Mapping[str, str]) -> Path:
    """``$ATTNBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnbench``, else
    ``~/.cache/attnbench``."""
    if env.get(ROOT_VAR):
        return Path(env[ROOT_VAR]).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / "attnbench"


def resolve_caches(
    option: Path | str | None, env: Mapping[str, str] | None = None
) -> CompileCaches:
    """The cache folders for ``--cache-dir`` (``option``, None when not given) and the
    environment ``env`` (default ``os.environ``); see the module docstring for the order."""
    env = os.environ if env is None else env
    if option is not None:
        root = Path(option).expanduser()
        return CompileCaches(
            root / "inductor", root / "triton", {"inductor": "--cache-dir", "triton": "--cache-dir"}
        )
    root = cache_root(env)
    folders, sources = {}, {}
    for name, var in (("inductor", INDUCTOR_VAR), ("triton", TRITON_VAR)):
        if env.get(var):
            folders[name], sources[name] = Path(env[var]).expanduser(), var
        else:
            folders[name] = root / name
            sources[name] = ROOT_VAR if env.get(ROOT_VAR) else "default"
    return CompileCaches(folders["inductor"], folders["triton"], sources)


@contextlib.contextmanager
def compile_caches(caches: CompileCaches) -> Iterator[CompileCaches]:
    """Point torch and Triton at ``caches`` for the duration (the variables are restored after,
    so a program that runs attnbench in-process keeps its own settings)."""
    saved = {k: os.environ.get(k) for k in caches.environment()}
    os.environ.update(caches.environment())
    try:
        yield caches
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
