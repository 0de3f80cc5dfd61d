"""Packed batches (:mod:`attnbench.core.varlen`): every path that runs on this CPU, on
sequences of different lengths end to end, equals its mechanism's reference run on each
sequence alone, judged against the float64 oracle; the paths' own packed entries (the softmax
references' block-diagonal mask) are held to the same; and the lengths a suite asks for."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnbench import registry
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import FACTOR_OUTPUT, judge
from attnbench.core.varlen import (
    block_diagonal,
    draw_lengths,
    offsets,
    packing_of,
    parse_varlen,
    run_packed,
    valid_varlen,
    varlen_flops,
)
from tests.helpers.cases import directions
from tests.helpers.decode_cases import SMALL

LENGTHS = (7, 1, 13, 4)  # odd, a single token, not sorted
HEADS, HEAD_DIM = 4, 16


def packed_paths() -> list:
    """(mechanism, path, causal) for every path that runs on this CPU without compiling (the
    compiled paths compile once per sequence length: their packed loop is the same loop)."""
    return [
        pytest.param(m, p, causal, id=f"{m.name}:{p.name}-{'causal' if causal else 'bidir'}")
        for m in registry.MECHANISMS
        for p in m.paths
        if not p.unavailable("cpu") and not p.compiled and "flex" not in p.name
        for causal in directions(m)
    ]


@pytest.mark.parametrize(("mech", "path", "causal"), packed_paths())
def test_packed_batch_equals_each_sequence_alone(mech, path, causal):
    params = mech.resolve({k: v for k, v in SMALL.get(mech.name, {}).items()
                           if k in mech.param_names})  # fmt: skip
    shape = mech.shape_for(Shape(1, HEADS, sum(LENGTHS), HEAD_DIM), params)
    inputs = make_inputs(mech, shape, params, seed=11)
    with torch.no_grad():
        oracle = _reference_loop(mech, inputs, params, causal, torch.float64)
        baseline = _reference_loop(mech, inputs, params, causal, torch.float32)
        packed = run_packed(mech, path, inputs, LENGTHS, causal=causal, params=params)
    terms = max(LENGTHS) * shape.head_dim
    verdict = judge("output", packed, baseline, oracle, FACTOR_OUTPUT, terms)
    assert verdict.ok, str(verdict)


def _reference_loop(mech, inputs, params, causal, dtype):
    """The reference path on each sequence alone (through the loop, which cuts every extra
    input at the sequences' boundaries), in ``dtype``."""
    cast = {k: t.to(dtype) for k, t in inputs.items()}
    looped = replace(mech.reference, varlen=None)  # the loop, not a packed entry
    return run_packed(mech, looped, cast, LENGTHS, causal=causal, params=params)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["softmax", "mqa", "gqa"])
def test_block_diagonal_reference_is_a_packed_entry(name, causal):
    mech = registry.get(name)
    assert packing_of(mech.reference) == "packed"
    params = mech.defaults
    shape = mech.shape_for(Shape(1, HEADS, sum(LENGTHS), HEAD_DIM), params)
    inputs = make_inputs(mech, shape, params, seed=2, dtype=torch.float64)
    packed = run_packed(mech, mech.reference, inputs, LENGTHS, causal=causal, params=params)
    loop = _reference_loop(mech, inputs, params, causal, torch.float64)
    torch.testing.assert_close(packed, loop, rtol=1e-12, atol=1e-12)


def test_block_diagonal_mask():
    mask = block_diagonal(offsets((2, 1, 3)), causal=False)
    assert mask.sum().item() == 4 + 1 + 9
    causal = block_diagonal(offsets((2, 1, 3)), causal=True)
    assert causal.sum().item() == 3 + 1 + 6
    assert not causal[3, 2] and causal[5, 3] and not causal[3, 5]


def test_lengths_given_or_drawn():
    assert parse_varlen([700, 300, 24]) == (700, 300, 24)
    assert parse_varlen("700, 300,24") == (700, 300, 24)
    assert parse_varlen("[5,6]") == (5, 6)
    assert parse_varlen("") is None
    drawn = parse_varlen("tokens=8192,count=8,seed=0")
    assert len(drawn) == 8 and sum(drawn) == 8192 and min(drawn) >= 1
    assert drawn == draw_lengths(8192, 8, 0)  # the same text, the same batch
    assert draw_lengths(8192, 8, 1) != drawn
    assert draw_lengths(5, 5, 3) == (1, 1, 1, 1, 1)
    for bad in ([0, 3], "a,b", "tokens=4,count=5,seed=0", [1.5], [True], {"a": 1}, 7):
        assert not valid_varlen(bad), bad


def test_flops_count_pairs_inside_each_sequence_only():
    mech = registry.get("softmax")
    shape = Shape(1, 2, 10, 8, varlen=(3, 7))
    causal = varlen_flops(mech, shape, True, {})
    per_pair = 2 * 2 * (8 + 8)  # 2 per multiply-add, heads, QK^T and PV
    assert causal == per_pair * (3 * 4 // 2 + 7 * 8 // 2)
    assert varlen_flops(mech, shape, False, {}) == per_pair * (9 + 49)
