"""The relu^2 (GAU) Triton kernels under Triton's CPU interpreter: the whole value dim in one call,
the interior (unmasked) and boundary (masked) tile ranges, the per-dtype tiles and the fallback
for a config the GPU refuses. Dense float64 references (tests/helpers/dense_refs.py), outputs and
gradients; small tiles (16, 32) so the interpreter stays fast.

Not collected by default (the name does not start with ``test_``):
tests/kernels/test_triton_interpret.py runs it in a fresh process with ``TRITON_INTERPRET=1``
(see interpreted_triton.py for why). Alone:
``TRITON_INTERPRET=1 pytest -o addopts= tests/kernels/interpreted_gau.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
    pytest.skip("needs TRITON_INTERPRET=1 from the start", allow_module_level=True)
pytest.importorskip("triton", reason="Triton is not installed")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attnbench.kernels import triton_gau, triton_ops  # noqa: E402
from attnbench.kernels.triton_gau import Tiles, _key_split, _query_split  # noqa: E402
from tests.helpers.dense_refs import gau_reference  # noqa: E402
from tests.helpers.interpreter import (  # noqa: E402
    check,
    dtype_param,
    interpreter_bf16_dot_ok,
    make,
)

HALF = [dtype_param(torch.float16), dtype_param(torch.bfloat16)]


@pytest.fixture
def half(request):
    if request.param == torch.bfloat16 and not interpreter_bf16_dot_ok():
        pytest.skip("Triton's interpreter computes tl.dot on bf16 wrongly (checked on GPU)")
    return request.param


def gau(blocks):
    def fast(q, k, v, **kw):
        return triton_ops.gau_relu2(q, k, v, **kw, blocks=blocks)

    return fast


@pytest.fixture
def widths(monkeypatch):
    """The v widths the kernels were called with (forward and backward), in call order."""
    seen: list[tuple[str, int]] = []
    forward, backward = triton_gau.forward, triton_gau.backward

    def spy_forward(q, k, v, *args):
        seen.append(("fwd", v.shape[-1]))
        return forward(q, k, v, *args)

    def spy_backward(q, k, v, *args):
        seen.append(("bwd", v.shape[-1]))
        return backward(q, k, v, *args)

    monkeypatch.setattr(triton_gau, "forward", spy_forward)
    monkeypatch.setattr(triton_gau, "backward", spy_backward)
    return seen


# --------------------------------------------------------------------------------------------
# The whole value dim in one call
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dv", [160, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_value_dim_in_one_call(widths, dv, causal):
    """Dv up to 256 is one kernel call per pass (scores once for the whole v), not slices."""
    inputs = make(2, 1, 37, 20, dv, torch.float32, seed=dv + causal)
    check(gau((16, 16)), gau_reference, inputs, {"causal": causal})
    assert widths and {w for _, w in widths} == {dv}
    assert {p for p, _ in widths} == {"fwd", "bwd"}


def test_value_dim_beyond_one_call_is_split(widths):
    """v wider than MAX_VALUE_DIM: slices of 256 and the rest, their dq, dk summed by autograd."""
    assert triton_ops.MAX_VALUE_DIM == triton_gau.MAX_VALUE_DIM == 256
    inputs = make(1, 1, 21, 16, 300, torch.float32, seed=3)
    check(gau((16, 16)), gau_reference, inputs, {"causal": True, "chunk": 8})
    assert sorted({w for _, w in widths}) == [44, 256]


def test_kernel_refuses_wider_v():
    q = torch.zeros(1, 1, 4, 16)
    v = torch.zeros(1, 1, 4, 257)
    with pytest.raises(ValueError, match="value dim 257"):
        triton_gau.forward(q, q, v, torch.ones(4), 1.0, 1.0, False, 0)


# --------------------------------------------------------------------------------------------
# Interior (unmasked) and boundary (masked) tiles
# --------------------------------------------------------------------------------------------

#: (causal, chunk): bidirectional, causal, chunks a tile holds whole (16), chunks smaller than a
#: tile (8: every tile crosses a border) and chunks out of step with the tiles (24).
MASKS = [(False, 0), (True, 0), (False, 16), (True, 16), (True, 8), (False, 24), (True, 24)]
MASK_IDS = ["bidir", "causal", "bidir-c16", "causal-c16", "causal-c8", "bidir-c24", "causal-c24"]
UNEQUAL = [(False, 0), (True, 0), (True, 8), (False, 24)]
#: (query tile, key tile): square, and both ways unequal (the diagonal spans several tiles).
#: The unequal ones on the masks where they change the ranges most (test_tile_ranges checks
#: every combination of the ranges themselves, cheaply).
CASES = [((16, 16), mask) for mask in MASKS] + [
    (blocks, mask) for blocks in ((16, 32), (32, 16)) for mask in MASKS if mask in UNEQUAL
]


@pytest.mark.parametrize(
    ("blocks", "mask"),
    CASES,
    ids=[f"{b[0]}x{b[1]}-{MASK_IDS[MASKS.index(m)]}" for b, m in CASES],
)
@pytest.mark.parametrize(
    ("b", "t", "d", "dv"),
    [(1, 64, 16, 16), (2, 37, 20, 24)],
    ids=["T64-even-dims", "T37-ragged-dims"],
)
def test_interior_and_boundary_tiles(blocks, mask, b, t, d, dv):
    """T a multiple of every tile (interior tiles load without any mask) and T with a ragged
    tail and head dims below their tile widths (column masks on the unmasked step)."""
    causal, chunk = mask
    inputs = make(b, 2, t, d, dv, torch.float32, seed=t + 3 * causal + chunk)
    check(gau(blocks), gau_reference, inputs, {"causal": causal, "chunk": chunk})


def test_row_scale_on_interior_tiles():
    """Any per-row scale on the unmasked path: FLASH's local part divided by c * s."""
    c = 16

    def fast(q, k, v):
        scale = torch.linspace(0.1, 2.0, q.shape[-2], dtype=torch.float64)
        return triton_ops.relu2_attention(q, k, v, scale, causal=True, chunk=c, blocks=(16, 16))

    def reference(q, k, v):
        t = q.shape[-2]
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        mask = (j <= i) & ((i // c) == (j // c))  # (T, T)
        scale = torch.linspace(0.1, 2.0, t, dtype=torch.float64).to(q.dtype)[:, None]  # (T, 1)
        return (torch.relu(q @ k.transpose(-1, -2)) ** 2 * mask) @ v * scale

    check(fast, reference, make(1, 2, 64, 16, 32, torch.float32, seed=11))


@pytest.mark.parametrize("half", HALF, indirect=True)
@pytest.mark.parametrize(("causal", "chunk"), [(True, 0), (False, 0), (True, 16)])
def test_half_precision(half, causal, chunk):
    """16-bit inputs: a 256-wide v in one call, interior and diagonal tiles."""
    inputs = make(1, 2, 48, 16, 256, half, seed=20 + chunk + causal)
    check(gau((16, 32)), gau_reference, inputs, {"causal": causal, "chunk": chunk})


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_default_tiles_half(causal):
    """The GPU's own 16-bit tiles (128 x 64 forward and dq, 64-wide dk/dv) across a ragged
    tail: T = 150 crosses the 128-row tiles."""
    inputs = make(1, 1, 150, 16, 160, torch.float16, seed=30 + causal)
    check(gau((None, None)), gau_reference, inputs, {"causal": causal})


# --------------------------------------------------------------------------------------------
# The tile ranges themselves, against the mask they stand for
# --------------------------------------------------------------------------------------------


@triton.jit
def _splits(
    OUT,
    T,
    chunk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_CHUNK: tl.constexpr,
    QUERIES: tl.constexpr,
):
    pid = tl.program_id(0)
    zero = pid * 0
    if QUERIES:  # the dk/dv kernel: key tile pid, query tiles streamed
        lo, head, mid, hi = _query_split(
            pid * BLOCK_N, T, chunk, BLOCK_M, BLOCK_N, CAUSAL, HAS_CHUNK
        )
    else:  # the forward and dq: query tile pid, key tiles streamed
        lo, mid, hi = _key_split(pid * BLOCK_M, T, chunk, BLOCK_M, BLOCK_N, CAUSAL, HAS_CHUNK)
        head = lo
    tl.store(OUT + pid * 4 + 0, lo + zero)
    tl.store(OUT + pid * 4 + 1, head + zero)
    tl.store(OUT + pid * 4 + 2, mid + zero)
    tl.store(OUT + pid * 4 + 3, hi + zero)


def _ranges(t, chunk, bm, bn, causal, queries):
    tiles = triton.cdiv(t, bn if queries else bm)
    out = torch.full((tiles, 4), -1, dtype=torch.int32)
    _splits[(tiles,)](
        out, t, max(chunk, 1), bm, bn, CAUSAL=causal, HAS_CHUNK=chunk > 0, QUERIES=queries
    )
    return out.tolist()


def _keep(i: int, j: int, t: int, causal: bool, chunk: int) -> bool:
    ok = i < t and j < t and (not causal or j <= i)
    return ok and (not chunk or i // chunk == j // chunk)


@pytest.mark.parametrize("t", [1, 16, 37, 64, 100])
@pytest.mark.parametrize(("bm", "bn"), [(16, 16), (16, 32), (32, 16), (128, 64), (64, 128)])
@pytest.mark.parametrize(("causal", "chunk"), MASKS + [(False, 64), (True, 256)])
def test_tile_ranges(t, bm, bn, causal, chunk):
    """Every visible pair lies in [lo, hi); every tile of the unmasked range lies in [0, T) and
    is visible whole; the masked ranges are only the diagonal, chunk borders and the tail."""
    for start_m, (lo, head, mid, hi) in zip(
        range(0, t, bm), _ranges(t, chunk, bm, bn, causal, queries=False), strict=True
    ):
        rows = range(start_m, min(start_m + bm, t))
        assert 0 <= lo == head <= mid <= hi <= t and (mid - lo) % bn == 0
        seen = [j for j in range(t) if any(_keep(i, j, t, causal, chunk) for i in rows)]
        assert all(lo <= j < hi for j in seen)
        for s in range(lo, mid, bn):
            assert s + bn <= t
            assert all(_keep(i, j, t, causal, chunk) for i in rows for j in range(s, s + bn))
        one_chunk = not chunk or start_m // chunk == (start_m + bm - 1) // chunk
        if one_chunk:  # masked: at most the tail tile, plus the diagonal when causal
            assert hi - mid < bn + (bm if causal else 0)
        if not causal and not chunk and t % bn == 0:
            assert mid == hi
    for start_n, (lo, head, mid, hi) in zip(
        range(0, t, bn), _ranges(t, chunk, bm, bn, causal, queries=True), strict=True
    ):
        cols = range(start_n, min(start_n + bn, t))
        assert 0 <= lo <= head <= mid <= hi <= t and (mid - head) % bm == 0
        assert head == hi or (head - lo) % bm == 0
        seen = [i for i in range(t) if any(_keep(i, j, t, causal, chunk) for j in cols)]
        assert all(lo <= i < hi for i in seen)
        for s in range(head, mid, bm):
            assert s + bm <= t
            assert all(_keep(i, j, t, causal, chunk) for i in range(s, s + bm) for j in cols)
        one_chunk = not chunk or start_n // chunk == (start_n + bn - 1) // chunk
        if one_chunk:
            assert head - lo <= (triton.cdiv(bn - 1, bm) * bm if causal else 0)
            assert head == hi or hi - mid < bm
        if not causal and not chunk and t % bm == 0:
            assert lo == head and mid == hi


# --------------------------------------------------------------------------------------------
# Tiles per dtype, and the fallback for a config the GPU refuses
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_16_bit_tiles_are_the_big_ones(dtype):
    """16-bit inputs: 128-row query tiles x 64 keys in the forward and dq at GAU's shape (s = 128,
    e = 256), 8 warps; the dk/dv kernel keeps 128 keys and streams 64 queries (FLA's Hopper
    backward) while D + Dv <= 192, 128 x 32 at D = Dv = 128, 64 x 32 at 128 + 256 (larger
    ones spill registers there). Tiles(block_m = queries, block_n = keys, warps, stages)."""
    config = triton_gau._config
    assert config(dtype, 128, 256, "fwd")[0] == Tiles(128, 64, 8, 3)
    assert config(dtype, 128, 256, "dq")[0] == Tiles(128, 64, 8, 2)
    assert config(dtype, 128, 256, "dkdv")[0] == Tiles(32, 64, 8, 3)
    assert config(dtype, 128, 128, "dkdv")[0] == Tiles(32, 128, 8, 3)
    assert config(dtype, 64, 64, "dkdv")[0] == Tiles(64, 128, 8, 3)
    fp32 = config(torch.float32, 128, 256, "dkdv")[0]
    assert fp32.block_m < 32 and fp32.block_n < 64


@pytest.mark.parametrize("kernel", triton_gau.KERNELS)
@pytest.mark.parametrize(("d", "dv"), [(128, 256), (128, 128), (64, 64), (20, 160)])
def test_tiles_fit_their_budgets(kernel, d, dv):
    """The first config of every dtype is ``_tiles``' choice on the most stages whose loads fit
    the shared-memory budget (or one stage); fp32 tiles are never larger than 16-bit ones; the
    fallbacks after it only shrink (fewer stages or smaller tiles), down to 16 x 16 on one
    stage."""
    bd, bdv = triton_gau._pad(d), triton_gau._pad(dv)
    firsts = {}
    for dtype, elem in ((torch.bfloat16, 2), (torch.float32, 4)):
        candidates = triton_gau._config(dtype, d, dv, kernel)
        first = firsts[dtype] = candidates[0]
        stationary, streamed = (
            (first.block_n, first.block_m) if kernel == "dkdv" else (first.block_m, first.block_n)
        )
        half = dtype == torch.bfloat16
        ragged = (d, dv) != (bd, bdv)
        assert (stationary, streamed) == triton_gau._tiles(kernel, half, bd + bdv, ragged)

        def smem(stages, stationary=stationary, streamed=streamed, elem=elem):
            return triton_gau._smem(kernel, stationary, streamed, bd, bdv, elem, stages)

        assert smem(first.num_stages) <= triton_gau.SMEM_BUDGET or first.num_stages == 1
        more = first.num_stages + 1
        assert more > triton_gau.MAX_STAGES or smem(more) > triton_gau.SMEM_BUDGET
        assert candidates[-1] == Tiles(16, 16, first.num_warps, 1)
        for a, b in zip(candidates[:-1], candidates[1:], strict=True):
            assert (b.block_m, b.block_n, b.num_stages) != (a.block_m, a.block_n, a.num_stages)
            assert b.block_m * b.block_n <= a.block_m * a.block_n
    half, single = firsts[torch.bfloat16], firsts[torch.float32]
    assert single.block_m <= half.block_m and single.block_n <= half.block_n


def test_forced_blocks():
    tiles = triton_gau._config(torch.float32, 16, 16, "dkdv", (16, 32))
    assert {(t.block_m, t.block_n) for t in tiles} == {(16, 32)}
    assert tiles[-1].num_stages == 1


def test_refused_config_falls_back_and_is_remembered(monkeypatch):
    """A config the GPU refuses (OutOfResources at compile time) is retried with the next one;
    the one that ran is remembered, so the refused one is not tried again."""
    from triton.runtime.errors import OutOfResources

    tried: list[int] = []
    real = triton_gau._fwd

    class Flaky:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                tried.append(kwargs["num_stages"])
                if kwargs["num_stages"] > 1:
                    raise OutOfResources(300 * 1024, 227 * 1024, "shared memory")
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(triton_gau, "_fwd", Flaky())
    monkeypatch.setattr(triton_gau, "_CHOSEN", {})
    inputs = make(1, 2, 37, 16, 16, torch.float32, seed=40)
    check(gau((16, 16)), gau_reference, inputs, {"causal": True})
    assert tried == [3, 2, 1]
    assert list(triton_gau._CHOSEN.values()).count(2) == 1  # the forward's third config ran
    with torch.no_grad():
        gau((16, 16))(**inputs, causal=True)
    assert tried == [3, 2, 1, 1]  # the next call starts at the one that ran
