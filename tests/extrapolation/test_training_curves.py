"""Training curves of ``attnbench run extrapolate``: the CSV written as training goes, kept
whole by an interruption, rewritten without duplicates by a resume; TensorBoard when asked
(and one line when it is not installed); the figure."""

from __future__ import annotations

import math
import os
import signal

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.experiment.run import run_extrapolate
from attnbench.extrapolation.training import curves
from attnbench.extrapolation.training.curves import CurvePoint
from attnbench.extrapolation.training.loop import Interrupted
from attnbench.extrapolation.training.options import TrainConfig, lr_at
from tests.helpers.extrapolation import TINY, make_corpus, run_options, tiny_cfg

runner = CliRunner()
LOG_EVERY = 2
STEPS = list(range(LOG_EVERY, 13, LOG_EVERY))  # the tiny config trains 12 steps


pytestmark = pytest.mark.usefixtures("one_thread")


class Killed(Exception):
    """Stands for SIGKILL: training stops with no chance to save."""


def curve_file(out):
    return out / "checkpoints" / "curves" / "E-seed0.csv"


def read_curve(path):
    df = pd.read_csv(path)
    assert tuple(df.columns) == curves.COLUMNS
    return df


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("curves") / "c.txt")


@pytest.fixture(scope="module")
def full(corpus, tmp_path_factory):
    """One uninterrupted tiny training, logged every 2 steps."""
    out = tmp_path_factory.mktemp("full")
    run_extrapolate(tiny_cfg(corpus), run_options(out, log_every=LOG_EVERY))
    return out


def test_curves_of_an_uninterrupted_run(full):
    df = read_curve(curve_file(full))
    assert list(df["step"]) == STEPS
    assert (df["variant"] == "E").all() and (df["seed"] == 0).all()
    cfg = tiny_cfg("x").train
    assert df["lr"].tolist() == pytest.approx([lr_at(s - 1, cfg) for s in STEPS], rel=1e-5)
    assert (df["tokens_per_s"] > 0).all() and df["train_time_s"].is_monotonic_increasing
    assert df["loss"].between(0, 10).all()
    combined = read_curve(full / curves.COMBINED_NAME)
    pd.testing.assert_frame_equal(combined, df)
    # The checkpoint's history holds the same points.
    history = torch.load(full / "checkpoints" / "E-seed0.pt", weights_only=True)["history"]
    assert [h[0] for h in history] == STEPS
    assert [h[1] for h in history] == pytest.approx(df["loss"].tolist(), rel=1e-5)


def test_written_as_training_goes_and_resumed_without_duplicates(full, corpus, tmp_path):
    cfg = tiny_cfg(corpus)
    seen = {}

    def kill(label, seed, step):
        seen[step] = read_curve(curve_file(tmp_path))["step"].tolist()
        if step == 9:
            raise Killed  # after step 9: the last checkpoint is step 5's

    with pytest.raises(Killed):
        run_extrapolate(cfg, run_options(tmp_path, log_every=LOG_EVERY, on_step=kill))
    assert seen[5] == [2, 4] and seen[7] == [2, 4, 6]  # on disk while training
    assert read_curve(curve_file(tmp_path))["step"].tolist() == [2, 4, 6, 8]  # kept
    run_extrapolate(cfg, run_options(tmp_path, log_every=LOG_EVERY, resume=True))
    resumed = read_curve(curve_file(tmp_path))
    assert resumed["step"].tolist() == STEPS  # 6 and 8 logged again, once each
    # Resume is bit for bit: the same losses and learning rates as the uninterrupted run.
    reference = read_curve(curve_file(full))
    assert resumed["loss"].tolist() == reference["loss"].tolist()
    assert resumed["lr"].tolist() == reference["lr"].tolist()
    assert read_curve(tmp_path / curves.COMBINED_NAME)["step"].tolist() == STEPS


def test_ctrl_c_then_resume(corpus, tmp_path):
    cfg = tiny_cfg(corpus)

    def ctrl_c(label, seed, step):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        run_extrapolate(cfg, run_options(tmp_path, log_every=LOG_EVERY, on_step=ctrl_c))
    assert read_curve(curve_file(tmp_path))["step"].tolist() == [2, 4, 6]
    run_extrapolate(cfg, run_options(tmp_path, log_every=LOG_EVERY, resume=True))
    assert read_curve(curve_file(tmp_path))["step"].tolist() == STEPS


