"""Both fair floors (``count-baseline`` at the training masking rate, ``count-eval-masks`` at the
evaluation's, from as many examples), their margins in the table, the attention probe's far mass
and score spread, and ``--floors-only`` on a finished run."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import report
from attnbench.extrapolation.evaluation import floors
from attnbench.extrapolation.evaluation.evaluate import far_mass, score_std
from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.experiment.recount import recount_floors
from attnbench.extrapolation.experiment.run import run_extrapolate
from attnbench.extrapolation.training.options import TrainConfig
from tests.helpers.extrapolation import TINY, make_corpus, run_options, tiny_cfg

runner = CliRunner()


def test_far_mass_and_score_spread_against_the_formulas_in_float64():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 9, 9, dtype=torch.float64) * 3
    scores[0, 0, :, 5:] = float("-inf")  # keys nobody sees: left out of the spread
    probs = torch.softmax(scores, -1)
    far = 4
    for b, h, i in ((0, 0, 0), (1, 2, 8), (0, 1, 4)):
        row = probs[b, h, i]
        want = sum(float(row[j]) for j in range(9) if abs(i - j) >= far)
        assert far_mass(probs, far)[b, h, i].item() == pytest.approx(want, abs=1e-12)
        seen = scores[b, h, i][torch.isfinite(scores[b, h, i])]
        want_std = math.sqrt(float(((seen - seen.mean()) ** 2).mean()))  # population spread
        assert score_std(probs)[b, h, i].item() == pytest.approx(want_std, rel=1e-9)


def test_the_eval_rate_table_counts_as_many_examples_at_the_other_rate():
    text = (torch.arange(20000) * 7919 % 251).to(torch.uint8)
    cfg = TrainConfig(batch=4, steps=30, mask_prob=0.4)
    fair = floors.MaskedContextCounts.from_training(text, cfg, 16, seed=0)
    strict = floors.MaskedContextCounts.at_eval_rate(text, cfg, 16, 0, 0.15, fair.examples)
    assert strict.examples == fair.examples
    expected_steps = fair.examples / (4 * 16 * 0.15)  # about 2.7x the steps at 15 %
    assert expected_steps > 2 * cfg.steps
    # the same seed and windows, masked at 15 %: its first examples are a training batch's
    again = floors.MaskedContextCounts.from_training(
        text, TrainConfig(batch=4, steps=1, mask_prob=0.15), 16, seed=0
    )
    assert 0 < again.examples < 4 * 16 * 0.4


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny finished run of O (training masks 40 %, evaluation 15 %)."""
    tmp = tmp_path_factory.mktemp("floors")
    cfg = tiny_cfg(make_corpus(tmp / "c.txt")).override({"variants": "O"})
    result = run_extrapolate(cfg, run_options(tmp / "run"))
    return cfg, tmp / "run", result


def test_both_floors_their_margins_and_the_probe_reach_the_table(tiny_run):
    cfg, run, result = tiny_run
    assert cfg.train.mask_prob != cfg.eval_mask_prob
    df = pd.read_csv(run / "extrapolate.csv")
    counted = df[df["kind"] == "baseline"].groupby("variant")["built_from"].first()
    assert counted["count-eval-masks"] == counted["count-baseline"]  # the same example budget
    o = df[df["variant"] == "O"]
    assert o["far_mass_l0"].notna().all() and o["score_std_l0"].notna().all()
    assert (o[o["eval_len"] == 16]["far_mass_l0"] == 0).all()  # no key is L away inside L
    assert (o[o["eval_len"] == 64]["far_mass_l0"] > 0).all()
    table = (run / "table.md").read_text()
    assert "read every model row against both `count-baseline` and `count-eval-masks`" in table
    assert "| O − `count-eval-masks` |" in table and "| O − `count-baseline` |" in table
    assert "Where the attention goes" in table


