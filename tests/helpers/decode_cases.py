"""Decode and packed-batch cases built from the registry: a mechanism with a decode form, or a
path, is tested by being registered.

The parameters below are not special cases of the code under test: they shrink windows, strides
and chunks so that short test sequences (tens of tokens) cross every boundary the patterns have
(a window edge, a chunk end, a segment), and add the variants whose decode arithmetic differs
(a normalisation, a scoring). A mechanism not named here is tested with its defaults.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnbench import registry
from attnbench.core.decode import DecodePath, decode_outputs
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Mechanism, Shape
from attnbench.core.testing import FACTOR_OUTPUT, judge

#: Parameters that make the patterns' boundaries fall inside a few tens of tokens.
SMALL: dict[str, dict[str, Any]] = {
    "local": {"window": 5},
    "atrous": {"r": 3},
    "sparse": {"window": 3, "r": 4},
    "strided": {"s": 4},
    "fixed": {"s": 6, "c": 2},
    "longnet": {"segments": "8:1,16:2,32:4"},
    "bigbird": {"block": 4},
    "aft-local": {"s": 5},
    "flash": {"chunk": 8},
    "mc-softmax": {"chunk": 8},
    "flash-tiled": {"tile": 16},
    "linear": {"chunk": 8},
    "retention": {"chunk": 8},
    "aft-full": {"chunk": 8},
}

#: (tokens in the prompt n, the tokens fed after it, step by step): one step of several new
#: queries; single tokens from an odd prompt; the whole sequence decoded from an empty state.
SCHEDULES = [(37, [4]), (30, [1] * 11), (0, [1] * 12 + [5])]

#: More settings whose decode arithmetic differs from the default's.
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "retention": [{"normalize": "rownorm"}],
    "linear": [{"normalize": False}, {"feature_map": "relu"}],
    "gau": [{"scoring": "softmax"}, {"scoring": "softmax_plus", "min_n": 4}, {"norm": "n2"}],
    "flash": [{"norm": "n2"}],
    "aft-full": [{"factorized": True, "rank": 8}],
    "ssmax": [{"bias": True}],
    "softmax-logn": [{"clip": True, "min_n": 8, "base": 16.0}],
    "gqa": [{"kv_heads": 1}],
}


def settings(mech: Mechanism) -> list[dict[str, Any]]:
    """The parameter settings ``mech`` is tested with: its small defaults, then its variants."""
    base = {k: v for k, v in SMALL.get(mech.name, {}).items() if k in mech.param_names}
    return [base] + [{**base, **extra} for extra in VARIANTS.get(mech.name, [])]


def setting_id(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(params.items())) or "defaults"


def decode_forms() -> list:
    """(mechanism, decode form, params) for every decode form that runs on this CPU."""
    return [
        pytest.param(m, p, params, id=f"{m.name}:{p.name}[{setting_id(params)}]")
        for m in registry.MECHANISMS
        for p in m.decode
        if not p.unavailable("cpu")
        for params in settings(m)
    ]


def check_decode(
    mech: Mechanism,
    form: DecodePath,
    params: dict[str, Any],
    n: int,
    steps: list[int],
    dtype: torch.dtype,
    shape: tuple[int, int, int] = (2, 4, 16),
) -> None:
    """The decode contract for one case: ``form`` prefills the first n tokens and feeds
    ``steps``; its outputs equal rows n .. of ``mech``'s dense causal reference over all the
    tokens, judged against the float64 oracle by the project's rule. ``shape``: (batch, query
    heads, head dim)."""
    total = n + sum(steps)
    resolved = mech.resolve(params)
    batch, heads, head_dim = shape
    full = mech.shape_for(Shape(batch, heads, total, head_dim), resolved)
    inputs = make_inputs(mech, full, resolved, dtype=dtype, seed=total)
    with torch.no_grad():
        oracle = mech.reference(**{k: t.double() for k, t in inputs.items()},
                                causal=True, **resolved)[:, :, n:]  # fmt: skip
        baseline = mech.reference(**inputs, causal=True, **resolved)[:, :, n:]
        decoded, state = decode_outputs(mech, form, inputs, resolved, n, steps)
    assert decoded.shape == oracle.shape
    assert decoded.dtype == dtype
    assert state.length == total
    verdict = judge("output", decoded, baseline, oracle, FACTOR_OUTPUT, total * full.head_dim)
    assert verdict.ok, str(verdict)
