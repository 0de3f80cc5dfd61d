"""Scalable-Softmax (Nakanishi 2025) against a literal, row-by-row computation of the formula
softmax((s_h log n_i + b_h) q_i.k_j / sqrt(d)) v, in float64: outputs, gradients (s and b
included), and the layer's initialisation."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench import registry
from attnbench.api import attention
from attnbench.core.errors import AttnbenchError
from attnbench.layers import make_layer

B, H, T, D = 2, 3, 9, 8


def literal_ssmax(q, k, v, s, b, causal):
    """Row by row: query i of head h sees n = i + 1 keys (causal) or all T, and weighs them by
    softmax over those keys of (s[h] ln(n) + b[h]) q.k / sqrt(d)."""
    heads = []
    for h in range(q.shape[1]):
        rows = []
        for i in range(q.shape[2]):
            n = i + 1 if causal else q.shape[2]
            factor = s[h] * math.log(n) + (b[h] if b is not None else 0.0)
            z = (q[:, h, i : i + 1] @ k[:, h, :n].transpose(-2, -1))[:, 0]  # (B, n)
            weights = torch.softmax(factor * z / math.sqrt(q.shape[-1]), dim=-1)
            rows.append((weights[..., None] * v[:, h, :n]).sum(-2))  # (B, Dv)
        heads.append(torch.stack(rows, 1))  # (B, T, Dv)
    return torch.stack(heads, 1)  # (B, H, T, Dv)


def inputs(bias: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = {n: torch.randn(B, H, T, D, generator=gen, dtype=torch.float64) for n in "qkv"}
    x["s"] = torch.rand(H, generator=gen, dtype=torch.float64) * 0.6 - 0.1  # one s < 0 likely
    if bias:
        x["b"] = torch.randn(H, generator=gen, dtype=torch.float64) * 0.5
    return x


CASES = [
    pytest.param(causal, bias, path, id=f"{'causal' if causal else 'bidir'}-bias{bias}-{path}")
    for causal in (False, True)
    for bias in (False, True)
    for path in ("reference", "efficient")
]


@pytest.mark.parametrize(("causal", "bias", "path"), CASES)
def test_ssmax_matches_the_formula(causal, bias, path):
    x = inputs(bias)
    got = attention("ssmax", **x, causal=causal, path=path, bias=bias)
    want = literal_ssmax(x["q"], x["k"], x["v"], x["s"], x.get("b"), causal)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("causal", "bias", "path"), CASES)
def test_ssmax_gradients_match_the_formula(causal, bias, path):
    """Every gradient, ds and db included, equals the literal formula's (autograd through the
    row loop), and passes float64 gradcheck against finite differences of the path itself."""
    x = {n: t.requires_grad_() for n, t in inputs(bias, seed=1).items()}
    upstream = torch.randn(
        B, H, T, D, generator=torch.Generator().manual_seed(2), dtype=x["q"].dtype
    )
    names = list(x)

    def run(*tensors):
        named = dict(zip(names, tensors, strict=True))
        return attention("ssmax", **named, causal=causal, path=path, bias=bias)

    got = torch.autograd.grad(run(*x.values()), list(x.values()), upstream)
    literal = literal_ssmax(x["q"], x["k"], x["v"], x["s"], x.get("b"), causal)
    want = torch.autograd.grad(literal, list(x.values()), upstream)
    for name, g, w in zip(names, got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=f"d{name}")
    assert got[names.index("s")].abs().min() > 0  # every head's s receives gradient
    small = [
        t.detach()[:1, :, :5].clone().requires_grad_() if t.dim() == 4 else t for t in x.values()
    ]
    assert torch.autograd.gradcheck(run, tuple(small))


def test_ssmax_at_one_over_log_n_is_plain_softmax():
    """Bidirectional, s = 1/ln(T): the factor s ln T is 1, so SSMax is softmax(q.k / sqrt(d))."""
    x = inputs(False, seed=3)
    x["s"] = torch.full((H,), 1 / math.log(T), dtype=torch.float64)
    plain = attention("softmax", x["q"], x["k"], x["v"])
    torch.testing.assert_close(attention("ssmax", **x), plain, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("bias", [False, True])
def test_layer_starts_as_softmax_at_its_training_length(bias):
    """make_layer(max_len=L) starts every head at s = 1/ln L (and b = 0): at T = L, bidirectional,
    it computes what a softmax layer with the same projections does; at 2L it is sharper by
    ln(2L)/ln(L), so the two differ. A training step gives s a gradient."""
    torch.manual_seed(0)
    L = 16
    layer = make_layer("ssmax", 32, 4, max_len=L, params={"bias": bias}).double()
    torch.testing.assert_close(layer.extras["s"], torch.full((4,), 1 / math.log(L)).double())
    assert ("b" in layer.extras) == bias
    if bias:
        assert (layer.extras["b"] == 0).all()
    plain = make_layer("softmax", 32, 4, max_len=L).double()
    plain.load_state_dict(
        {k: v for k, v in layer.state_dict().items() if not k.startswith("extras")}
    )
    x = torch.randn(2, L, 32, dtype=torch.float64)
    # s is a float32 parameter: 1/ln L rounded to float32 moves the output by ~1e-9
    torch.testing.assert_close(layer(x), plain(x), rtol=0, atol=1e-7)
    longer = torch.randn(2, 2 * L, 32, dtype=torch.float64)
    assert (layer(longer) - plain(longer)).abs().max() > 1e-3
    layer(x).square().mean().backward()
    assert layer.extras["s"].grad.abs().min() > 0


def test_layer_needs_a_length_with_a_nonzero_log():
    with pytest.raises(AttnbenchError, match="max_len=1"):
        make_layer("ssmax", 32, 4, max_len=1)


def test_registered_with_its_source():
    mech = registry.get("scalable-softmax")
    assert mech.name == "ssmax" and mech.causal and mech.bidirectional and mech.backward
    assert mech.sources[0].link == "https://arxiv.org/abs/2501.19399"
