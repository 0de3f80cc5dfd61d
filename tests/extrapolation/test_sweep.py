"""``attnbench run extrapolate --sweep``: every candidate's run as a unit (two at once here), the
table from their rows, each run's sidecar holding the command that makes it alone (which makes
the same numbers), the step costs side by side, and the shipped sweep files reading as the
configurations their committed runs recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.extrapolation.experiment import sweep as sweeps
from tests.helpers.extrapolation import make_corpus

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]


def tiny_sweep(folder: Path) -> Path:
    corpus = make_corpus(folder / "c.txt")
    path = folder / "tiny.toml"
    path.write_text(f"""
description = "two tiny candidates"
preset = "cpu"
base = ["model.d_model=32", "model.layers=1", "model.heads=2", "model.train_len=16",
        "train.batch=8", "train.steps=6", "train.warmup=2", "eval.lengths=16,32",
        "eval.tokens=256", "run.threads=1", "run.ckpt_every=0", "run.variants=O",
        "run.eval_time=none", "run.corpus={corpus}"]
[candidates]
plain = {{ settings = [] }}
fast = {{ settings = ["train.lr=3e-3"] }}
""")
    return path


def run(*args: str):
    result = runner.invoke(app, ["run", "extrapolate", *args])
    assert result.exit_code == 0, result.output
    return result


def test_a_sweep_trains_every_candidate_and_tabulates_them(tmp_path):
    sweep_file, out = tiny_sweep(tmp_path), tmp_path / "out"
    result = run("--sweep", str(sweep_file), "--out", str(out), "--set", "run.parallel=2")
    table = pd.read_csv(out / "sweep.csv")
    assert list(table["candidate"]) == ["plain", "fast"]
    assert list(table["overrides"]) == ["(the base)", "train.lr=3e-3"]
    for name in ("plain", "fast"):
        rows = pd.read_csv(out / "runs" / name / "extrapolate.csv")
        at_l = rows[rows["eval_len"] == 16].set_index("variant")["accuracy"]
        row = table.set_index("candidate").loc[name]
        assert row["accuracy_at_L"] == round(at_l["O"], 2)
        # both floors, each with its margin: the training rate's and the evaluation rate's
        assert row["fair_floor_at_L"] == round(at_l["count-baseline"], 2)
        assert row["eval_masks_floor_at_L"] == round(at_l["count-eval-masks"], 2)
        assert row["margin_eval_masks"] == round(at_l["O"] - at_l["count-eval-masks"], 2)
    assert "| plain | (the base) |" in result.stdout
    # each run's sidecar holds the command that makes it alone (its paths made portable), and
    # that command makes the same numbers
    recorded = json.loads((out / "runs/fast/extrapolate.json").read_text())["command"]
    assert recorded.startswith("attnbench run extrapolate --preset cpu --set model.d_model=32")
    assert "--set train.lr=3e-3" in recorded and "--set run.parallel=1" in recorded
    alone = tmp_path / "alone"
    command = sweeps.load_sweep(str(sweep_file)).command("fast", alone)
    run(*command[3:])
    assert pd.read_csv(alone / "extrapolate.csv")["accuracy"].tolist() == pd.read_csv(
        out / "runs/fast/extrapolate.csv")["accuracy"].tolist()  # fmt: skip
    # again: the checkpoints are there, so --resume (or --overwrite) is needed
    again = runner.invoke(app, ["run", "extrapolate", "--sweep", str(sweep_file), "--out",
                                str(out), "--sweep-only", "fast"])  # fmt: skip
    assert again.exit_code == 2 and "pass --resume" in again.output


def test_the_step_costs_are_timed_side_by_side(tmp_path):
    sweep_file, out = tiny_sweep(tmp_path), tmp_path / "out"
    run("--sweep", str(sweep_file), "--out", str(out), "--sweep-cost", "1x1",
        "--sweep-only", "fast")  # fmt: skip
    cost = pd.read_csv(out / sweeps.COST_NAME).set_index("candidate")
    assert list(cost.index) == ["plain", "fast"]  # the first candidate is the reference
    assert cost.loc["plain", "step_ratio"] == 1.0 and cost.loc["fast", "step_ms"] > 0
    assert (cost["rounds"] == 1).all() and not (out / "sweep.md").exists()  # nothing trained


@pytest.mark.parametrize(
    ("name", "folder"), [("cpu-preset", "preset-sweep"), ("cpu-head64", "head64-sweep")]
)
def test_the_shipped_sweeps_are_the_committed_runs_configurations(name, folder):
    """Every candidate of a shipped sweep that has a committed run reads as the config that run
    recorded (the fields recorded then)."""
    sweep = sweeps.load_sweep(name)
    runs = ROOT / "results/extrapolate" / folder / "runs"
    if not runs.is_dir():
        pytest.skip(f"the committed {name} sweep is not in this checkout")
    trained = [n for n in sweep.names if (runs / n / "extrapolate.json").exists()]
    assert len(trained) >= 6, trained
    for name in trained:
        recorded = json.loads((runs / name / "extrapolate.json").read_text())["config"]
        config = json.loads(json.dumps(sweep.config(name).plain()))
        for section in ("model", "train", "eval", "run"):
            for key, value in recorded[section].items():
                if (section, key) == ("run", "parallel"):
                    continue  # how many processes shared the run (a sweep's worker runs 1)
                assert config[section][key] == value, (name, section, key)


def test_the_compiled_sweep_times_a_compiled_step():
    assert sweeps.load_sweep("cpu-compiled").file.candidates["compiled"].compile


def test_the_step_cost_of_a_causal_candidate_times_causal_batches(tmp_path, monkeypatch):
    """A ``clm`` candidate's step is timed on next-byte batches (every position through the
    last FFN), not on the masked ones of the MLM."""
    from attnbench.extrapolation.training import batches

    seen = []

    class Recorder(batches.TrainingBatches):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self)

    monkeypatch.setattr(batches, "TrainingBatches", Recorder)
    sweep_file, out = tiny_sweep(tmp_path), tmp_path / "out"
    text = sweep_file.read_text().replace(
        '"run.variants=O"', '"run.variants=O", "model.objective=clm"'
    )
    sweep_file.write_text(text)
    run("--sweep", str(sweep_file), "--out", str(out), "--sweep-cost", "1x1",
        "--sweep-only", "fast")  # fmt: skip
    assert seen and all(b.causal for b in seen)
