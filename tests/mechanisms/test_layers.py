"""Every mechanism as a token-mixing layer: x [B, T, C] -> [B, T, C], trainable."""

from __future__ import annotations

import pytest
import torch

from attnbench import registry
from attnbench.layers import Rotary, make_layer


@pytest.mark.parametrize("mech", registry.MECHANISMS, ids=registry.names())
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_layer_forward_backward(mech, causal):
    if (causal and not mech.causal) or (not causal and not mech.bidirectional):
        pytest.skip(f"{mech.name} has no {'causal' if causal else 'bidirectional'} form")
    torch.manual_seed(0)
    layer = make_layer(mech, d_model=64, heads=4, causal=causal, rope=Rotary(16), max_len=32)
    x = torch.randn(2, 32, 64, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    y.square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    trained = [p for p in layer.parameters() if p.grad is not None]
    assert trained and all(torch.isfinite(p.grad).all() for p in trained)


def test_layer_rejects_a_path_it_does_not_have():
    with pytest.raises(ValueError, match="has no path"):
        make_layer("softmax", 32, 4, path="fused")