def test_a_finished_checkpoint_gets_its_curve_back_from_history(full, corpus, tmp_path):
    """--resume (a run that may train) writes the lost curve back beside the checkpoint;
    --eval-only writes nothing into the checkpoint folder: the curve goes to <out>/curves/."""
    before = read_curve(curve_file(full))
    curve_file(full).unlink()
    evaluation = tmp_path / "eval"
    evaluation.mkdir()
    opts = run_options(evaluation, eval_only=True, checkpoints=full / "checkpoints")
    run_extrapolate(tiny_cfg(corpus), opts)
    assert not curve_file(full).exists()
    pd.testing.assert_frame_equal(read_curve(evaluation / "curves" / "E-seed0.csv"), before)
    combined = pd.read_csv(evaluation / curves.COMBINED_NAME)
    assert combined["step"].tolist() == STEPS
    (full / curves.COMBINED_NAME).unlink()
    run_extrapolate(tiny_cfg(corpus), run_options(full, resume=True))
    pd.testing.assert_frame_equal(read_curve(curve_file(full)), before)
    assert (full / curves.COMBINED_NAME).is_file()


def test_history_of_older_checkpoints():
    cfg = TrainConfig(steps=100, warmup=10)
    old = curves.history_points([(50, 2.5), (100, 2.0)], cfg)
    assert [p.step for p in old] == [50, 100] and old[0].lr == lr_at(49, cfg)
    assert math.isnan(old[0].tokens_per_s) and math.isnan(old[1].train_time_s)
    new = curves.history_points([tuple(CurvePoint(50, 2.5, 1e-3, 100.0, 3.0))], cfg)
    assert new == [CurvePoint(50, 2.5, 1e-3, 100.0, 3.0)]


def test_history_with_and_without_the_heldout_loss():
    cfg = TrainConfig(steps=100, warmup=10)
    five = curves.history_points([(50, 2.5, 1e-3, 100.0, 3.0)], cfg)  # before the column
    assert five[0][:5] == (50, 2.5, 1e-3, 100.0, 3.0) and math.isnan(five[0].heldout_loss)
    six = curves.history_points([(50, 2.5, 1e-3, 100.0, 3.0, 2.7)], cfg)
    assert six == [CurvePoint(50, 2.5, 1e-3, 100.0, 3.0, 2.7)]


def test_heldout_loss_is_measured_and_changes_no_weight(corpus, tmp_path):
    """Every 4 steps (on the first logged step at or past each multiple) and at the last: the
    held-out probe's loss; the trained weights are bit for bit those of a run without it."""
    with_probe, without = tmp_path / "with", tmp_path / "without"
    for out, every in ((with_probe, 4), (without, 0)):
        out.mkdir()
        cfg = tiny_cfg(corpus).override({"run.heldout_every": every, "run.heldout_windows": 8})
        run_extrapolate(cfg, run_options(out, log_every=LOG_EVERY))
    df = read_curve(curve_file(with_probe))
    measured = df[df["heldout_loss"].notna()]
    assert measured["step"].tolist() == [4, 8, 12]
    assert measured["heldout_loss"].between(0, 10).all()
    assert read_curve(curve_file(without))["heldout_loss"].isna().all()
    a = torch.load(with_probe / "checkpoints" / "E-seed0.pt", weights_only=True)
    b = torch.load(without / "checkpoints" / "E-seed0.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["final_loss"] == b["final_loss"]


def test_heldout_probe_is_fixed_and_spread_over_the_stream():
    from attnbench.extrapolation.model.encoder import MASK_ID
    from attnbench.extrapolation.training.batches import HeldoutProbe

    stream = torch.arange(1000, dtype=torch.int64) % 250
    probe = HeldoutProbe.from_stream(stream, 16, 10, 0.15, 1234, every=5)
    again = HeldoutProbe.from_stream(stream, 16, 10, 0.15, 1234, every=5)
    assert torch.equal(probe.inputs, again.inputs) and torch.equal(probe.mask, again.mask)
    assert probe.inputs.shape == (10, 16) and probe.mask.any()
    assert (probe.inputs[probe.mask] == MASK_ID).all()
    firsts = probe.inputs[:, 0].masked_fill(probe.mask[:, 0], -1)
    unmasked = firsts[firsts >= 0]
    assert len(set(unmasked.tolist())) == len(unmasked)  # windows start at different places
    assert HeldoutProbe.from_stream(stream, 16, 10, 0.15, 1234, every=0) is None
    assert HeldoutProbe.from_stream(stream[:10], 16, 10, 0.15, 1234, every=5) is None
    with pytest.raises(AttnbenchError, match="heldout_every"):
        tiny_cfg("x").override({"run.heldout_every": -1}).check()


def test_heldout_probe_loss_in_slices_is_the_whole_batch_loss():
    from attnbench.extrapolation.model.encoder import build_model
    from attnbench.extrapolation.training.batches import HeldoutProbe, masked_loss

    cfg = tiny_cfg("x")
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.variant_defs["E"]).double()
    stream = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(1))
    probe = HeldoutProbe.from_stream(stream, 16, 37, 0.15, 3, every=1)
    whole = masked_loss(model, probe.inputs, probe.targets, probe.mask).item()
    for windows in (1, 5, 37, 100):
        assert probe.loss(model, torch.device("cpu"), windows) == pytest.approx(whole, rel=1e-12)


