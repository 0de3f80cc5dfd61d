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

from attnbench import registry
from attnbench.core.spec import Mechanism

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
