"""Properties every mechanism must have, on every path that runs here: causality and batch
independence. Parametrised over the registry."""

from __future__ import annotations

import pytest
import torch

from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from tests.helpers.cases import mechanism_params

T, CUT = 37, 20  # positions >= CUT are changed; outputs before CUT must not move


def _per_token_inputs(mech, params) -> list[str]:
    """Names of the tensors laid out [B, H, T, ...]: q, k, v and extra inputs that are
    activations (learned parameters have no batch or token dimension to change)."""
    return ["q", "k", "v"] + [e.name for e in mech.extras_for(params) if e.role == "input"]


@pytest.mark.parametrize(("mech", "path"), mechanism_params())
def test_causality(mech, path):
    """Changing later tokens leaves earlier outputs unchanged."""
    if not mech.causal:
        pytest.skip(f"{mech.name} has no causal form")
    params = mech.defaults
    shape = mech.shape_for(Shape(2, 4, T, 16), params)
    inputs = make_inputs(mech, shape, params, dtype=torch.float64, seed=3)
    changed = dict(inputs)
    gen = torch.Generator().manual_seed(4)
    for name in _per_token_inputs(mech, params):
        t = inputs[name].clone()
        t[:, :, CUT:] = torch.randn(t[:, :, CUT:].shape, generator=gen, dtype=t.dtype) * 3
        changed[name] = t
    with torch.no_grad():
        before = path(**inputs, causal=True, **params)
        after = path(**changed, causal=True, **params)
    torch.testing.assert_close(after[:, :, :CUT], before[:, :, :CUT], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(after[:, :, CUT:], before[:, :, CUT:])


@pytest.mark.parametrize(("mech", "path"), mechanism_params())
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_batch_independence(mech, path, causal):
    """A sample's output does not depend on its batch mates."""
    if (causal and not mech.causal) or (not causal and not mech.bidirectional):
        pytest.skip(f"{mech.name} has no {'causal' if causal else 'bidirectional'} form")
    params = mech.defaults
    shape = mech.shape_for(Shape(3, 4, 29, 16), params)
    inputs = make_inputs(mech, shape, params, dtype=torch.float64, seed=5)
    changed = dict(inputs)
    gen = torch.Generator().manual_seed(6)
    for name in _per_token_inputs(mech, params):
        t = inputs[name].clone()
        t[1:] = torch.randn(t[1:].shape, generator=gen, dtype=t.dtype)
        changed[name] = t
    names = _per_token_inputs(mech, params)
    first_only = {k: (v[:1] if k in names else v) for k, v in inputs.items()}
    with torch.no_grad():
        alone = path(**first_only, causal=causal, **params)
        together = path(**changed, causal=causal, **params)
    torch.testing.assert_close(together[:1], alone, rtol=1e-10, atol=1e-12)