def test_heldout_probe_windows_stay_inside_a_huge_stream():
    from attnbench.extrapolation.training.batches import HeldoutProbe

    stream = torch.zeros(2**25 + 7, dtype=torch.uint8)  # float32 spacing would round past the end
    probe = HeldoutProbe.from_stream(stream, 64, 256, 0.15, 0, every=250)
    assert probe is not None and probe.inputs.shape == (256, 64)


def test_resumed_run_keeps_the_heldout_schedule(corpus, tmp_path):
    """Logged every 3 steps, probed every 4: measured at 6, 9 (first logged step past 8), 12.
    A run killed after step 9 restarts from its step-5 checkpoint, whose history has no held-out
    point yet: the multiple 4 is still due, so it measures at 6 again, then 9 and 12."""
    full_out, cut_out = tmp_path / "full", tmp_path / "cut"
    cfg = tiny_cfg(corpus).override({"run.heldout_every": 4, "run.heldout_windows": 8})
    full_out.mkdir()
    run_extrapolate(cfg, run_options(full_out, log_every=3))

    def kill(label, seed, step):
        if step == 9:
            raise Killed  # the last checkpoint is step 5's (ckpt_every 5)

    cut_out.mkdir()
    with pytest.raises(Killed):
        run_extrapolate(cfg, run_options(cut_out, log_every=3, on_step=kill))
    run_extrapolate(cfg, run_options(cut_out, log_every=3, resume=True))

    def measured(out):
        df = read_curve(curve_file(out))
        return df[df["heldout_loss"].notna()]["step"].tolist()

    assert measured(full_out) == [6, 9, 12]
    assert measured(cut_out) == [6, 9, 12]


def test_combine_keeps_curve_files_from_before_the_heldout_column(tmp_path):
    old = tmp_path / "old.csv"
    old.write_text("variant,seed,step,loss,lr,tokens_per_s,train_time_s\nO,0,50,2.5,0.001,10,1\n")
    new = tmp_path / "new.csv"
    curves.write_curve(new, "E", 0, [CurvePoint(50, 2.4, 1e-3, 10.0, 1.0, 2.6)])
    combined = read_curve(curves.combine([old, new], tmp_path / "curves.csv"))
    assert combined["variant"].tolist() == ["O", "E"]
    assert math.isnan(combined["heldout_loss"][0]) and combined["heldout_loss"][1] == 2.6


# ---------------------------------------------------------------------------------------------
# TensorBoard
# ---------------------------------------------------------------------------------------------


def test_tensorboard_not_installed_is_one_line(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(curves, "tensorboard_available", lambda: False)
    res = runner.invoke(
        app,
        ["run", "extrapolate", *TINY, "--corpus", str(corpus), "--out", str(tmp_path / "o"),
         "--tensorboard", str(tmp_path / "tb")],
    )  # fmt: skip
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output
    assert "pip install tensorboard" in lines[0]
    assert not (tmp_path / "o" / "checkpoints").exists()  # nothing trained
    with pytest.raises(AttnbenchError, match="pip install tensorboard"):
        run_extrapolate(
            tiny_cfg(corpus), run_options(tmp_path / "lib", tensorboard=tmp_path / "tb")
        )


class FakeWriter:
    """Records what SummaryWriter would be given."""

    made: list[FakeWriter] = []

    def __init__(self, log_dir, purge_step):
        self.log_dir, self.purge_step, self.scalars = log_dir, purge_step, []
        FakeWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, step, value))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_tensorboard_gets_the_curve_points(corpus, tmp_path, monkeypatch):
    FakeWriter.made = []
    monkeypatch.setattr(curves, "summary_writer", FakeWriter)
    monkeypatch.setattr(curves, "tensorboard_available", lambda: True)
    cfg = tiny_cfg(corpus)
    tb = tmp_path / "tb"

    def kill(label, seed, step):
        if step == 9:
            raise Killed

    with pytest.raises(Killed):
        run_extrapolate(
            cfg, run_options(tmp_path, log_every=LOG_EVERY, tensorboard=tb, on_step=kill)
        )
    run_extrapolate(cfg, run_options(tmp_path, log_every=LOG_EVERY, tensorboard=tb, resume=True))
    first, second = FakeWriter.made
    assert first.log_dir == second.log_dir == tb / "E-seed0"
    assert second.purge_step == 0 and second.closed  # earlier events purged, history re-logged
    loss_steps = [step for tag, step, _ in second.scalars if tag == "train/loss"]
    assert loss_steps == STEPS
    tags = {tag for tag, _, _ in second.scalars}
    assert tags == {"train/loss", "train/lr", "train/tokens_per_s"}
    curve = read_curve(curve_file(tmp_path))
    losses = [v for tag, _, v in second.scalars if tag == "train/loss"]
    assert losses == pytest.approx(curve["loss"].tolist(), rel=1e-5)


