"""The closing masking phase of the extrapolation model's training (``train.final_mask_prob`` for
the last ``train.final_mask_steps`` steps): off it changes nothing (not even the checkpoint key);
on, every batch before the phase is the plain run's and every batch in it holds the same windows
with a subset of the masks; a run resumed inside the phase draws what an uninterrupted one
would; the count floor counts the masks the model saw; bad values are refused naming both
settings (the cases are in test_training_options.py's bad-value test), on the command line with
exit code 2."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.extrapolation.analysis import report
from attnbench.extrapolation.evaluation import floors as baseline
from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.training.batches import TrainingBatches
from attnbench.extrapolation.training.checkpoints import load_checkpoint
from attnbench.extrapolation.training.loop import train
from attnbench.extrapolation.training.options import TrainConfig
from attnbench.runtime.tomlconfig import parse_settings
from tests.helpers.extrapolation import (
    COUNTING,
    PINNED_STREAM,
    L,
    tiny_model,
    train_key,
    whole_windows,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PHASE = {"final_mask_prob": 0.15, "final_mask_steps": 4}


def draws(cfg: TrainConfig, count: int, seed: int = 2):
    batches = TrainingBatches(COUNTING, cfg, L, seed)
    return [batches.next() for _ in range(count)]


def test_mask_rate_per_step_and_its_mean():
    cfg = TrainConfig(steps=10, mask_prob=0.4, **PHASE)
    assert [cfg.mask_prob_at(s) for s in range(10)] == [0.4] * 6 + [0.15] * 4
    assert cfg.masked_share() == pytest.approx((6 * 0.4 + 4 * 0.15) / 10)
    plain = TrainConfig(steps=10, mask_prob=0.4)
    assert {plain.mask_prob_at(s) for s in range(10)} == {0.4} and plain.masked_share() == 0.4


def test_before_the_phase_the_plain_batches_in_it_the_same_windows_with_fewer_masks():
    """Masks are uniform draws under the rate, so a lower rate keeps a subset of the same masks:
    the generator is consumed alike and later batches do not move."""
    plain = draws(TrainConfig(batch=8, steps=10, mask_prob=0.4), 10)
    phased = draws(TrainConfig(batch=8, steps=10, mask_prob=0.4, **PHASE), 10)
    for step, (a, b) in enumerate(zip(plain, phased, strict=True)):
        assert torch.equal(whole_windows(a), whole_windows(b))
        if step < 6:
            assert all(torch.equal(x, y) for x, y in zip(a[:3], b[:3], strict=True))
        else:
            assert not (b.mask & ~a.mask).any(), "a mask of the phase outside the plain run's"
            assert b.mask.float().mean() < 0.3 < a.mask.float().mean()  # 0.15 and 0.4 of 128
            assert b.targets.numel() == int(b.mask.sum())


class Killed(Exception):
    """Stands for a SIGKILL after the checkpoint of step 5."""


def test_resumed_inside_the_phase_equals_an_uninterrupted_run(tmp_path):
    """Steps 4, 5 and 6 of 7 mask at 0.15; the checkpoint of step 5 is inside the phase, so a
    resumed run that counted its batches from 0 would mask step 5 at 0.4."""
    cfg = TrainConfig(batch=4, steps=7, warmup=1, mask_prob=0.4, final_mask_prob=0.15,
                      final_mask_steps=3)  # fmt: skip

    def run(path, model, **kw):
        losses = []
        train(model, PINNED_STREAM, cfg, train_len=L, seed=3, path=path, key={}, log_every=1,
              on_log=lambda p: losses.append(p.loss), **kw)  # fmt: skip
        return model, losses

    full_model, full_losses = run(tmp_path / "full.pt", tiny_model())

    def kill(step):
        if step == 6:
            raise Killed

    with pytest.raises(Killed):
        run(tmp_path / "cut.pt", tiny_model(), ckpt_every=5, on_step=kill)
    ckpt = load_checkpoint(tmp_path / "cut.pt")
    assert ckpt["step"] == 5
    model, losses = run(tmp_path / "cut.pt", tiny_model(seed=99), resume=ckpt)
    assert losses == full_losses[5:]
    for name, weights in model.state_dict().items():
        assert torch.equal(weights, full_model.state_dict()[name]), name


def test_the_count_floor_counts_the_masks_the_model_saw():
    """The fair floor replays the training batches, phase included: its examples are the masked
    positions of every step, and the table's expected count uses the mean rate."""
    cfg = TrainConfig(batch=8, steps=10, mask_prob=0.4, **PHASE)
    floor = baseline.MaskedContextCounts.from_training(COUNTING, cfg, L, seed=2)
    assert floor.examples == sum(int(b.mask.sum()) for b in draws(cfg, 10))
    plain = baseline.MaskedContextCounts.from_training(
        COUNTING, TrainConfig(batch=8, steps=10, mask_prob=0.4), L, seed=2
    )
    assert floor.examples < plain.examples
    preset = load_preset("cpu", parse_settings(["train.final_mask_prob=0.15",
                                                "train.final_mask_steps=1200"]))  # fmt: skip
    model = report.TrainingExamples.from_config(preset)
    assert model.expected == pytest.approx(32 * 64 * (8400 * 0.4 + 1200 * 0.15))
    assert "(0.4, the last 1,200 steps 0.15)" in model.text()


def test_off_it_leaves_the_checkpoint_key_as_it_was_and_on_it_enters_it():
    plain = train_key(load_preset("cpu"))
    assert not {"final_mask_prob", "final_mask_steps"} & set(plain)
    phased = load_preset("cpu", parse_settings(["train.final_mask_prob=0.15",
                                                "train.final_mask_steps=1200"]))  # fmt: skip
    key = train_key(phased)
    assert key["final_mask_prob"] == 0.15 and key["final_mask_steps"] == 1200


def test_a_bad_phase_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    result = CliRunner().invoke(
        app,
        ["run", "extrapolate", "--set", "train.final_mask_prob=0.15", "--out", str(tmp_path)],
    )
    assert result.exit_code == 2, result.output
    assert "train.final_mask_steps = 0" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.rglob("*.pt"))
