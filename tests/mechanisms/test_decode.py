"""Every decode form against its mechanism's dense causal reference: the outputs of positions
n .. n + Tq - 1, decoded from the state the form's own prefill built (or from no state at all,
token by token), equal those rows of the reference over all n + Tq tokens. Every dtype against
the float64 oracle by the project's rule (:mod:`attnbench.core.testing`); odd lengths, batch
and heads > 1, K/V heads < query heads where the mechanism shares them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnbench import registry
from attnbench.core.decode import decode_outputs, no_decode_form, split_tokens
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from tests.helpers.decode_cases import SCHEDULES, check_decode, decode_forms

BATCH, HEADS, HEAD_DIM = 2, 4, 16


def extras(tensors: dict) -> dict:
    """The extra inputs among a piece of ``make_inputs``' tensors (q, k, v left out)."""
    return {name: t for name, t in tensors.items() if name not in ("q", "k", "v")}


#: Every dtype, on a mixed schedule (its prompt odd).
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def _check(mech, form, params, n, steps, dtype):
    check_decode(mech, form, params, n, steps, dtype, (BATCH, HEADS, HEAD_DIM))


@pytest.mark.parametrize(("n", "steps"), SCHEDULES, ids=["block", "tokens", "from-empty"])
@pytest.mark.parametrize(("mech", "form", "params"), decode_forms())
def test_decode_equals_causal_reference(mech, form, params, n, steps):
    _check(mech, form, params, n, steps, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(("mech", "form", "params"), decode_forms())
def test_decode_every_dtype(mech, form, params, dtype):
    _check(mech, form, params, 29, [1, 3, 1], dtype)


@pytest.mark.parametrize(("mech", "form", "params"), decode_forms())
def test_repeated_step_is_the_same_work(mech, form, params):
    """The benchmark steps one state again and again: the same outputs every time, and the
    state that step returned the first time is still right (a cache's slots are rewritten with
    the same keys)."""
    resolved = mech.resolve(params)
    shape = mech.shape_for(Shape(BATCH, HEADS, 23, HEAD_DIM), resolved)
    inputs = make_inputs(mech, shape, resolved, seed=3)
    with torch.no_grad():
        once, _ = decode_outputs(mech, form, inputs, resolved, 19, [2, 2])
        prefix, rest, shared = split_tokens(mech, resolved, inputs, 19)
        kw = {**resolved, **shared}
        state = form.start(prefix["q"], prefix["k"], prefix["v"], capacity=23,
                           **kw, **extras(prefix))  # fmt: skip
        first = {k: t[:, :, :2] for k, t in rest.items()}
        second = {k: t[:, :, 2:] for k, t in rest.items()}
        a, after = form.advance(state, first["q"], first["k"], first["v"], **kw, **extras(first))
        b, _ = form.advance(state, first["q"], first["k"], first["v"], **kw, **extras(first))
        c, _ = form.advance(after, second["q"], second["k"], second["v"], **kw,
                            **extras(second))  # fmt: skip
    assert torch.equal(a, b)
    torch.testing.assert_close(torch.cat((a, c), dim=2), once, rtol=0, atol=0)


@pytest.mark.parametrize(("mech", "form", "params"), decode_forms())
def test_traffic_is_within_the_state(mech, form, params):
    """The bytes a step is said to read are some, and no more than the state holds after the
    prompt (with room for the new tokens): the memory roofline's numerator is not inflated."""
    resolved = mech.resolve(params)
    n, tq = 40, 4
    shape = mech.shape_for(Shape(1, HEADS, n + tq, HEAD_DIM), resolved)
    inputs = make_inputs(mech, shape, resolved, seed=5)
    prefix, _, shared = split_tokens(mech, resolved, inputs, n)
    state = form.start(prefix["q"], prefix["k"], prefix["v"], capacity=n + tq,
                       **resolved, **shared, **extras(prefix))  # fmt: skip
    read, written = form.traffic(replace(shape, seq_len=n, query_len=tq), resolved, 4)
    assert 0 < read <= state.nbytes()
    assert written > 0


def test_every_mechanism_decodes_or_says_why():
    for mech in registry.MECHANISMS:
        names = [p.name for p in mech.decode]
        assert len(names) == len(set(names)), mech.name
        assert bool(mech.decode) != bool(mech.no_decode), (
            f"{mech.name}: declare its decode forms, or in no_decode why it has none"
        )
        if not mech.causal:
            assert not mech.decode, f"{mech.name} has no causal form: it cannot decode"


def test_decode_path_lookup_names_the_forms_or_the_reason():
    softmax = registry.get("softmax")
    assert softmax.decode_path("sdpa").kind == "decode"
    with pytest.raises(AttnbenchError, match="available: sdpa, plain"):
        softmax.decode_path("efficient")
    with pytest.raises(AttnbenchError, match="bigbird has no decode form: .*random blocks"):
        registry.get("bigbird").decode_path("gather")


def test_no_decode_placeholder_is_unavailable_with_the_reason():
    form = no_decode_form("no causal form")
    assert form.unavailable("cpu") == "no causal form"
    with pytest.raises(AttnbenchError, match="no causal form"):
        form.start(None, None, None)