def test_real_tensorboard_writes_events(corpus, tmp_path):
    pytest.importorskip("tensorboard")
    tb = tmp_path / "tb"
    run_extrapolate(tiny_cfg(corpus), run_options(tmp_path, log_every=LOG_EVERY, tensorboard=tb))
    assert any(p.name.startswith("events.out.tfevents") for p in (tb / "E-seed0").iterdir())


# ---------------------------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------------------------


def synthetic_curves(path):
    rows = [
        {"variant": v, "seed": seed, "step": s, "loss": 5.0 / (1 + s / 100) + seed * 0.1,
         "lr": 1e-3, "tokens_per_s": 1e4, "train_time_s": s * 0.1}
        for v in ("O", "E") for seed in (0, 1) for s in range(50, 501, 50)
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_plot_curves(tmp_path):
    path = synthetic_curves(tmp_path / "curves.csv")
    assert curves.is_curves_csv(path)
    (png,) = curves.plot_curves(path)
    assert png == tmp_path / "figures" / "training_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (svg,) = curves.plot_curves(path, tmp_path / "svg", "svg")
    assert "<svg" in svg.read_text()


def test_plot_curves_bad_input(tmp_path):
    path = synthetic_curves(tmp_path / "curves.csv")
    with pytest.raises(AttnbenchError, match="accepted: png, svg"):
        curves.plot_curves(path, format="pdf")
    other = tmp_path / "results.csv"
    other.write_text("suite,mechanism\nx,softmax\n")
    assert not curves.is_curves_csv(other) and not curves.is_curves_csv(tmp_path / "none.csv")
    with pytest.raises(AttnbenchError, match="not a training-curves CSV"):
        curves.plot_curves(other)
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(curves.COLUMNS) + "\n")
    with pytest.raises(AttnbenchError, match="no logged steps"):
        curves.plot_curves(empty)


def test_curve_and_checkpoint_writes_are_whole_or_nothing(tmp_path, monkeypatch):
    """A write that fails half-way (a full disk) leaves the previous file as it was and no
    temporary file: the curve CSVs and the checkpoints alike."""
    from attnbench.extrapolation.training.checkpoints import atomic_save

    target = tmp_path / "curves" / "O-seed0.csv"
    first = [CurvePoint(2, 5.0, 1e-3, 1e4, 0.1)]
    curves.write_curve(target, "O", 0, first)
    before = target.read_bytes()

    def failing():
        yield CurvePoint(2, 5.0, 1e-3, 1e4, 0.1)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        curves.write_curve(target, "O", 0, failing())
    assert target.read_bytes() == before and os.listdir(target.parent) == [target.name]

    ckpt = tmp_path / "O-seed0.pt"
    atomic_save({"step": 1}, ckpt)

    def half_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    def half_save_then_zip_error(obj, f):  # what torch.save does: its zip writer's error on top
        try:
            half_save(obj, f)
        finally:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1")

    said = rf"^cannot write checkpoint {ckpt}: No space left on device; the one there before"
    for fake in (half_save, half_save_then_zip_error):
        monkeypatch.setattr(torch, "save", fake)
        with pytest.raises(OSError, match=said):  # one line naming the file, the old one kept
            atomic_save({"step": 2}, ckpt)
        monkeypatch.undo()
        assert torch.load(ckpt, weights_only=True) == {"step": 1}
        assert sorted(p.name for p in tmp_path.glob("*O-seed0*")) == ["O-seed0.pt"]
