"""The extrapolation table's paired contrasts, count-row text and figure panels (issue 32), on
small synthetic rows: nothing is trained."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import colours, figures, report
from attnbench.extrapolation.evaluation.evaluate import EvalStream
from attnbench.extrapolation.experiment import results
from attnbench.extrapolation.experiment.config import load_preset

SEEDS = (0, 1, 2)
LENGTHS = (64, 128)
#: Accuracy (%) per (variant, seed, length): O, its eval-time O+logn, a trained E.
ACCURACY = {
    ("O", 0, 64): 60.0, ("O", 1, 64): 61.0, ("O", 2, 64): 59.5,
    ("O", 0, 128): 50.0, ("O", 1, 128): 52.0, ("O", 2, 128): 47.0,
    ("O+logn", 0, 64): 60.0, ("O+logn", 1, 64): 61.0, ("O+logn", 2, 64): 59.5,
    ("O+logn", 0, 128): 55.0, ("O+logn", 1, 128): 56.5, ("O+logn", 2, 128): 53.0,
    ("E", 0, 64): 60.1, ("E", 1, 64): 60.7, ("E", 2, 64): 60.0,
    ("E", 0, 128): 56.0, ("E", 1, 128): 56.0, ("E", 2, 128): 54.5,
}  # fmt: skip
KINDS = {"O": "trained", "O+logn": "eval-time", "E": "trained"}
OLD_NOTE = "no model: the byte most often seen between the same +-3 visible bytes"
FAIR_NOTE = "no model: the byte most often seen with the same +-3 neighbours as the model sees"


def model_rows() -> list[dict]:
    return [
        {"variant": v, "kind": KINDS[v], "seed": s, "train_len": 64, "eval_len": n,
         "accuracy": a, "status": "ok", "note": "", "train_time_s": 60.0, "train_steps": 3000}
        for (v, s, n), a in ACCURACY.items()
    ]  # fmt: skip


def count_rows(label: str, note: str, built_from: int | None) -> list[dict]:
    rows = []
    for n, accuracy in zip(LENGTHS, (54.0, 55.0), strict=True):
        row = {"variant": label, "kind": "baseline", "seed": None, "train_len": 64,
               "eval_len": n, "accuracy": accuracy, "status": "ok", "note": note}  # fmt: skip
        if built_from is not None:
            row["built_from"] = built_from
        rows.append(row)
    return rows


def new_rows() -> list[dict]:
    """A run with both count rows and ``built_from`` (the fair floor first)."""
    return (
        model_rows()
        + count_rows("count-baseline", FAIR_NOTE, 1_843_197)
        + count_rows("count-backoff", OLD_NOTE + " (old rule)", 5_000_000)
    )


def old_rows() -> list[dict]:
    """A CSV from before the fair floor: one ``count-baseline`` (the old rule), no built_from."""
    return model_rows() + count_rows("count-baseline", OLD_NOTE, None)


def plain_paired(values: list[float]) -> tuple[float, float, float, float]:
    """Mean, 95 % t-interval and two-sided p of three values, by the df = 2 closed forms:
    CDF 1/2 + t / (2 sqrt(2 + t^2)), quantile (2p - 1) / sqrt(2 p (1 - p))."""
    k = len(values)
    assert k == 3
    mean = math.fsum(values) / k
    se = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (k - 1)) / math.sqrt(k)
    t = abs(mean) / se
    p = 2.0 * (0.5 - t / (2.0 * math.sqrt(2.0 + t * t)))
    q = (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025)
    return mean, mean - q * se, mean + q * se, p


def test_seed_differences_pair_any_two_rows_by_seed():
    rows = model_rows()
    rows[0] = dict(rows[0], status="error", accuracy=float("nan"))  # O seed 0 at 64 failed
    pairs = report.seed_differences(rows, "E", "O+logn")
    assert len(pairs) == 6  # O's failure does not touch this pair
    at128 = pairs[pairs["eval_len"] == 128].set_index("seed")["diff"]
    assert at128.to_dict() == pytest.approx({0: 1.0, 1: -0.5, 2: 1.5})
    against_o = report.seed_differences(rows, "E", "O")
    assert sorted(against_o[against_o["eval_len"] == 64]["seed"]) == [1, 2]  # seed 0 unpaired
    assert report.seed_differences(rows, "E", "missing").empty
    with pytest.raises(AttnbenchError, match="two rows"):
        report.seed_differences(rows + [rows[5]], "E", "O")


def test_contrast_matches_a_plain_paired_t_test():
    """E − (O+logn) at each length: mean, interval and p as the closed forms give them, and the
    sign count."""
    frame = report.contrast(model_rows(), "E", "O+logn").set_index("eval_len")
    for n in LENGTHS:
        diffs = [ACCURACY[("E", s, n)] - ACCURACY[("O+logn", s, n)] for s in SEEDS]
        mean, low, high, p = plain_paired(diffs)
        got = frame.loc[n]
        assert (got["mean"], got["low"], got["high"]) == pytest.approx((mean, low, high))
        assert got["p"] == pytest.approx(p, rel=1e-9)
        assert (got["positive"], got["negative"]) == (
            sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        )  # fmt: skip
        assert got["count"] == 3 and got["base"] == "O+logn"


def test_difference_section_has_the_contrast_and_says_what_is_pre_specified():
    text = report.differences_markdown(new_rows(), LENGTHS)
    assert "E − O is the pre-specified contrast; every other cell is descriptive" in text
    assert "no multiple-comparison correction applied" in text
    assert "2/2^3 = 0.25" in text  # the sign count cannot be a test with 3 seeds
    assert "| E | " in text and "3/3 seeds positive" in text
    assert "count-baseline" not in text and "count-backoff" not in text  # no seed to pair
    contrast_row = next(line for line in text.splitlines() if line.startswith("| E − (O+logn)"))
    assert "2/3 seeds positive" in contrast_row  # n = 128: +1.0, -0.5, +1.5
    assert text.index("Difference to O") < text.index("| E − (O+logn)")
    without = report.differences_markdown(
        [r for r in new_rows() if r["variant"] != "O+logn"], LENGTHS
    )
    assert "E − (O+logn)" not in without and "Other contrasts" not in without


def test_shape_check_at_the_training_length_is_an_equivalence_test():
    lines = report.shape_checks(model_rows())
    assert len(lines) == 2  # the checks at n = 64 and 128, the lengths of these rows
    assert "|E − O| ≤ 1.5 at n = 64" in lines[0] and "equal" not in lines[0]
    assert "TOST p" in lines[0] and ("equivalent within ±1.5" in lines[0])
    assert "seeds positive" in lines[0] or "seeds negative" in lines[0]
    wide = model_rows()
    for r in wide:
        if r["variant"] == "E" and r["eval_len"] == 64:
            r["accuracy"] += {0: 4.0, 1: -3.0, 2: 0.5}[r["seed"]]
    assert "not shown equivalent within ±1.5" in report.shape_checks(wide)[0]


def test_training_examples_expected():
    model = report.TrainingExamples.from_config(load_preset("cpu"))
    cfg = load_preset("cpu")
    assert model.expected == pytest.approx(
        cfg.train.steps * cfg.train.batch * cfg.model.train_len * cfg.train.mask_prob
    )
    assert report.TrainingExamples(3000, 64, 64, 0.15).expected == pytest.approx(1_843_200.0)
    assert (
        "1,843,200 masked examples (expected)" in report.TrainingExamples(3000, 64, 64, 0.15).text()
    )


def test_count_rows_text_with_and_without_built_from():
    model = report.TrainingExamples(3000, 64, 64, 0.15)
    new = "\n".join(report.count_rows_markdown(new_rows(), model))
    assert f"- `count-baseline`: {FAIR_NOTE}; built from 1,843,197 examples." in new
    assert f"- `count-backoff`: {OLD_NOTE} (old rule); built from 5,000,000 examples." in new
    assert "1,843,200 masked examples (expected)" in new
    assert "read every model row against `count-baseline`" in new
    old = "\n".join(report.count_rows_markdown(old_rows(), model))
    assert f"- `count-baseline`: {OLD_NOTE}; examples counted: not recorded" in old
    assert "count-backoff" not in old
    only_backoff = [r for r in new_rows() if r["variant"] != "count-baseline"]
    text = "\n".join(report.count_rows_markdown(only_backoff))
    assert "count-backoff" in text and "read every model row" not in text
    assert "expected" not in text  # no model numbers given
    assert report.count_rows_markdown(model_rows()) == []


def test_csv_round_trip_keeps_built_from_and_reads_old_csvs(tmp_path):
    path = tmp_path / "extrapolate.csv"
    report.write_csv(new_rows(), path)
    back = pd.read_csv(path)
    added = report.ADDED_COLUMNS
    assert list(back.columns)[-len(added) :] == added and added[0] == "built_from"
    assert back[back["kind"] != "baseline"]["built_from"].isna().all()  # empty for models
    text = "\n".join(report.count_rows_markdown(back.to_dict("records")))
    assert "built from 1,843,197 examples" in text
    old_path = tmp_path / "old" / "extrapolate.csv"
    old_path.parent.mkdir()
    report.write_csv(old_rows(), old_path)
    pd.read_csv(old_path).drop(columns="built_from").to_csv(old_path, index=False)
    old = pd.read_csv(old_path).to_dict("records")
    assert "not recorded" in "\n".join(report.count_rows_markdown(old))
    assert figures.is_table_csv(old_path)
    assert figures.figure_from_csv(old_path).is_file()


def test_table_from_three_seeds_has_every_new_section():
    """The whole table.md as a run writes it, from synthetic rows (3 seeds) and a tiny span."""
    cfg = load_preset("cpu")
    stream = EvalStream(torch.zeros(256, dtype=torch.uint8), torch.rand(256) < 0.15, 128,
                        (0, 128), ("a.txt", "b.txt"))  # fmt: skip
    rows = new_rows()
    summary = report.summarise(rows)
    table = results._table_markdown(cfg, rows, summary, list(LENGTHS), "title", "cmd", stream)
    order = [
        "| count-backoff | baseline |",
        f"- `count-baseline`: {FAIR_NOTE}",
        "masked examples (expected)",
        "Difference to O",
        "E − O is the pre-specified contrast",
        "| E − (O+logn) |",
        "|E − O| ≤ 1.5 at n = 64",
    ]
    at = [table.index(s) for s in order]
    assert at == sorted(at)
    assert "equal at the training length" not in table


def test_panel_titles_name_only_rows_drawn():
    summary = report.summarise(new_rows())
    panels = figures.figure_panels(summary, 64)
    assert [p.variants for p in panels] == [("O", "E"), ("O", "E", "O+logn")]
    assert panels[0].title == "trained at L = 64: O, E"
    assert "O+logn" in panels[1].title and "for reference O, E" in panels[1].title
    rows = [
        dict(r, status="error", accuracy=float("nan")) if r["variant"] == "E" else r
        for r in new_rows()
    ]
    failed = figures.figure_panels(report.summarise(rows), 64)
    assert failed[0].variants == ("O",) and failed[0].title == "trained at L = 64: O"
    assert "E" not in failed[1].title and "E" not in failed[1].variants
    alone = [r for r in new_rows() if r["kind"] != "eval-time"]
    assert len(figures.figure_panels(report.summarise(alone), 64)) == 1


def test_figure_draws_the_floor_and_a_fainter_backoff(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: drawn.append(fig))
    rows = new_rows() + count_rows("count-eval-masks", FAIR_NOTE, 1_843_197)
    figures.figure(report.summarise(rows), LENGTHS, 64, tmp_path / "f.png", "t")
    (fig,) = drawn
    for ax, panel in zip(fig.axes, figures.figure_panels(report.summarise(rows), 64),
                         strict=True):  # fmt: skip
        assert ax.get_title() == panel.title
        lines = {line.get_label(): line for line in ax.get_lines()}
        floor = lines["count-baseline (no model: the floor, training-rate masks)"]
        backoff = lines["count-backoff (no model, the old back-off rule)"]
        strict = lines["count-eval-masks (no model: the floor, evaluation-rate masks)"]
        assert floor.get_linestyle() == "-." and backoff.get_linestyle() == "--"
        assert strict.get_linestyle() == "-" and strict.get_color() == "black"
        assert not strict.get_marker() or strict.get_marker() == "None"
        assert backoff.get_alpha() < (floor.get_alpha() or 1.0)


def test_the_causal_floor_is_labelled_as_a_table_of_the_previous_bytes(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: drawn.append(fig))
    figures.figure(report.summarise(new_rows()), LENGTHS, 64, tmp_path / "f.png", "t",
                   published=False, causal=True)  # fmt: skip
    labels = {line.get_label() for ax in drawn[0].axes for line in ax.get_lines()}
    assert "count-baseline (no model: the causal floor, previous bytes)" in labels
    assert not any("masks" in label for label in labels)


@pytest.mark.parametrize("rows", [3, figures.LEGEND_INSIDE + 1])
def test_a_panel_with_many_rows_puts_its_legend_beside_it(rows):
    """Up to LEGEND_INSIDE entries the legend sits inside the panel; beyond that (a table with
    every evaluation-time row has 20) it goes beside the axes, where it covers no curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    for i in range(rows):
        ax.plot([64, 128], [i, i + 1], label=f"row {i}")
    figures.length_axis(ax, [64, 128], 64, "panel")
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    axes = ax.get_window_extent()
    beside = legend.x0 >= axes.x1
    plt.close(fig)
    assert beside == (rows > figures.LEGEND_INSIDE)


def test_every_variant_of_a_long_table_has_its_own_colour():
    """22 rows (a causal run: five trained encodings and sixteen evaluation-time rows): no two
    share a colour, and the trained rows take the first, strongest shades."""
    import matplotlib.pyplot as plt

    kinds = {f"O+trick{i}": "eval-time" for i in range(16)}
    kinds = {"O": "trained", **kinds, "E": "trained", "ALiBi": "trained", "T5": "trained",
             "NoPE": "trained", "count-baseline": "baseline"}  # fmt: skip
    colour = colours.variant_colours(kinds, plt)
    assert len(set(colour.values())) == len(kinds)
    strong = plt.get_cmap("tab20").colors[0::2]
    assert [colour[v] for v in ("O", "E", "ALiBi", "T5", "NoPE")] == list(strong[:5])
