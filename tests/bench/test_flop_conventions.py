"""FLOPs said three ways: the model count (fwd+bwd = 3x), flash-attention's convention (3.5x),
and a block-sparse kernel's executed count (every pair of each block its BlockMask keeps)."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest
import torch

from attnbench import registry
from attnbench.bench.results import ADDED_COLUMNS, COLUMNS, ResultsWriter, read_results
from attnbench.bench.run import run_speed
from attnbench.core.spec import Shape
from attnbench.kernels import flex
from attnbench.measure.flops import FA_FWDBWD_FACTOR, count_flops, executed_flops
from attnbench.variants import softmax
from tests.helpers.speed import tiny

pytest.importorskip("torch.nn.attention.flex_attention", reason="no FlexAttention in this torch")


def test_flash_attention_convention_is_three_and_a_half_forwards():
    mech = registry.get("softmax")
    shape = Shape(2, 3, 100, 16)
    fwd = count_flops(mech, shape, True, mech.resolve({}), "fwd")
    both = count_flops(mech, shape, True, mech.resolve({}), "fwdbwd")
    assert fwd.flops == fwd.flops_fa == 2 * 2 * 3 * (100 * 101 // 2) * (16 + 16)
    assert both.flops == 3 * fwd.flops and both.flops_fa == FA_FWDBWD_FACTOR * fwd.flops


def _blocks(rule, n: int, causal: bool, params) -> int:
    """Blocks of 128 x 128 holding at least one visible pair, counted from the dense rule."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    seen = rule(i, j, n, causal, params) if rule is not None else torch.ones(n, n, dtype=bool)
    if causal:
        seen = seen & (j <= i)
    per_side = -(-n // 128)
    padded = torch.zeros(per_side * 128, per_side * 128, dtype=torch.bool)
    padded[:n, :n] = seen
    return int(padded.view(per_side, 128, per_side, 128).any(dim=(1, 3)).sum())


@pytest.mark.parametrize(
    ("name", "params", "n", "causal"),
    [
        ("local", {"window": 64}, 300, True),
        ("local", {"window": 64}, 256, False),
        ("strided", {}, 384, True),
        ("bigbird", {}, 320, False),
    ],
    ids=lambda x: str(x),
)
def test_executed_pairs_are_whole_blocks_of_the_rule(name, params, n, causal):
    mech = registry.get(name)
    resolved = mech.resolve(params)
    pairs = flex.computed_pairs(mech.visible, n, causal, resolved, "cpu")
    assert pairs == _blocks(mech.visible, n, causal, resolved) * 128 * 128
    assert pairs >= mech.pair_count(n, causal, resolved)  # blocks hold at least what is kept


def test_dense_flex_executes_every_block():
    assert flex.computed_pairs(None, 300, False, {}, "cpu") == 9 * 128 * 128
    assert flex.computed_pairs(None, 300, True, {}, "cpu") == 6 * 128 * 128  # lower triangle


def test_executed_flops_of_a_flex_path():
    mech = registry.get("local")
    params = mech.resolve({"window": 64})
    shape = Shape(2, 3, 256, 16, value_dim=8)
    path = mech.path("flex")
    fwd = executed_flops(path, shape, True, params, "fwd", torch.device("cpu"))
    assert fwd == 2 * 2 * 3 * (3 * 128 * 128) * (16 + 8)  # blocks (0,0), (1,0), (1,1)
    both = executed_flops(path, shape, True, params, "fwdbwd", torch.device("cpu"))
    assert both == FA_FWDBWD_FACTOR * fwd
    assert executed_flops(mech.path("efficient"), shape, True, params, "fwd", "cpu") is None


def test_a_run_records_an_executed_count_and_its_rate(tmp_path):
    """Any path that declares executed FLOPs gets them in its rows (flex paths need CUDA to run,
    so a CPU path declares a count here)."""

    def counted(shape, causal, params, device):
        return 1000 * shape.seq_len

    paths = (
        softmax.MECHANISM.reference,
        replace(softmax.MECHANISM.path("efficient"), executed_flops=counted),
    )
    mech = replace(softmax.MECHANISM, name="counted", aliases=(), paths=paths)
    suite = tiny(mechanisms=("counted",), lengths=(16,), causal=(False,))
    run = run_speed(suite, tmp_path, mechanisms=[softmax.MECHANISM, mech])
    df = read_results(run.csv)
    df = df[df["mechanism"] == "counted"]
    rows = df[df["path"] == "efficient"].set_index("direction")
    assert rows.loc["fwd", "flops_executed"] == 16_000
    assert rows.loc["fwdbwd", "flops_executed"] == 56_000
    rate = rows["flops_executed"] / (rows["time_median_ms"] / 1e3)
    assert ((rows["flop_per_s_executed"] - rate).abs() <= 1e-5 * rate).all()
    assert df[df["path"] == "reference"]["flops_executed"].isna().all()


def _older_csv(tmp_path, rows: int = 2):
    """A results CSV as an attnbench before ADDED_COLUMNS wrote it."""
    path = tmp_path / "results.csv"
    writer = ResultsWriter(path)
    for i in range(rows):
        writer.write({"suite": "s", "mechanism": "softmax", "path": "efficient", "status": "ok",
                      "seq_len": 16 * (i + 1), "flops": 100, "flops_fa": 100})  # fmt: skip
    writer.close()
    with path.open(newline="") as f:
        table = list(csv.reader(f))
    keep = [i for i, name in enumerate(table[0]) if name not in ADDED_COLUMNS]
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([[row[i] for i in keep] for row in table])
    return path


def test_an_older_results_file_is_read_with_the_new_columns_empty(tmp_path):
    df = read_results(_older_csv(tmp_path))
    assert tuple(df.columns) == COLUMNS and len(df) == 2
    assert df["flops"].eq(100).all() and df["flops_fa"].isna().all()


def test_resuming_an_older_results_file_widens_its_header_first(tmp_path):
    path = _older_csv(tmp_path)
    writer = ResultsWriter(path, append=True)
    writer.write({"suite": "s", "mechanism": "softmax", "path": "efficient", "status": "ok",
                  "seq_len": 64, "flops_fa": 350})  # fmt: skip
    writer.close()
    with path.open(newline="") as f:
        assert tuple(next(csv.reader(f))) == COLUMNS
    df = read_results(path)
    assert list(df["seq_len"]) == [16, 32, 64] and list(df["flops_fa"].fillna(0)) == [0, 0, 350]
