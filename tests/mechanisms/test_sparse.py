"""The sparse family (issue 3): each pattern against its literal definition, exact pair counts,
the efficient paths against the dense references (odd lengths, n = 1000, random parameters), rows
with no visible key, LongNet's branch weighting, peak memory at n = 4096, bad input from Python
and from the CLI, and ``attnbench show``.

The literal definitions below are written from the issue's wording, independently of
``attnbench/variants/sparse``; BigBird's random blocks are the one thing taken from the library
(its seeded table), and the table's own properties are tested separately.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnbench import registry
from attnbench.api import attention
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from attnbench.measure.memory import cpu_peak
from attnbench.variants.dense import softmax_attention
from attnbench.variants.sparse.bigbird import random_table
from tests.helpers.sparse import AT_1000, SMALL, SPARSE

SETTINGS = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------------------
# Literal definitions, from the wording
# ------------------------------------------------------------------------------------------------


def longnet_multiplicity(n: int, causal: bool, segments: list[tuple[int, int]]) -> list[list[int]]:
    """How many (segment, dilation) branches put the pair (i, j) in one dense block."""
    m = [[0] * n for _ in range(n)]
    for w, r in segments:
        for start in range(0, n, w):
            kept = [p for p in range(start, min(start + w, n)) if (p - start) % r == 0]
            for i in kept:
                for j in kept:
                    if not causal or j <= i:
                        m[i][j] += 1
    return m


def parse_segments(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in item.split(":")) for item in text.split(",")]


def literal_pattern(name: str, n: int, causal: bool, p: dict) -> torch.Tensor:
    if name == "longnet":
        mult = longnet_multiplicity(n, causal, parse_segments(p["segments"]))
        return torch.tensor(mult, dtype=torch.int64).reshape(n, n) > 0
    if name == "bigbird":
        b, g = p["block"], p["global_blocks"]
        nb, half = math.ceil(n / b), (p["window_blocks"] - 1) // 2
        table = [[x for x in row if x >= 0] for row in random_table(n, causal, p).tolist()]

    def sees(i: int, j: int) -> bool:
        if causal and j > i:
            return False
        if name == "local":  # within k positions
            return abs(i - j) <= p["window"]
        if name == "atrous":  # (i - j) a multiple of r
            return (i - j) % p["r"] == 0
        if name == "sparse":  # local ∪ atrous
            return abs(i - j) <= p["window"] or (i - j) % p["r"] == 0
        if name == "strided":  # |i - j| < s or (i - j) mod s = 0
            return abs(i - j) < p["s"] or (i - j) % p["s"] == 0
        if name == "fixed":  # floor(j/s) = floor(i/s) or (j mod s) >= s - c
            return j // p["s"] == i // p["s"] or j % p["s"] >= p["s"] - p["c"]
        if name == "bigbird":  # window of blocks, global first/last blocks, random blocks
            qb, kb = i // b, j // b
            glob = kb < g or kb >= nb - g or qb < g or qb >= nb - g
            return abs(qb - kb) <= half or glob or kb in table[qb]
        raise AssertionError(name)

    return torch.tensor([[sees(i, j) for j in range(n)] for i in range(n)], dtype=torch.bool)


def params_strategy(name: str) -> st.SearchStrategy[dict]:
    if name == "local":
        return st.fixed_dictionaries({"window": st.integers(1, 50)})
    if name == "atrous":
        return st.fixed_dictionaries({"r": st.integers(1, 50)})
    if name == "sparse":
        return st.fixed_dictionaries({"window": st.integers(1, 20), "r": st.integers(1, 30)})
    if name == "strided":
        return st.fixed_dictionaries({"s": st.integers(1, 30)})
    if name == "fixed":
        return st.integers(2, 30).flatmap(
            lambda s: st.fixed_dictionaries({"s": st.just(s), "c": st.integers(1, s - 1)})
        )
    if name == "bigbird":
        return st.fixed_dictionaries(
            {
                "block": st.integers(1, 12),
                "window_blocks": st.sampled_from([1, 3, 5]),
                "global_blocks": st.integers(0, 2),
                "random_blocks": st.integers(0, 4),
                "seed": st.integers(0, 1000),
            }
        )
    if name == "longnet":
        pair = st.tuples(st.integers(1, 40), st.integers(1, 8))
        return st.lists(pair, min_size=1, max_size=4).map(
            lambda segs: {"segments": ",".join(f"{w}:{r}" for w, r in segs)}
        )
    raise AssertionError(name)


# ------------------------------------------------------------------------------------------------
# Patterns and counts
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPARSE)
@SETTINGS
@given(data=st.data())
def test_pattern_matches_literal_definition(name, data):
    n = data.draw(st.integers(1, 40), label="n")
    causal = data.draw(st.booleans(), label="causal")
    params = data.draw(params_strategy(name), label="params")
    mech = registry.get(name)
    got = mech.pattern_matrix(n, causal, params)
    want = literal_pattern(name, n, causal, {**mech.resolve(params), **params})  # raw text wins
    assert torch.equal(got, want), (got ^ want).nonzero()[:5].tolist()


@pytest.mark.parametrize("name", SPARSE)
@SETTINGS
@given(data=st.data())
def test_pair_count_is_exact(name, data):
    n = data.draw(st.integers(1, 150), label="n")
    causal = data.draw(st.booleans(), label="causal")
    params = data.draw(params_strategy(name), label="params")
    mech = registry.get(name)
    assert mech.count_pairs(n, causal, params) == int(mech.pattern_matrix(n, causal, params).sum())


@SETTINGS
@given(
    n=st.integers(1, 300),
    causal=st.booleans(),
    params=params_strategy("bigbird"),
)
def test_bigbird_random_blocks_are_new_distinct_and_reproducible(n, causal, params):
    p = registry.get("bigbird").resolve(params)
    b, g, r = p["block"], p["global_blocks"], p["random_blocks"]
    nb, half = math.ceil(n / b), (p["window_blocks"] - 1) // 2
    table = random_table(n, causal, p)
    assert table.shape[0] == nb
    for qb, row in enumerate(table.tolist()):
        chosen = [x for x in row if x >= 0]
        if qb < g or qb >= nb - g:  # global rows see everything already
            assert chosen == []
            continue
        candidates = {
            kb
            for kb in range(nb)
            if abs(qb - kb) > half and g <= kb < nb - g and (not causal or kb < qb)
        }
        assert len(set(chosen)) == len(chosen) == min(r, len(candidates))
        assert set(chosen) <= candidates
    assert torch.equal(table, random_table(n, causal, dict(p)))


def test_bigbird_seed_changes_the_random_blocks():
    mech = registry.get("bigbird")
    tables = [random_table(512, False, mech.resolve({"block": 8, "seed": s})) for s in (0, 1)]
    assert not torch.equal(*tables)


# ------------------------------------------------------------------------------------------------
# Efficient vs reference
# ------------------------------------------------------------------------------------------------


def check_paths(name: str, params: dict, n: int, causal: bool, shape=(2, 2, 16)) -> None:
    mech = registry.get(name)
    p = mech.resolve(params)
    B, H, D = shape
    inputs = make_inputs(mech, Shape(B, H, n, D), p, dtype=torch.float32, seed=n)
    kwargs = {"causal": causal, **p}
    verdicts = compare_paths(mech.path("efficient"), mech.reference, inputs, kwargs)
    failed = [str(v) for v in verdicts if not v.ok]
    assert not failed, f"{name} {params} n={n} causal={causal}: " + "; ".join(failed)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("n", [1, 7, 97, 257])
@pytest.mark.parametrize("name", SPARSE)
def test_efficient_matches_reference_small_params(name, n, causal):
    check_paths(name, SMALL[name], n, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("name", SPARSE)
def test_efficient_matches_reference_at_1000(name, causal):
    check_paths(name, AT_1000[name], 1000, causal, shape=(1, 2, 8))


@pytest.mark.parametrize("name", SPARSE)
@settings(max_examples=8, deadline=None, derandomize=True)
@given(data=st.data())
def test_efficient_matches_reference_random_params(name, data):
    n = data.draw(st.integers(1, 70), label="n")
    causal = data.draw(st.booleans(), label="causal")
    params = data.draw(params_strategy(name), label="params")
    check_paths(name, params, n, causal, shape=(1, 2, 8))


# ------------------------------------------------------------------------------------------------
# Rows with no visible key, and LongNet's branch weighting
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("segments", ["8:2", "6:2,10:5"])
def test_longnet_rows_no_branch_keeps_are_zero_with_zero_gradient(segments, causal):
    """A query that no branch keeps sees no key: its output is 0 and it passes no gradient."""
    mech = registry.get("longnet")
    n = 37
    empty = [i for i in range(n) if all((i % w) % r for w, r in parse_segments(segments))]
    assert empty  # the case is real
    for path in ("efficient", "reference"):
        q, k, v = (t.requires_grad_() for t in make_inputs(mech, Shape(2, 2, n, 8), {}).values())
        o = attention("longnet", q, k, v, causal=causal, segments=segments, path=path)
        o.backward(torch.ones_like(o))
        assert torch.isfinite(o).all()
        assert (o[:, :, empty] == 0).all()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
        assert (q.grad[:, :, empty] == 0).all()
    check_paths("longnet", {"segments": segments}, n, causal)


def branchwise_longnet(q, k, v, causal: bool, segments: list[tuple[int, int]]) -> torch.Tensor:
    """LongNet as the paper and torchscale compute it: each branch attends densely inside its
    dilated segments, giving (o_b, lse_b) per row; rows combine by softmax over lse_b."""
    n, d = q.shape[-2], q.shape[-1]
    outs, lses = [], []
    for w, r in segments:
        o_b = torch.zeros_like(q)
        lse_b = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        for start in range(0, n, w):
            kept = torch.arange(start, min(start + w, n), r)
            s = q[..., kept, :] @ k[..., kept, :].transpose(-1, -2) / math.sqrt(d)
            if causal:
                s = s.masked_fill(kept[None, :] > kept[:, None], float("-inf"))
            o_b[..., kept, :] = torch.softmax(s, -1) @ v[..., kept, :]
            lse_b[..., kept] = torch.logsumexp(s, -1)
        outs.append(o_b)
        lses.append(lse_b)
    weights = torch.softmax(torch.stack(lses), 0).nan_to_num(0.0)  # (branches, B, H, n)
    return sum(w[..., None] * o for w, o in zip(weights, outs, strict=True))


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_longnet_combines_branches_by_their_softmax_denominators(causal):
    """Pairs covered by several branches count once per branch (weight m = softmax of s + log m),
    exactly as combining the branches by their log-sum-exp."""
    segments = [(8, 1), (8, 2), (20, 4)]
    text = ",".join(f"{w}:{r}" for w, r in segments)
    n = 29
    mech = registry.get("longnet")
    q, k, v = make_inputs(mech, Shape(1, 2, n, 8), {}, dtype=torch.float64, seed=5).values()
    want = branchwise_longnet(q, k, v, causal, segments)
    for path in ("efficient", "reference"):
        got = attention("longnet", q, k, v, causal=causal, segments=text, path=path)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # Counting each covered pair once would be a different mechanism: make sure it shows.
    mask = mech.pattern_matrix(n, causal, {"segments": text})
    assert (softmax_attention(q, k, v, mask=mask) - want).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------
# Memory at n = 4096
# ------------------------------------------------------------------------------------------------

#: Bytes allowed per computed score slot (saved probabilities, mask, one chunk of backward
#: temporaries, block padding up to 2x) and per element of q/k/v/o-sized tensors (padded copies,
#: the output, the gradients and their temporaries).
PAIR_FACTOR, IO_FACTOR = 6, 12


@pytest.mark.parametrize(
    ("name", "causal"),
    [(name, False) for name in SPARSE] + [("local", True), ("longnet", True)],
)
def test_peak_memory_at_4096_is_linear_in_keys_per_query(name, causal):
    mech = registry.get(name)
    params = mech.defaults
    B, H, n, D = 1, 1, 4096, 32
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=gen).requires_grad_() for _ in range(3))
    do = torch.randn(B, H, n, D, generator=gen)
    fn = mech.path("efficient")
    peak = cpu_peak(lambda: fn(q, k, v, causal=causal, **params).backward(do)).bytes
    keys_per_query = mech.count_pairs(n, causal, params) / n
    item = q.element_size()
    bound = B * H * n * item * (PAIR_FACTOR * keys_per_query + IO_FACTOR * 2 * D)
    assert peak <= bound, f"{name}: peak {peak / 2**20:.1f} MiB > bound {bound / 2**20:.1f} MiB"
    if name == "local":  # the dense reference's score matrix alone would not fit
        assert B * H * n * n * item > 2 * bound


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------

BAD = [
    ("local", {"window": 0}, "window=0; accepted: an integer >= 1"),
    ("local", {"window": -3}, "window=-3; accepted: an integer >= 1"),
    ("atrous", {"r": 0}, "r=0; accepted: an integer >= 1"),
    ("sparse", {"r": -1}, "r=-1; accepted: an integer >= 1"),
    ("strided", {"s": 0}, "s=0; accepted: an integer >= 1"),
    ("fixed", {"s": 8, "c": 8}, "c=8 for s=8; accepted: 1 <= c < s"),
    ("fixed", {"s": 8, "c": 12}, "c=12 for s=8; accepted: 1 <= c < s"),
    ("fixed", {"c": 0}, "c=0; accepted: an integer >= 1"),
    ("bigbird", {"block": 0}, "block=0; accepted: an integer >= 1"),
    ("bigbird", {"window_blocks": 2}, "window_blocks=2; accepted: an odd integer >= 1"),
    ("longnet", {"segments": ""}, "segments=''; accepted: a non-empty list of w:r pairs"),
    ("longnet", {"segments": []}, "segments=[]; accepted: a non-empty list of w:r pairs"),
    ("longnet", {"segments": "64:0"}, "segments='64:0'; accepted: a non-empty list of w:r"),
    ("longnet", {"segments": "0:1"}, "segments='0:1'; accepted: a non-empty list of w:r"),
    ("longnet", {"segments": "-8:1"}, "segments='-8:1'; accepted: a non-empty list of w:r"),
    ("longnet", {"segments": [(64, 1), (0, 2)]}, "accepted: a non-empty list of w:r pairs"),
    ("longnet", {"segments": "64"}, "segments='64'; accepted: a non-empty list of w:r"),
]


@pytest.mark.parametrize(("name", "params", "message"), BAD)
def test_bad_parameters_raise_one_line_value_error(name, params, message):
    q = k = v = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError) as info:
        attention(name, q, k, v, **params)
    assert isinstance(info.value, AttnbenchError)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{name}: ") and message in text


def _cli_text(value) -> str:
    if isinstance(value, list):
        return ",".join(f"{w}:{r}" for w, r in value)
    return str(value)


@pytest.mark.parametrize(
    ("name", "params", "message"), [b for b in BAD if b[1] != {"segments": []}]
)
def test_bad_parameters_exit_2_from_the_cli(name, params, message):
    args = ["show", name, "--n", "16"]
    for key, value in params.items():
        args += ["--param", f"{key}={_cli_text(value)}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert message.replace("'", "") in lines[0].replace("'", "")  # the CLI passes text
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "local", "--n", "0"], "invalid n=0; accepted: an integer >= 1"),
        (["show", "local", "--n", "500"], "--n 500 is too large to draw (at most 128)"),
        (["show", "locl"], "unknown mechanism 'locl' (did you mean 'local'"),
        (["show", "local", "--param", "k=8"], "unknown parameter of local 'k'"),
    ],
)
def test_bad_show_arguments_exit_2(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


# ------------------------------------------------------------------------------------------------
# attnbench show
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_show_draws_one_cell_per_pair(causal):
    n = 20
    args = ["show", "fixed", "--n", str(n), "--param", "s=6", "--param", "c=2"]
    result = CliRunner().invoke(app, args + (["--causal"] if causal else []))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("fixed (s=6, c=2), n=20")
    pattern = registry.get("fixed").pattern_matrix(n, causal, {"s": 6, "c": 2})
    assert f"{int(pattern.sum())} attended pairs" in lines[1]
    rows = [line[3:] for line in lines if "██" in line or "··" in line]
    assert len(rows) == n
    for i, row in enumerate(rows):
        drawn = [row[2 * j : 2 * j + 2] == "██" for j in range(n)]
        assert drawn == pattern[i].tolist(), f"row {i}: {row}"


def test_show_writes_png(tmp_path):
    out = tmp_path / "longnet.png"
    args = ["show", "longnet", "--n", "300", "--param", "segments=32:1,64:2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "██" not in result.stdout  # too large for the terminal: PNG only
