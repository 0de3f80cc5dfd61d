"""What a sweep says while a first call compiles or autotunes: notes while it runs, the first
call's time after it, and Triton's autotuning as it happens (a fake Triton listener)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from attnbench.bench import warmup_notes
from attnbench.bench.warmup_notes import autotune_notes, note_first_call, slow_first_call


def case(path: str = "fla-chunk") -> SimpleNamespace:
    return SimpleNamespace(path=SimpleNamespace(name=path),
                           label=lambda: "linear:fla-chunk fwd causal n=1024")  # fmt: skip


def test_a_long_first_call_is_said_while_it_runs():
    notes: list[str] = []
    with slow_first_call(case(), notes.append, after_s=0.05, every_s=0.05):
        time.sleep(0.3)
    assert notes, "no note while the first call ran"
    assert (
        notes[0] == "autotuning FLA's chunk kernel (linear:fla-chunk fwd causal n=1024): 0 s so far"
    )
    assert len(notes) >= 3
    count = len(notes)
    time.sleep(0.15)
    assert len(notes) == count  # nothing after the block
    assert not any(t.name == "attnbench-warm-up-notes" for t in threading.enumerate())


def test_a_quick_first_call_says_nothing():
    notes: list[str] = []
    with slow_first_call(case(), notes.append, after_s=5.0, every_s=5.0):
        pass
    member = SimpleNamespace(warm=SimpleNamespace(first_s=0.2))
    note_first_call(case(), member, notes.append)
    assert notes == []


def test_a_slow_first_call_is_reported_with_what_it_did():
    notes: list[str] = []
    member = SimpleNamespace(warm=SimpleNamespace(first_s=30.4))
    note_first_call(case(), member, notes.append)
    assert notes == [
        "autotuning FLA's chunk kernel: first call 30 s (linear:fla-chunk fwd causal n=1024)"
    ]
    note_first_call(case("flex"), member, notes.append)
    assert notes[-1].startswith("compiling FlexAttention: first call 30 s")
    note_first_call(case("efficient"), member, notes.append)
    assert notes[-1].startswith("warming up: first call 30 s")


def test_triton_autotuning_is_said_as_it_happens(monkeypatch):
    knobs = SimpleNamespace(listener=None)
    monkeypatch.setattr(warmup_notes, "_autotuning_knobs", lambda: knobs)
    notes: list[str] = []
    kernel = SimpleNamespace(__name__="chunk_fwd_kernel_h")
    with autotune_notes(torch.device("cuda"), notes.append):
        listen = knobs.listener
        listen(fn=kernel, key=(1,), best_config=None, configs_timings={1: 0, 2: 0, 3: 0},
               duration=12.3, cache_hit=False)  # fmt: skip
        listen(fn=kernel, key=(2,), best_config=None, configs_timings={}, duration=0.01,
               cache_hit=True)  # fmt: skip
    assert notes == ["autotuned Triton kernel chunk_fwd_kernel_h: 3 configurations in 12 s"]
    assert knobs.listener is None  # restored
    with autotune_notes(torch.device("cpu"), notes.append):  # the CPU: no listener set
        assert knobs.listener is None