def test_a_run_with_one_masking_rate_has_one_fair_floor(tmp_path):
    cfg = tiny_cfg(make_corpus(tmp_path / "c.txt")).override(
        {"variants": "O", "steps": 3, "train.mask_prob": 0.15}
    )
    result = run_extrapolate(cfg, run_options(tmp_path / "run"))
    labels = {r["variant"] for r in result.rows if r["kind"] == "baseline"}
    assert labels == {"count-baseline", "count-backoff"}


def test_floors_only_counts_the_floors_again_and_keeps_the_models(tiny_run, tmp_path):
    cfg, run, _ = tiny_run
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in run.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    before = pd.read_csv(copy / "extrapolate.csv")
    # an older run: one count row, the back-off rule under the floor's name
    old = before[before["variant"] != "count-eval-masks"].copy()
    old = old[old["variant"] != "count-baseline"]
    old.loc[old["variant"] == "count-backoff", "variant"] = "count-baseline"
    old.to_csv(copy / "extrapolate.csv", index=False)
    recount_floors(cfg, run_options(copy))
    after = pd.read_csv(copy / "extrapolate.csv")
    key = ["variant", "seed", "eval_len"]
    models = before[before["kind"] != "baseline"].set_index(key)["accuracy"]
    again = after[after["kind"] != "baseline"].set_index(key)["accuracy"]
    pd.testing.assert_series_equal(models.sort_index(), again.sort_index())
    counts = before[before["kind"] == "baseline"].set_index(["variant", "eval_len"])["accuracy"]
    recounted = after[after["kind"] == "baseline"].set_index(["variant", "eval_len"])["accuracy"]
    pd.testing.assert_series_equal(counts.sort_index(), recounted.sort_index())
    assert "floors_recounted" in json.loads((copy / "extrapolate.json").read_text())


def test_floors_only_refuses_other_options_and_a_folder_without_a_run(tiny_run, tmp_path):
    cfg, run, _ = tiny_run
    with pytest.raises(AttnbenchError, match="made with other options .*steps 12 -> 13"):
        recount_floors(cfg.override({"steps": 13}), run_options(run))
    with pytest.raises(AttnbenchError, match="has no extrapolate.csv"):
        recount_floors(cfg, run_options(tmp_path))
    result = runner.invoke(app, ["run", "extrapolate", *TINY, "--floors-only", "--resume",
                                 "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 2 and "--floors-only takes the --out folder" in result.output


def test_the_margin_table_reads_rows_against_each_floor():
    rows = [
        {"variant": "count-baseline", "kind": "baseline", "eval_len": 64, "accuracy": 60.0,
         "status": "ok", "seed": None},
        {"variant": "count-eval-masks", "kind": "baseline", "eval_len": 64, "accuracy": 62.0,
         "status": "ok", "seed": None},
    ] + [
        {"variant": "O", "kind": "trained", "eval_len": 64, "accuracy": a, "status": "ok",
         "seed": s}
        for s, a in enumerate((63.0, 64.0, 65.0))
    ]  # fmt: skip
    lines = "\n".join(report.floor_margins(rows, [64]))
    assert "| O − `count-baseline` | **+4.0" in lines
    assert "| O − `count-eval-masks` | +2.0" in lines
    assert report.floor_margins(rows[:2], [64]) == []


def test_the_cpu_preset_has_both_floors():
    cfg = load_preset("cpu")
    assert cfg.train.mask_prob == 0.4 and cfg.eval_mask_prob == 0.15


def test_a_joined_table_carries_the_probe_of_each_label(tiny_run):
    from attnbench.extrapolation.analysis.join import Run, join_runs

    _, run, _ = tiny_run
    csv = run / "extrapolate.csv"
    text = join_runs([Run("a", csv)], ["O"], [0], command="attnbench merge a=RUN")
    probe = text.split("Where the attention goes")[1]
    assert "| O [a] |" in probe
    df = pd.read_csv(csv)
    far = df[(df["variant"] == "O") & (df["eval_len"] == 64)]["far_mass_l0"].mean()
    assert f"{100 * far:.1f} (" in probe.split("| O [a] |")[1].splitlines()[0]
