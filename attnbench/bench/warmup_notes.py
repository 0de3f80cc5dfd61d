"""What a sweep says while a case's first call compiles or autotunes, so that a long warm-up is
not taken for a hung run.

On a GPU from a cold cache, a first call can take tens of seconds: FLA's chunk kernels autotuned
for 30 s (forward) and 95 s (forward + backward), a FlexAttention pattern compiled for 4-60 s
(H100, results/speed/nvidia-h100, rounds 1-5), and the progress showed nothing meanwhile. Three
notes, on the progress's ``note`` line:

* while a first call runs past :data:`STILL_AFTER_S`, every :data:`EVERY_S` seconds: what it is
  doing (``autotuning FLA's chunk kernel (linear:fla-chunk fwd causal n=1024): 30 s so far``);
* after it, when it took at least :data:`SLOW_S`: ``autotuning FLA's chunk kernel: first call
  30 s``;
* on CUDA with Triton >= 3.4, each autotuning that took over a second, from Triton's own
  listener: the kernel's name, how many configurations, how long.

The compiled kernels and the autotuning results go to the on-disk caches
(:mod:`attnbench.runtime.caches`), so a second run skips most of this.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from attnbench.bench.member import Member
from attnbench.bench.plan import Case

#: The first note comes after this many seconds of one first call, then one every EVERY_S.
STILL_AFTER_S = 10.0
EVERY_S = 30.0
#: A first call at least this long is reported when it ends.
SLOW_S = 5.0
#: An autotuning shorter than this is not reported.
AUTOTUNE_NOTE_S = 1.0

#: What a path's first call spends its time on, by path name.
FIRST_CALL = {
    "flex": "compiling FlexAttention",
    "triton": "compiling attnbench's Triton kernel",
    "fla-chunk": "autotuning FLA's chunk kernel",
    "fla-recurrent": "autotuning FLA's recurrent kernel",
    "fla-parallel": "autotuning FLA's parallel kernel",
    "sage": "compiling SageAttention's kernel",
    "xformers": "loading xFormers' kernel",
    "compiled": "compiling with torch.compile",
}

Note = Callable[[str], None]


def first_call_work(case: Case) -> str:
    """What ``case``'s first call does, in a few words (``warming up`` when nothing special)."""
    return FIRST_CALL.get(case.path.name, "warming up")


@contextlib.contextmanager
def slow_first_call(
    case: Case, note: Note, after_s: float = STILL_AFTER_S, every_s: float = EVERY_S
) -> Iterator[None]:
    """While the block runs (a case's set-up: its first call, warm-up and memory pass), a note
    after ``after_s`` seconds and then every ``every_s``, from a timer thread."""
    done = threading.Event()
    what = first_call_work(case)

    def tick() -> None:
        waited = after_s
        while not done.wait(timeout=after_s if waited == after_s else every_s):
            note(f"{what} ({case.label()}): {waited:.0f} s so far")
            waited += every_s

    timer = threading.Thread(target=tick, name="attnbench-warm-up-notes", daemon=True)
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.join()


def note_first_call(case: Case, member: Member, note: Note, slow_s: float = SLOW_S) -> None:
    """``autotuning FLA's chunk kernel: first call 30 s (...)``, when the first call was slow."""
    first = member.warm.first_s
    if first >= slow_s:
        note(f"{first_call_work(case)}: first call {first:.0f} s ({case.label()})")


@contextlib.contextmanager
def autotune_notes(
    device: torch.device, note: Note, min_s: float = AUTOTUNE_NOTE_S
) -> Iterator[None]:
    """On CUDA, with a Triton that has an autotuning listener (3.4 and later), a note for each
    autotuning that ran longer than ``min_s`` (a result from the cache is not one)."""
    knobs = _autotuning_knobs() if device.type == "cuda" else None
    if knobs is None:
        yield
        return

    def listener(
        *,
        fn: Any,
        key: Any,
        best_config: Any,
        configs_timings: Any,
        duration: float | None,
        cache_hit: bool,
        **_: Any,
    ) -> None:
        if cache_hit or duration is None or duration < min_s:
            return
        name = getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "?")
        count = len(configs_timings or {})
        note(f"autotuned Triton kernel {name}: {count} configurations in {duration:.0f} s")

    previous = knobs.listener
    knobs.listener = listener
    try:
        yield
    finally:
        knobs.listener = previous


def _autotuning_knobs() -> Any | None:
    """``triton.knobs.autotuning`` when Triton is installed and has a listener; else None."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        from triton import knobs
    except ImportError:
        return None
    autotuning = getattr(knobs, "autotuning", None)
    return autotuning if autotuning is not None and hasattr(autotuning, "listener") else None
