"""The mapping from extrapolation rows to registry paths (attnbench/costreport/mapping.py): it
covers every evaluation-time trick and every mechanism the extrapolation model can train (a new
trick or mechanism without an entry fails here), its entries exist in the registry, the committed
tables' rows resolve to the paths the issue names, and the two patterns it substitutes (O+local
as the local mechanism, O+chunk as LongNet with one segment) compute the same attention as
literal float64 definitions written here."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnbench import registry
from attnbench.api import attention
from attnbench.costreport.mapping import (
    EVAL_TIME,
    TRAINED,
    Context,
    Row,
    Unmapped,
    cost_of,
    mapping_lines,
)
from attnbench.extrapolation.model.tricks import TRICKS

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = (
    "results/extrapolate/cpu",
    "results/archive/extrapolate/cpu-before-swiglu",
    "results/archive/extrapolate/cpu-before-preset",
    "results/extrapolate/cpu-families",
)
#: The cpu preset: L = 64, 2 heads of 64, windows L/2.
CPU = Context(train_len=64, local_window=32, rerope_window=32, heads=2, head_dim=64)


def trainable() -> set[str]:
    """What `run extrapolate` can train: bidirectional mechanisms with a backward pass."""
    return {m.name for m in registry.MECHANISMS if m.bidirectional and m.backward}


def test_every_eval_time_trick_has_an_entry_and_no_entry_is_stale():
    assert set(TRICKS) - set(EVAL_TIME) == set(), "add the new trick to costreport EVAL_TIME"
    assert set(EVAL_TIME) - set(TRICKS) == set(), "a mapping entry for a trick that is gone"


def test_every_trainable_mechanism_has_an_entry_and_no_entry_is_stale():
    assert trainable() - set(TRAINED) == set(), "add the new mechanism to costreport TRAINED"
    assert set(TRAINED) - trainable() == set(), "a mapping entry for a mechanism that is gone"


@pytest.mark.parametrize("route", [*EVAL_TIME.values(), *TRAINED.values()], ids=str)
def test_every_route_names_a_registered_path_and_says_why(route):
    mech = registry.get(route.mechanism)
    assert route.path in mech.path_names
    assert route.reason and "\n" not in route.reason
    assert route.time_factor >= 1


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_a_trained_row_is_costed_at_the_path_the_model_runs(name):
    """A mechanism's own route names its default path: what make_layer runs for a row that
    names no path (O and E are costed at dense SDPA, named by the issue)."""
    route = TRAINED[name]
    if route.mechanism == name:
        assert route.path == registry.get(name).default_path.name


def committed_rows() -> list[Row]:
    rows = []
    for folder in COMMITTED:
        table = pd.read_csv(ROOT / folder / "extrapolate.csv", dtype=str, keep_default_na=False)
        for variant, group in table.groupby("variant", sort=False):
            first = group.iloc[0]
            rows.append(Row(str(variant), first["kind"], first["applied_to"], first["mechanism"],
                            first["path"], first["params"]))  # fmt: skip
    return rows


#: Row -> (mechanism:path, params as the speed CSV writes them, time factor, heads, head dim).
EXPECTED = {
    "O": ("softmax:efficient", "", 1.0, 2, 64),
    "E": ("softmax:efficient", "", 1.0, 2, 64),
    "O+logn": ("softmax:efficient", "", 1.0, 2, 64),
    "O+temperature": ("softmax:efficient", "", 1.0, 2, 64),
    "O+yarn": ("softmax:efficient", "", 1.0, 2, 64),
    "O+ntk": ("softmax:efficient", "", 1.0, 2, 64),
    "O+pi": ("softmax:efficient", "", 1.0, 2, 64),
    "O+ntk+logn": ("softmax:efficient", "", 1.0, 2, 64),
    "O+local": ("local:efficient", "window=32", 1.0, 2, 64),
    "O+chunk": ("longnet:efficient", "segments=((64, 1),)", 1.0, 2, 64),
    "O+rerope": ("softmax:reference", "", 2.0, 2, 64),
    "O+rerope+logn": ("softmax:reference", "", 2.0, 2, 64),
    "O+yarn-dim": ("softmax:efficient", "", 1.0, 2, 64),
    "O+rerope+logn^2": ("softmax:reference", "", 2.0, 2, 64),
    "O+rerope@48+logn": ("softmax:reference", "", 2.0, 2, 64),
    "O+rerope@63+logn": ("softmax:reference", "", 2.0, 2, 64),
    "O+leaky+logn": ("softmax:reference", "", 2.0, 2, 64),
    "O+hwfa": ("local:efficient", "window=32", 1.0, 2, 64),  # the last layer: SDPA (test below)
    "local-32": ("local:efficient", "window=32", 1.0, 2, 64),
    "aft-conv": ("aft-conv:efficient", "s=7", 1.0, 2, 64),
    "flash-32": ("flash:efficient", "chunk=32;expansion=2;norm=ns;s=128", 1.0, 1, 128),
    "gau": ("gau:efficient", "expansion=2;min_n=1;norm=ns;s=128;scoring=relu2;tile=256",
            1.0, 1, 128),
}  # fmt: skip


def test_the_committed_tables_rows_resolve_as_the_issue_names():
    seen = {}
    for row in committed_rows():
        if row.kind == "baseline":
            with pytest.raises(Unmapped, match="no attention to cost"):
                cost_of(row, CPU)
            continue
        cost = cost_of(row, CPU)
        seen[row.variant] = (cost.impl, cost.params, cost.time_factor, cost.heads, cost.head_dim)
    assert seen == EXPECTED


def test_windows_and_chunks_follow_the_run():
    wider = Context(train_len=128, local_window=16, rerope_window=64, heads=4, head_dim=32)
    local = cost_of(Row("O+local", "eval-time", "O", "softmax"), wider)
    chunk = cost_of(Row("O+chunk", "eval-time", "O", "softmax"), wider)
    assert (local.params, local.heads, local.head_dim) == ("window=16", 4, 32)
    assert chunk.params == "segments=((128, 1),)"


def test_a_row_that_names_a_path_is_costed_there():
    row = Row("linear:recurrent", "trained", "", "linear", "recurrent", '{"chunk": 64}')
    assert cost_of(row, CPU).impl == "linear:recurrent"
    assert cost_of(Row("linear", "trained", "", "linear"), CPU).impl == "linear:chunkwise"


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (Row("O+nosuch", "eval-time", "O", "softmax"), "no mapping entry for the "
         "evaluation-time trick 'nosuch'"),
        (Row("O+local+rerope", "eval-time", "O", "softmax"), "costed by different paths: local "
         "(local:efficient), rerope (softmax:reference)"),
        (Row("X", "trained", "", "nosuch"), "no mapping entry for the trained mechanism 'nosuch'"),
        (Row("L", "trained", "", "local", "", '{"window": 0}'), "invalid window=0"),
        (Row("L", "trained", "", "local", "", "window=3"), "are not JSON"),
        (Row("G+logn", "eval-time", "G", "gau"), "mapped for a softmax base"),
        (Row("count", "baseline"), "no attention to cost"),
    ],
)  # fmt: skip
def test_what_the_mapping_cannot_cost_says_why(row, words):
    with pytest.raises(Unmapped) as info:
        cost_of(row, CPU)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("variant", "impl", "factor"),
    [
        ("O+yarn-dim", "softmax:efficient", 1.0),
        ("O+logn^2", "softmax:efficient", 1.0),
        ("O+rerope+logn^2", "softmax:reference", 2.0),
        ("O+rerope@48+logn", "softmax:reference", 2.0),  # the row's window: same cost
        ("O+leaky", "softmax:reference", 2.0),
        ("O+leaky@40+logn^2", "softmax:reference", 2.0),
        ("O+yarn-temp", "softmax:efficient", 1.0),  # an older table's name of temperature
        ("O+hwfa", "local:efficient; last of 2 layers: softmax:efficient", 1.0),
    ],
)
def test_the_newer_tricks_resolve(variant, impl, factor):
    cost = cost_of(Row(variant, "eval-time", "O", "softmax"), Context(64, 32, 32, 2, 64, 2))
    assert (cost.describe(), cost.time_factor) == (impl, factor)


def test_rescaling_on_top_of_another_trick_is_named_in_the_reason():
    cost = cost_of(Row("O+rerope+logn", "eval-time", "O", "softmax"), CPU)
    assert "logn on top: rescaling" in cost.reason


def test_the_printed_mapping_has_one_line_per_entry():
    lines = mapping_lines()
    assert len(lines) == len(EVAL_TIME) + len(TRAINED)
    chunk = next(cells for cells in lines if cells[0] == "O+chunk")
    assert chunk[1:3] == ("longnet:efficient", "segments={train_len}:1")
    assert all(len(cells) == 5 and all(cells) for cells in lines)


# --------------------------------------------------------------------------------------------
# The substituted patterns compute the same attention (float64, literal definitions)
# --------------------------------------------------------------------------------------------


def literal_attention(q, k, v, visible) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over the pairs ``visible(i, j)`` allows, one loop per query."""
    B, H, n, d = q.shape
    out = torch.zeros_like(v)
    for i in range(n):
        keys = [j for j in range(n) if visible(i, j)]
        scores = q[:, :, i : i + 1] @ k[:, :, keys].transpose(-2, -1) / math.sqrt(d)
        out[:, :, i] = (torch.softmax(scores, dim=-1) @ v[:, :, keys])[:, :, 0]
    return out


@pytest.mark.parametrize("n", [40, 64, 100])
def test_chunks_of_L_are_longnet_with_one_segment_of_L(n):
    """O+chunk evaluates independent L-token chunks: query i sees key j iff i // L == j // L."""
    L = 16
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    cost = cost_of(Row("O+chunk", "eval-time", "O", "softmax"), Context(L, 8, 8, 2, 8))
    got = attention(cost.mechanism, q, k, v, path=cost.path, segments=f"{L}:1")
    want = literal_attention(q, k, v, lambda i, j: i // L == j // L)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [9, 50])
def test_the_local_trick_is_the_local_mechanism(n):
    """O+local: query i sees key j iff |i - j| <= local_window (TrickMixer's mask)."""
    w = 4
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    cost = cost_of(Row("O+local", "eval-time", "O", "softmax"), Context(8, w, 4, 2, 8))
    got = attention(cost.mechanism, q, k, v, path=cost.path, window=w)
    want = literal_attention(q, k, v, lambda i, j: abs(i - j) <= w)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
