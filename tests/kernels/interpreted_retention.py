"""The chunk-parallel retention / linear attention / FLASH global-part kernels
(attnbench/kernels/triton_retention.py) under Triton's CPU interpreter, against float64 dense
references: many chunks with a ragged tail (T = 150 in 16-wide tiles: 10 tiles, the last of 6),
per-head decays with gamma = 1 and a small gamma = 0.5, B and H > 1, D != Dv, outputs and the
gradients of q, k and v; FLASH's chunks of 16, 32 and 64 on 16-wide tiles (states kept every
1, 2 and 4 tiles), T shorter than one chunk, and the state buffers against their sums.

Not collected by default (the name does not start with ``test_``):
tests/kernels/test_triton_interpret.py runs every ``interpreted_*.py`` in a fresh process with
``TRITON_INTERPRET=1`` (see interpreted_triton.py's docstring for why). Alone:
``TRITON_INTERPRET=1 pytest tests/kernels/interpreted_retention.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnbench.core.testing import compare_paths

if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
    pytest.skip("needs TRITON_INTERPRET=1 from the start", allow_module_level=True)
pytest.importorskip("triton", reason="Triton is not installed")

from attnbench.kernels import triton_ops, triton_retention  # noqa: E402
from tests.helpers.dense_refs import (  # noqa: E402
    flash_global_reference,
    make_qkv,
    retention_reference,
)
from tests.helpers.interpreter import DTYPES, interpreter_bf16_dot_ok  # noqa: E402

TILE = 16  # the interpreter is slow; 16 is tl.dot's smallest tile
GAMMAS = [1.0, 0.5, 0.9]  # a decay per head: none, a fast one, a slow one


@pytest.fixture
def dtype(request):
    if request.param == torch.bfloat16 and not interpreter_bf16_dot_ok():
        pytest.skip("Triton's interpreter computes tl.dot on bf16 wrongly (checked on GPU)")
    return request.param


def check(fast, reference, inputs):
    verdicts = compare_paths(fast, reference, inputs, {})
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


def retention_case(gammas, block):
    def fast(q, k, v):
        return triton_ops.retention_chunked(q, k, v, gammas, block=block)

    def reference(q, k, v):
        return retention_reference(q, k, v, gamma=gammas)

    return fast, reference


def flash_case(chunk):
    def fast(q, k, v):
        return triton_ops.flash_global_chunked(q, k, v, chunk=chunk)

    def reference(q, k, v):
        return flash_global_reference(q, k, v, chunk=chunk)

    return fast, reference


# --------------------------------------------------------------------------------------------
# Retention (and gamma = 1: causal linear attention)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("d", "dv"), [(40, 80), (80, 24), (24, 16)], ids=["D40-DV80", "D80-DV24", "D24-DV16"]
)
def test_retention_many_chunks(d, dv):
    """10 tiles, the last ragged; D = 40 (a 64-wide tile, two 32-wide state tiles) and Dv = 80
    (two Dv tiles in dv and in dq/dk's loops, three 32-wide state tiles) cross every tile;
    D = 80: a 128-wide q/k tile, two 64-wide D slices in dq/dk."""
    inputs = make_qkv(2, 3, 150, d, dv, torch.float32, seed=d)
    check(*retention_case(GAMMAS, TILE), inputs)


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_retention_half_precision(dtype):
    check(*retention_case(GAMMAS, TILE), make_qkv(2, 3, 150, 24, 40, dtype, seed=3))


def test_retention_default_tile():
    """The default 64-wide tile: T = 150 is 3 tiles, the last of 22."""
    check(*retention_case(GAMMAS[:2], None), make_qkv(1, 2, 150, 32, 48, torch.float32, seed=4))


def test_retention_whole_state_tiles(monkeypatch):
    """With as many programs as the GPU wants, the state passes keep 64-wide D / Dv tiles."""
    monkeypatch.setattr(triton_retention, "_sm_count", lambda device: 1)
    assert triton_retention._state_tiles(40, 80, 6, torch.device("cpu")) == (64, 64)
    check(*retention_case(GAMMAS, TILE), make_qkv(2, 3, 150, 40, 80, torch.float32, seed=5))


def test_state_tiles_split_for_small_grids():
    cpu = torch.device("cpu")  # counted as an H100's 132 multiprocessors
    assert triton_retention._state_tiles(64, 64, 16, cpu) == (32, 32)  # 64 programs
    assert triton_retention._state_tiles(128, 128, 16, cpu) == (32, 32)  # 256 programs
    assert triton_retention._state_tiles(64, 64, 256, cpu) == (64, 64)  # enough already
    assert triton_retention._state_tiles(16, 16, 1, cpu) == (16, 16)  # never below the dims


def test_linear_attention_normalised_many_chunks():
    """gamma = 1 on positive features, normalised: two kernel calls (v, then a column of ones)."""

    def fast(q, k, v):
        return triton_ops.linear_attention_chunked(q.exp(), k.exp(), v, block=TILE)

    def reference(q, k, v):
        scores = (q.exp() @ k.exp().transpose(-1, -2)).tril()  # (B, H, T, T)
        return (scores @ v) / scores.sum(-1, keepdim=True)

    check(fast, reference, make_qkv(2, 2, 150, 16, 24, torch.float32, seed=6))


@pytest.mark.parametrize("block", [TILE, None], ids=["tile16", "tile64"])
def test_shorter_than_one_chunk(block):
    """T = 5: one tile, mostly padding; no state is ever added to."""
    check(*retention_case(GAMMAS[:2], block), make_qkv(2, 2, 5, 24, 16, torch.float32, seed=7))


# --------------------------------------------------------------------------------------------
# FLASH's causal global part
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunk", "t"),
    [(16, 150), (32, 150), (64, 150), (32, 20), (64, 37)],
    ids=["c16-T150", "c32-T150", "c64-T150", "c32-T20", "c64-T37"],
)
def test_flash_global_states_every_chunk(monkeypatch, chunk, t):
    """Kernel tile 16: chunk 16 keeps a state every tile, 32 every second, 64 every fourth;
    T = 20 and 37 are shorter than the chunk's tiles times the stride (one state, all zero)."""
    monkeypatch.setattr(triton_retention, "TILE", TILE)
    check(*flash_case(chunk), make_qkv(2, 2, t, 24, 40, torch.float32, seed=chunk + t))


@pytest.mark.parametrize("dtype", DTYPES[1:], indirect=True)
def test_flash_global_half_precision(monkeypatch, dtype):
    monkeypatch.setattr(triton_retention, "TILE", TILE)
    check(*flash_case(32), make_qkv(1, 2, 150, 16, 32, dtype, seed=8))


def test_flash_global_default_tile():
    """Chunk 128 on the default 64-wide tile: states every second tile."""
    check(*flash_case(128), make_qkv(1, 2, 300, 16, 16, torch.float32, seed=9))


# --------------------------------------------------------------------------------------------
# The state buffers themselves, and the shared-memory retry
# --------------------------------------------------------------------------------------------


def _log2g(gammas):
    return torch.log2(torch.tensor(gammas, dtype=torch.float64)).float()


@pytest.mark.parametrize(("chunk", "gammas"), [(None, GAMMAS), (32, None)], ids=["ret", "flash"])
def test_states_are_their_sums(monkeypatch, chunk, gammas):
    """Forward: S[n] = sum_{s < n c} gamma^(n c - 1 - s) k_s^T v_s; reversed (q, do):
    S[n] = sum_{t >= (n+1) c} gamma^(t - (n+1) c + 1) q_t^T do_t, c = stride x tile."""
    monkeypatch.setattr(triton_retention, "TILE", TILE)
    x = make_qkv(2, 3, 150, 24, 40, torch.float64, seed=10)
    q, k, v = (x[n].float() for n in ("q", "k", "v"))
    log2g = None if gammas is None else _log2g(gammas)
    plan = triton_retention._plan(q, v, log2g, TILE, chunk)
    c = plan.bt * plan.stride
    g = torch.tensor(gammas or [1.0] * 3, dtype=torch.float64)[None, :, None]  # (1, H, 1)
    fwd = triton_retention._states(k, v, log2g, plan, reverse=False).view(2, 3, -1, 24, 40)
    rev = triton_retention._states(q, v, log2g, plan, reverse=True).view(2, 3, -1, 24, 40)
    pos = torch.arange(150, dtype=torch.float64)
    for n in range(plan.n_states):
        w = torch.where(pos < n * c, g ** (n * c - 1 - pos).clamp(min=0), 0.0)  # (1, H, T)
        want = torch.einsum("bht,bhtd,bhte->bhde", w.expand(2, -1, -1), x["k"], x["v"])
        torch.testing.assert_close(fwd[:, :, n].double(), want, rtol=1e-5, atol=1e-4)
        start = (n + 1) * c
        w = torch.where(pos >= start, g ** (pos - start + 1).clamp(min=0), 0.0)  # (1, H, T)
        want = torch.einsum("bht,bhtd,bhte->bhde", w.expand(2, -1, -1), x["q"], x["v"])
        torch.testing.assert_close(rev[:, :, n].double(), want, rtol=1e-5, atol=1e-4)


def test_a_shared_memory_refusal_is_retried_with_one_stage(monkeypatch):
    refusal = triton_retention.OUT_OF_RESOURCES[0]
    launches = []

    class FakeKernel:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs["num_stages"])
                if kwargs["num_stages"] != 1:
                    try:
                        raise refusal(270336, 232448, "shared memory")
                    except TypeError:  # another Triton's signature
                        raise refusal("shared memory") from None
                args[2].zero_()  # the states

            return launch

    monkeypatch.setattr(triton_retention, "_chunk_states", FakeKernel())
    monkeypatch.setattr(triton_retention, "_STAGES", {})
    q = torch.randn(1, 2, 40, 16)
    stages = triton_retention._STATES_CONFIG[2]
    triton_retention.forward(q, q, q, None, block=TILE)
    assert launches == [stages, 1]  # the chosen stages first, then one
    triton_retention.forward(q, q, q, None, block=TILE)
    assert launches == [stages, 1, 1]  # remembered for this configuration
