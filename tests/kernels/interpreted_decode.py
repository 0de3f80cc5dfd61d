"""The Triton decode kernels (attnbench/kernels/triton_decode.py) under Triton's CPU interpreter:
every Triton decode form of the registry by the decode contract (the rows n .. n + Tq - 1 equal
the mechanism's dense causal reference over n + Tq tokens, against the float64 oracle: a step
of several tokens after an odd prompt, single tokens, the whole sequence from an empty state;
float32, float16 and bfloat16; batch 2, 4 query heads, 1 or 2 K/V heads for MQA and GQA), and
the kernels alone: the split-K softmax over several key tiles and splits (fewer, as many as
and more than the tiles; blocks of query rows), the recurrent step over several Dv tiles, and
rownorm's factors far from the start.

Not collected by default (the name does not start with ``test_``):
tests/kernels/test_triton_interpret.py runs it in a fresh process with ``TRITON_INTERPRET=1``
(see interpreted_triton.py for why). Alone: ``TRITON_INTERPRET=1 pytest
tests/kernels/interpreted_decode.py``.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
    pytest.skip("needs TRITON_INTERPRET=1 from the start", allow_module_level=True)
pytest.importorskip("triton", reason="Triton is not installed")

from attnbench import registry  # noqa: E402
from attnbench.core.decode import decode_outputs  # noqa: E402
from attnbench.core.errors import AttnbenchError  # noqa: E402
from attnbench.core.inputs import make_inputs  # noqa: E402
from attnbench.core.spec import Shape  # noqa: E402
from attnbench.kernels import decode_ops, triton_decode  # noqa: E402
from tests.helpers.decode_cases import SCHEDULES, check_decode, setting_id, settings  # noqa: E402
from tests.helpers.interpreter import interpreter_bf16_dot_ok  # noqa: E402

#: The mechanisms whose Triton forms run every schedule; the others' forms (the same kernels,
#: with a per-row factor folded into q on the host) run one step of several tokens.
EVERY_SCHEDULE = ("softmax", "gqa", "linear", "retention")


def triton_forms(only: tuple[str, ...] | None = None) -> list:
    """(mechanism, form, params) for every Triton decode form of the registry (of ``only``)."""
    return [
        pytest.param(m, p, params, id=f"{m.name}:{p.name}[{setting_id(params)}]")
        for m in registry.MECHANISMS
        if only is None or m.name in only
        for p in m.decode
        if p.name.startswith("triton")
        for params in settings(m)
    ]


def _skip_bf16_dots(form, dtype) -> None:
    """The split-K kernel's tl.dot on bf16 is wrong in Triton 3.9's interpreter (the recurrent
    step has no tl.dot: it is checked in bf16 here)."""
    if dtype == torch.bfloat16 and form.name == "triton-split" and not interpreter_bf16_dot_ok():
        pytest.skip("Triton's interpreter computes tl.dot on bf16 wrongly (checked on GPU)")


def test_every_recurrent_and_softmax_family_has_a_triton_form():
    names = {m.name for m in registry.MECHANISMS for p in m.decode if p.name.startswith("triton")}
    assert {"linear", "retention", "softmax", "mqa", "gqa"} <= names


@pytest.mark.parametrize(("n", "steps"), SCHEDULES, ids=["block", "tokens", "from-empty"])
@pytest.mark.parametrize(("mech", "form", "params"), triton_forms(EVERY_SCHEDULE))
def test_triton_decode_equals_causal_reference(mech, form, params, n, steps):
    check_decode(mech, form, params, n, steps, torch.float32)


@pytest.mark.parametrize(("mech", "form", "params"), triton_forms())
def test_triton_decode_one_block(mech, form, params):
    check_decode(mech, form, params, *SCHEDULES[0], torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize(("mech", "form", "params"), triton_forms())
def test_triton_decode_half(mech, form, params, dtype):
    _skip_bf16_dots(form, dtype)
    check_decode(mech, form, params, 29, [1, 3, 1], dtype)


@pytest.mark.parametrize(("mech", "form", "params"), triton_forms())
def test_a_repeated_step_gives_the_same_outputs(mech, form, params):
    """The benchmark steps one state again and again: the input state is left as it was."""
    resolved = mech.resolve(params)
    shape = mech.shape_for(Shape(2, 4, 23, 16), resolved)
    inputs = make_inputs(mech, shape, resolved, seed=3)
    with torch.no_grad():
        once, _ = decode_outputs(mech, form, inputs, resolved, 19, [2, 2])
        again, _ = decode_outputs(mech, form, inputs, resolved, 19, [2, 2])
    assert torch.equal(once, again)


def test_rownorm_far_from_the_start():
    """rownorm's factor (sum_{i<c} gamma^i)^(-1/2) at c ~ 3000 (1 - gamma^c without cancelling,
    in float32): the Triton step after a long prompt against the torch recurrent form in
    float64 (itself tested against the dense reference)."""
    mech = registry.get("retention")
    params = mech.resolve({"normalize": "rownorm"})
    shape = mech.shape_for(Shape(1, 8, 3003, 16), params)
    inputs = make_inputs(mech, shape, params, dtype=torch.float64, seed=1)
    with torch.no_grad():
        want, _ = decode_outputs(mech, mech.decode_path("recurrent"), inputs, params, 3000, [3])
        low = {k: t.float() for k, t in inputs.items()}
        got, _ = decode_outputs(mech, mech.decode_path("triton-recurrent"), low, params, 3000, [3])
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# The kernels alone
# --------------------------------------------------------------------------------------------


def _dense_softmax(q, keys, values, start):
    """float64 softmax(q K^T / sqrt(d)) V for new rows at start .. (bottom-right causal), each
    K/V head repeated for its group of query heads."""
    g = q.shape[1] // keys.shape[1]
    k64, v64 = (x.double().repeat_interleave(g, dim=1) for x in (keys, values))
    s = q.double() @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    rows = torch.arange(start, start + q.shape[2])[:, None]
    s = s.masked_fill(torch.arange(keys.shape[2])[None, :] > rows, float("-inf"))
    return torch.softmax(s, dim=-1) @ v64


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tq", "splits"),
    [(4, 4, 1, 1), (4, 2, 3, 2), (6, 1, 4, 3), (4, 1, 2, 9), (8, 2, 5, None)],
    ids=["one-split", "gqa-2-splits", "mqa-24-rows-3-splits", "more-splits-than-tiles",
         "gqa-default-splits"],
)  # fmt: skip
def test_split_softmax_against_dense(heads, kv_heads, tq, splits):
    """n = 45 keys in 16-key tiles (3 tiles, the last ragged), new rows at 45 - tq: split and
    combined, against dense float64 softmax."""
    gen = torch.Generator().manual_seed(heads + tq)
    q = torch.randn(2, heads, tq, 24, generator=gen)
    keys = torch.randn(2, kv_heads, 45, 24, generator=gen)
    values = torch.randn(2, kv_heads, 45, 20, generator=gen)
    start = 45 - tq
    o = decode_ops.split_softmax(q, keys, values, start=start, scale=24**-0.5, block=16,
                                 splits=splits)  # fmt: skip
    want = _dense_softmax(q, keys, values, start)
    torch.testing.assert_close(o.double(), want, rtol=1e-5, atol=1e-5)


def test_split_softmax_blocks_of_rows(monkeypatch):
    """More rows than a program holds (G Tq = 40 in blocks of 16): three row blocks."""
    monkeypatch.setitem(triton_decode.MAX_ROWS, False, 16)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 8, 5, 16, generator=gen)
    keys, values = (torch.randn(1, 1, 37, 16, generator=gen) for _ in "kv")
    o = decode_ops.split_softmax(q, keys, values, start=32, scale=0.25, block=16, splits=2)
    torch.testing.assert_close(o.double(), _dense_softmax(q, keys, values, 32), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_split_softmax_reads_a_cache_buffer_view():
    """keys and values as the first n slots of larger buffers (a cache's), strided."""
    gen = torch.Generator().manual_seed(6)
    buf_k, buf_v = (torch.randn(2, 2, 64, 16, generator=gen) for _ in "kv")
    q = torch.randn(2, 4, 1, 16, generator=gen)
    keys, values = buf_k[:, :, :33], buf_v[:, :, :33]
    o = decode_ops.split_softmax(q, keys, values, start=32, scale=0.25, block=16)
    torch.testing.assert_close(o.double(), _dense_softmax(q, keys, values, 32), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("finish", ["none", "normalize"])
def test_recurrent_step_over_value_tiles(finish):
    """Dv = 40 in 16-wide tiles (three programs a head, the last ragged; z kept by every one
    and stored by the first), D = 20: S and z after the step are their sums, o is phi(q) S."""
    gen = torch.Generator().manual_seed(7)
    b, h, d, dv, tq = 2, 3, 20, 40, 3
    assert triton_decode.step_tile(dv, b * h, "cpu") == 16
    q, k = torch.randn(b, h, tq, d, generator=gen), torch.randn(b, h, tq, d, generator=gen)
    v = torch.randn(b, h, tq, dv, generator=gen)
    width = dv + (finish != "none")
    state = torch.randn(b, h, d, width, generator=gen).abs()
    o, new = decode_ops.recurrent_step(state, q, k, v, feature_map="relu", finish=finish, eps=0.1)
    fk, fq = k.double().relu(), q.double().relu()
    vv = torch.cat((v.double(), torch.ones(b, h, tq, 1)), -1)[..., :width]
    states = state.double()[:, :, None] + (fk[..., :, None] * vv[..., None, :]).cumsum(2)
    want = (fq[..., None, :] @ states).squeeze(-2)  # (b, h, tq, w)
    if finish == "normalize":
        want = want[..., :dv] / (want[..., dv:] + 0.1)
    torch.testing.assert_close(o.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new.double(), states[:, :, -1], rtol=1e-5, atol=1e-5)


def test_refusals():
    q = torch.randn(1, 2, 1, 16)
    state = torch.zeros(1, 2, 16, 16)
    with pytest.raises(AttnbenchError, match="does not take torch.float64"):
        decode_ops.recurrent_step(state.double(), q.double(), q.double(), q.double())
    with pytest.raises(AttnbenchError, match=r"accepted: \(1, 2, 16, 17\) float32"):
        decode_ops.recurrent_step(state, q, q, q, finish="normalize")
    with pytest.raises(AttnbenchError, match="accepted: none, normalize, rownorm"):
        decode_ops.recurrent_step(state, q, q, q, finish="softmax")
    with pytest.raises(AttnbenchError, match="rownorm needs the decays"):
        decode_ops.recurrent_step(torch.zeros(1, 2, 16, 17), q, q, q, finish="rownorm")
    with pytest.raises(AttnbenchError, match=r"accepted: k as q, v \(1, 2, 1, Dv\)"):
        decode_ops.recurrent_step(state, q, q[..., :8], q)
    with pytest.raises(AttnbenchError, match=r"accepted: \(2,\) float32"):
        decode_ops.recurrent_step(state, q, q, q, ln_gamma=torch.full((3,), -0.1))
    with pytest.raises(AttnbenchError, match=r"accepted: \(2,\) float32"):
        decode_ops.recurrent_step(state, q, q, q, ln_gamma=torch.full((2,), -0.1).double())
    keys = torch.randn(1, 2, 8, 16)
    with pytest.raises(AttnbenchError, match="0 <= start <= 7"):
        decode_ops.split_softmax(q, keys, keys, start=8, scale=1.0)
    with pytest.raises(AttnbenchError, match="K/V heads dividing"):
        decode_ops.split_softmax(q, keys[:, :1].expand(1, 3, 8, 16), keys, start=7, scale=1.0)
    with pytest.raises(AttnbenchError, match="keys as wide as q"):
        decode_ops.split_softmax(q, keys[..., :8], keys, start=7, scale=1.0)
    with pytest.raises(AttnbenchError, match="power of two >= 16"):
        decode_ops.split_softmax(q, keys, keys, start=7, scale=1.0, block=24)
