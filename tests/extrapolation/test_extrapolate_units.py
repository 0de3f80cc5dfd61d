"""An extrapolation run's units: trainings as Ray tasks, shards of the trainings then one
evaluation, --list-units, bad input (CPU only, tiny configs)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.experiment.run import RunOptions, run_extrapolate
from tests.helpers.extrapolation import TINY, make_corpus, run_options, tiny_cfg

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


def scores(result):
    return [(r["variant"], r["kind"], r["seed"], r["eval_len"], f"{r['accuracy']:.1f}")
            for r in result.rows]  # fmt: skip


def weights(folder, name):
    return torch.load(folder / "checkpoints" / name, weights_only=True)["model"]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """Two variants x two seeds, trained and evaluated in one process, one after the other."""
    root = tmp_path_factory.mktemp("units")
    corpus = make_corpus(root / "c.txt")
    cfg = tiny_cfg(corpus).override({"variants": "O,E", "seeds": 2, "eval_time": "logn"})
    single = run_extrapolate(cfg, run_options(root / "single"))
    return root, cfg, single


def test_ray_trainings_equal_one_process(setting, tmp_path):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    root, cfg, single = setting
    said = []
    opts = RunOptions(out=tmp_path / "ray", log=said.append, argv=["attnbench"], executor="ray")
    try:
        result = run_extrapolate(cfg, opts)
    finally:
        ray.shutdown()
    assert any("4 done, 0 running, 0 failed of 4" in line for line in said), said
    assert scores(result) == scores(single)  # the same accuracies to the printed digit
    for name in ("O-seed0.pt", "E-seed1.pt"):
        a, b = weights(tmp_path / "ray", name), weights(root / "single", name)
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_shards_train_their_share_then_one_evaluation(setting, tmp_path):
    root, cfg, single = setting
    ckpts = tmp_path / "shared"
    for i in (0, 1):
        run_extrapolate(cfg, run_options(tmp_path / f"shard{i}", checkpoints=ckpts, shard=(i, 2),
                                   train_only=True))  # fmt: skip
    # shard 0 trained units 0 and 2 (O of seeds 0 and 1), shard 1 units 1 and 3 (E)
    assert sorted(p.name for p in ckpts.glob("*.pt")) == [
        "E-seed0.pt", "E-seed1.pt", "O-seed0.pt", "O-seed1.pt",
    ]  # fmt: skip
    assert not (tmp_path / "shard0/extrapolate.csv").exists()
    result = run_extrapolate(
        cfg, run_options(tmp_path / "final", checkpoints=ckpts, eval_only=True)
    )
    assert scores(result) == scores(single)
    before = {p.name: p.stat().st_mtime_ns for p in ckpts.glob("*.pt")}
    said = []
    run_extrapolate(cfg, RunOptions(out=tmp_path / "shard0", checkpoints=ckpts, shard=(0, 2),
                                    train_only=True, resume=True, log=said.append,
                                    argv=["attnbench"]))  # fmt: skip
    # both of its checkpoints are finished: nothing is trained or written again
    assert {p.name: p.stat().st_mtime_ns for p in ckpts.glob("*.pt")} == before
    assert not any("trained 12 steps" in line for line in said), said
    assert sum("checkpoint" in line and "O-seed" in line for line in said) == 2, said


def test_list_units_and_bad_input(tmp_path):
    corpus = make_corpus(tmp_path / "c.txt")
    base = ["run", "extrapolate", *TINY, "--corpus", str(corpus), "--out", str(tmp_path / "o"),
            "--variants", "O,E", "--seeds", "2"]  # fmt: skip
    res = runner.invoke(app, [*base, "--list-units"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)
    assert [u["id"] for u in listed] == [
        "train-O-seed0", "train-E-seed0", "train-O-seed1", "train-E-seed1", "evaluate",
    ]  # fmt: skip
    assert listed[-1]["needs"] == [u["id"] for u in listed[:-1]]
    res = runner.invoke(app, [*base, "--list-units", "--shard", "1/2"])
    assert [u["id"] for u in json.loads(res.output)] == ["train-E-seed0", "train-E-seed1",
                                                         "evaluate"]  # fmt: skip
    for args, words in (
        (["--executor", "dask"], "accepted: local, ray"),
        (["--shard", "2/2"], "accepted: I/N"),
        (["--shard", "x"], "accepted: I/N"),
        (["--ray-address", "h:1"], "needs --executor ray"),
        (["--shard", "0/2", "--eval-only"], "--eval-only (without --shard)"),
    ):
        res = runner.invoke(app, [*base, *args])
        assert res.exit_code == 2, (args, res.output)
        assert words in res.output and res.output.count("\n") == 1, res.output


def test_ray_missing_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    corpus = make_corpus(tmp_path / "c.txt")
    res = runner.invoke(app, ["run", "extrapolate", *TINY, "--corpus", str(corpus), "--out",
                              str(tmp_path / "o"), "--executor", "ray"])  # fmt: skip
    assert res.exit_code == 2 and 'pip install "attnbench[ray]"' in res.output
    with pytest.raises(AttnbenchError):
        RunOptions(out=tmp_path, executor="nope").check()


def test_a_training_whose_process_dies_is_retried_once_from_its_checkpoint(
    setting, tmp_path, monkeypatch
):
    """Two trainings at once, each in its own process; the one training E seed 0 dies on its
    first attempt and is retried in a fresh process (from the checkpoint it wrote, if any); the
    rows equal the uninterrupted run's. Dying every time fails that training alone, with a
    one-line error, and O's checkpoint is saved."""
    from attnbench.runtime.engines import FAULT_ENV

    root, cfg, single = setting
    both = cfg.override({"threads": 2, "parallel": 2, "seeds": 1})
    monkeypatch.setenv(FAULT_ENV, "crash-once:train-E-seed0")
    said = []
    result = run_extrapolate(both, RunOptions(out=tmp_path / "once", log=said.append,
                                              argv=["attnbench"]))  # fmt: skip
    assert any("a worker process died; retrying once" in line for line in said), said
    assert scores(result) == [s for s in scores(single) if s[2] in (0, None)]
    monkeypatch.setenv(FAULT_ENV, "crash:train-E-seed0")
    with pytest.raises(AttnbenchError, match="training E seed 0 died twice"):
        run_extrapolate(both, run_options(tmp_path / "always", train_only=True))
    saved = {p.name for p in (tmp_path / "always/checkpoints").glob("*.pt")}
    assert "O-seed0.pt" in saved and "E-seed0.pt" not in saved
