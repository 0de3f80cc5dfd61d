"""The speed suite ``extrapolate-cpu`` measures like for like: the ``cpu`` extrapolation preset's
shape (read from the preset now, not copied), forward, bidirectional, float32, batch 1, at the
preset's evaluation lengths, and exactly the registry paths (with their parameters) that the
mapping gives the rows of the committed extrapolation tables, each at the shape its own sidecar
records (a table made with an earlier preset keeps its shape)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.bench.config import load_suite, params_for, select
from attnbench.bench.results import params_text
from attnbench.costreport.mapping import Context, Row, Unmapped, cost_of
from attnbench.costreport.tables import read_extrapolation
from attnbench.extrapolation.experiment.config import load_preset

ROOT = Path(__file__).resolve().parents[2]
#: The committed tables ``attnbench report`` joins with this suite (results/report/).
COMMITTED = (
    "results/extrapolate/cpu",
    "results/archive/extrapolate/cpu-before-swiglu",
    "results/archive/extrapolate/cpu-before-preset",
    "results/extrapolate/cpu-families",
)


def table_context(folder: str) -> Context:
    """The model shape and windows the table's own sidecar records, as the report reads them."""
    m = read_extrapolation(ROOT / folder).model
    return Context(m.train_len, m.local_window, m.rerope_window, m.heads, m.head_dim, m.layers)


def committed_costs() -> list:
    """The cost of every model row of the committed tables (their parts, HWFA's last layer)."""
    costs = []
    for folder in COMMITTED:
        context = table_context(folder)
        table = pd.read_csv(ROOT / folder / "extrapolate.csv", dtype=str, keep_default_na=False)
        for variant, group in table.groupby("variant", sort=False):
            first = group.iloc[0]
            row = Row(str(variant), first["kind"], first["applied_to"], first["mechanism"],
                      first["path"], first["params"])  # fmt: skip
            try:
                cost = cost_of(row, context)
            except Unmapped:
                assert row.kind == "baseline", row
                continue
            costs += [cost] + ([cost.last_layer] if cost.last_layer else [])
    return costs


def test_the_suite_is_at_the_cpu_presets_shape_and_lengths():
    suite, cfg = load_suite("extrapolate-cpu"), load_preset("cpu")
    assert suite.hidden == cfg.model.d_model
    assert suite.heads_for(cfg.model.head_dim) == cfg.model.heads
    assert cfg.model.head_dim in suite.head_dims
    assert suite.lengths == tuple(sorted(cfg.eval.lengths))
    assert (suite.batch, suite.tokens, suite.dtypes) == (1, 0, ("float32",))
    assert (suite.directions, suite.causal, suite.device) == (("fwd",), (False,), "cpu")


def test_the_suite_runs_exactly_the_mapped_paths_at_their_shapes():
    suite = load_suite("extrapolate-cpu")
    costs = committed_costs()
    wanted = {(c.mechanism, c.path, c.params) for c in costs}
    measured = {(m.name, p.name, params_text(params_for(suite, m))) for m, p in select(suite)}
    assert measured == wanted
    for cost in costs:  # every layer shape the rows run (GAU / FLASH: one head of width s)
        assert cost.head_dim in suite.head_dims
        assert suite.heads_for(cost.head_dim) == cost.heads
