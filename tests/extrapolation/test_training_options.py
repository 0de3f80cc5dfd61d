"""The two training options of the extrapolation model (``TrainConfig.window_lengths``, varying
training lengths; ``TrainConfig.random_positions``, randomized positional encodings of Ruoss et
al. 2023): off they change nothing, on they draw what they say (reproducibly, resumed bit for
bit), the rotary embedding at explicit positions is the rotation by p * theta, evaluation still
uses 0..n-1, bad values are refused up front naming the setting, and both round-trip through
--set and a preset file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation.evaluate import EvalStream, evaluate
from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.experiment.run import run_extrapolate
from attnbench.extrapolation.model.encoder import MASK_ID
from attnbench.extrapolation.model.positions import EvalPositions
from attnbench.extrapolation.training.batches import (
    BatchSampler,
    TrainingBatches,
    masked_loss,
    share_loss,
)
from attnbench.extrapolation.training.checkpoints import load_checkpoint
from attnbench.extrapolation.training.distributed import shares
from attnbench.extrapolation.training.loop import train
from attnbench.extrapolation.training.options import TrainConfig, check_training_options
from attnbench.layers import AttentionMixer, Rotary
from attnbench.runtime.tomlconfig import parse_settings
from tests.helpers.extrapolation import (
    COUNTING,
    PINNED_STREAM,
    TINY,
    L,
    make_corpus,
    run_options,
    tiny_cfg,
    tiny_model,
    whole_windows,
)

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64


def run_training(cfg: TrainConfig, path: Path, model=None, **kw):
    """Train a tiny softmax model (seed 3) on the pinned stream; returns (outcome, model, the
    loss of every step)."""
    model = model if model is not None else tiny_model()
    losses = []
    outcome = train(
        model,
        PINNED_STREAM,
        cfg,
        train_len=L,
        seed=3,
        path=path,
        key={},
        ckpt_every=kw.pop("ckpt_every", 0),
        log_every=1,
        on_log=lambda p: losses.append(p.loss),
        **kw,
    )
    return outcome, model, losses


# --------------------------------------------------------------------------------------------
# Off: nothing changes
# --------------------------------------------------------------------------------------------


def test_default_batches_are_the_old_samplers():
    """With both options off, every batch is the one a BatchSampler built as before draws (and
    the first three are the ones pinned before the options existed), with no positions."""
    batches = TrainingBatches(PINNED_STREAM, TrainConfig(batch=4), L, seed=3)
    old = BatchSampler(PINNED_STREAM, L, 4, 0.15, seed=3)
    pinned = [(9842, 1768, 14), (9233, 1716, 12), (9021, 1243, 10)]
    for step in range(6):
        batch, want = batches.next(), old.next()
        assert batch.positions is None
        for got, expected in zip(batch[:3], want, strict=True):
            assert torch.equal(got, expected)
        if step < len(pinned):
            sums = (int(batch.inputs.sum()), int(batch.targets.sum()), int(batch.mask.sum()))
            assert sums == pinned[step]


def test_default_training_gives_the_losses_pinned_before_the_options(tmp_path):
    """Four steps of a tiny model: the losses computed with the code before the options."""
    cfg = TrainConfig(batch=4, steps=4, warmup=1)
    _, _, losses = run_training(cfg, tmp_path / "c.pt")
    pinned = [5.575867652893066, 5.548478603363037, 5.553333759307861, 5.538826942443848]
    assert losses == pytest.approx(pinned, rel=1e-5, abs=0)


def test_random_positions_alone_leave_windows_and_masks_as_they_were():
    """The positions have their own generator: the default run's windows and masks, step for
    step."""
    plain = TrainingBatches(COUNTING, TrainConfig(batch=4), L, seed=1)
    randomized = TrainingBatches(COUNTING, TrainConfig(batch=4, random_positions=64), L, seed=1)
    for _ in range(5):
        a, b = plain.next(), randomized.next()
        for got, expected in zip(b[:3], a[:3], strict=True):
            assert torch.equal(got, expected)


# --------------------------------------------------------------------------------------------
# Varying lengths
# --------------------------------------------------------------------------------------------


def test_varying_lengths_draw_each_length_with_the_same_tokens_per_step():
    cfg = TrainConfig(batch=4, window_lengths=(4, 8, 16))
    batches = TrainingBatches(COUNTING, cfg, L, seed=0)
    seen = []
    for _ in range(60):
        batch = batches.next()
        windows, length = batch.inputs.shape
        seen.append(length)
        assert windows * length == 4 * L  # the tokens of batch windows of train_len
        assert batch.mask.shape == batch.inputs.shape
        assert batch.targets.numel() == int(batch.mask.sum())
        steps = (whole_windows(batch).diff(dim=1) % 256 == 1).all()
        assert steps, "every window is a contiguous piece of the stream"
    assert set(seen) == {4, 8, 16}
    assert min(seen.count(n) for n in (4, 8, 16)) >= 10  # 60 uniform draws over three lengths


def test_a_length_listed_twice_is_drawn_twice_as_often():
    batches = TrainingBatches(COUNTING, TrainConfig(batch=2, window_lengths=(8, 8, 16)), L, 0)
    lengths = [batches.next().inputs.shape[1] for _ in range(600)]
    assert 0.58 < lengths.count(8) / 600 < 0.75  # 2/3 expected (sd about 0.02)


def test_draws_are_seeded():
    cfg = TrainConfig(batch=2, window_lengths=(4, 8, 16), random_positions=64)

    def draws(seed):
        batches = TrainingBatches(COUNTING, cfg, L, seed)
        return [batches.next() for _ in range(8)]

    first, again, other = draws(5), draws(5), draws(6)
    for a, b in zip(first, again, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4], strict=True))
        assert a.weights is None and b.weights is None  # no copies, no weights
    assert [b.inputs.shape for b in first] != [b.inputs.shape for b in other] or not all(
        torch.equal(a.positions, b.positions) for a, b in zip(first, other, strict=True)
    )


class Killed(Exception):
    """Stands for a SIGKILL after the checkpoint of step 3."""


@pytest.mark.parametrize(
    "options",
    [
        {"window_lengths": (4, 8, 16)},
        {"random_positions": 64},
        {"window_lengths": (8, 16), "random_positions": 48},
    ],
)
def test_resume_mid_run_equals_an_uninterrupted_run(tmp_path, options):
    cfg = TrainConfig(batch=4, steps=7, warmup=1, **options)
    full, full_model, full_losses = run_training(cfg, tmp_path / "full.pt")

    def kill(step):
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        run_training(cfg, tmp_path / "cut.pt", ckpt_every=3, on_step=kill)
    ckpt = load_checkpoint(tmp_path / "cut.pt")
    assert ckpt["step"] == 3 and set(ckpt["rng"]["options"]) == {
        {"window_lengths": "lengths", "random_positions": "positions"}[k] for k in options
    }
    resumed, model, losses = run_training(
        cfg, tmp_path / "cut.pt", model=tiny_model(seed=99), resume=ckpt
    )
    assert resumed.resumed_from == 3 and resumed.final_loss == full.final_loss
    assert losses == full_losses[3:]
    want = full_model.state_dict()
    for name, weights in model.state_dict().items():
        assert torch.equal(weights, want[name]), name


def test_heldout_probe_stays_at_the_training_length(tmp_path):
    """The probe's windows are L long and measured at 0..L-1, whatever the options: its loss
    after training is masked_loss of the trained model with no positions."""
    from attnbench.extrapolation.training.batches import HeldoutProbe

    probe = HeldoutProbe.from_stream(PINNED_STREAM, L, 6, 0.15, seed=2, every=2)
    cfg = TrainConfig(batch=4, steps=4, warmup=1, window_lengths=(4, 8), random_positions=64)
    points = []
    model = tiny_model()
    train(
        model,
        PINNED_STREAM,
        cfg,
        train_len=L,
        seed=3,
        path=tmp_path / "c.pt",
        key={},
        ckpt_every=0,
        log_every=1,
        on_log=points.append,
        heldout=probe,
    )
    assert probe.inputs.shape[1] == L
    last = masked_loss(model, probe.inputs, probe.targets, probe.mask).item()
    assert points[-1].heldout_loss == pytest.approx(last, rel=1e-6)


# --------------------------------------------------------------------------------------------
# Randomized positions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lengths", [(), (4, 8, 16)])
def test_random_positions_are_sorted_distinct_and_in_range(lengths):
    span = 40
    cfg = TrainConfig(batch=4, window_lengths=lengths, random_positions=span)
    batches = TrainingBatches(COUNTING, cfg, L, seed=0)
    rows = []
    for _ in range(30):
        batch = batches.next()
        pos = batch.positions
        assert pos.shape == batch.inputs.shape and pos.dtype == torch.long
        assert (pos.diff(dim=1) > 0).all()  # sorted and distinct
        assert pos.min() >= 0 and pos.max() < span
        rows += pos.tolist()
    used = torch.tensor([p for row in rows for p in row]).bincount(minlength=span)
    assert (used > 0).all()  # every position 0..P-1 comes up
    assert len({tuple(r) for r in rows}) > len(rows) // 2  # windows get their own positions


def test_random_positions_equal_to_the_training_length_are_the_plain_positions():
    batches = TrainingBatches(COUNTING, TrainConfig(batch=2, random_positions=L), L, seed=0)
    assert torch.equal(batches.next().positions, torch.arange(L).expand(2, L))


@pytest.mark.parametrize("mechanism", ["softmax", "softmax-logn"])
def test_explicit_plain_positions_are_bit_identical_to_none(mechanism):
    model = tiny_model(mechanism)
    tokens = torch.randint(0, 256, (3, L), generator=torch.Generator().manual_seed(1))
    rows = torch.rand(3, L, generator=torch.Generator().manual_seed(2)) < 0.3
    plain = model(tokens)
    for positions in (torch.arange(L), torch.arange(L).expand(3, L)):
        assert torch.equal(model(tokens, positions), plain)
        assert torch.equal(model.hidden_at(tokens, rows, positions), model.hidden_at(tokens, rows))
    assert torch.equal(
        masked_loss(model, tokens, tokens[rows], rows, torch.arange(L)),
        masked_loss(model, tokens, tokens[rows], rows),
    )


def test_evaluation_is_unaffected_by_random_positions():
    """A forward at random positions changes the output, and leaves nothing behind: the next
    forward without positions (evaluation's) is bit for bit what it was, at any length."""
    model = tiny_model()
    gen = torch.Generator().manual_seed(4)
    short, long = torch.randint(0, 256, (2, L), generator=gen), torch.randint(0, 256, (2, 64))
    before = model(short), model(long)
    positions = torch.rand(2, 1024, generator=gen).topk(L).indices.sort(dim=1).values
    assert not torch.allclose(model(short, positions), before[0])
    after = model(short), model(long)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_evaluation_positions_are_drawn_as_in_training_below_the_span():
    draw = EvalPositions(span=64, seed=7).draw
    pos = draw(5, L)
    assert pos.shape == (5, L) and (pos.diff(dim=1) > 0).all()
    assert pos.min() >= 0 and pos.max() < 64
    assert torch.equal(pos, draw(5, L))  # the same draw for every row and training seed
    assert not torch.equal(pos, EvalPositions(span=64, seed=8).draw(5, L))
    assert len({tuple(r) for r in pos.tolist()}) == 5  # each window its own
    assert draw(3, 64) is None and draw(3, 100) is None  # n >= P: 0..n-1


def test_evaluate_reads_each_window_at_its_drawn_positions():
    """evaluate() with EvalPositions scores what hidden_at gives at the drawn positions, and
    differs from the plain evaluation (the positions reach the model)."""
    model = tiny_model().eval()
    n, span = L, 256
    tokens = (torch.arange(6 * n) * 7919 % 251).to(torch.uint8)
    mask = torch.rand(6 * n, generator=torch.Generator().manual_seed(5)) < 0.3
    stream = EvalStream(tokens, mask, n)
    positions = EvalPositions(span, seed=1)
    drawn = evaluate(model, stream, n, positions=positions, entropy_tokens=0)
    plain = evaluate(model, stream, n, entropy_tokens=0)
    x, xm = stream.windows(n)
    with torch.no_grad():
        hidden = model.hidden_at(x.masked_fill(xm, MASK_ID), xm, positions.draw(*x.shape))
        logits = model.logits(hidden)
        loss = float(torch.nn.functional.cross_entropy(logits, x[xm].long(), reduction="sum"))
    right = logits.argmax(-1) == x[xm]
    assert drawn.correct == int(right.sum()) and drawn.masked == int(xm.sum())
    assert drawn.loss_sum == pytest.approx(loss, rel=1e-6)
    assert drawn.loss_sum != plain.loss_sum


def test_a_random_positions_run_says_how_it_evaluated(tmp_path):
    corpus = make_corpus(tmp_path / "corpus.txt")
    base = ["run", "extrapolate", *TINY, "--corpus", str(corpus), "--variants", "O",
            "--eval-time", "local", "--set", "train.random_positions=64"]  # fmt: skip
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*base, "--out", str(out)])
    assert result.exit_code == 0, result.output
    again = tmp_path / "plain"
    result = CliRunner().invoke(app, [*base, "--out", str(again), "--eval-only", "--checkpoints",
                                      str(out / "checkpoints"), "--set",
                                      "eval.positions_as_trained=false"])  # fmt: skip
    assert result.exit_code == 0, result.output
    drawn, plain = (pd.read_csv(d / "extrapolate.csv").set_index(["variant", "eval_len"])
                    for d in (out, again))  # fmt: skip
    assert drawn.loc["O"]["note"].str.contains("sorted random ids from 0..63").all()
    assert plain.loc["O"]["note"].isna().all()
    assert (drawn.loc["O"]["loss"] != plain.loc["O"]["loss"]).any()
    # eval-time rows take no explicit positions: 0..n-1 in both runs
    assert drawn.loc["O+local"]["loss"].tolist() == plain.loc["O+local"]["loss"].tolist()


def test_share_losses_with_positions_add_up_to_the_batch_loss():
    """Under torchrun each rank takes its windows' positions: the shares sum to the whole."""
    model = tiny_model()
    cfg = TrainConfig(batch=3, window_lengths=(8,), random_positions=64)
    batch = TrainingBatches(COUNTING, cfg, L, seed=0).next()  # 6 windows of 8
    whole = masked_loss(model, *batch).item()
    cpu = torch.device("cpu")
    parts = sum(share_loss(model, batch[:3], s, cpu, batch.positions).item() for s in shares(6, 4))
    assert parts == pytest.approx(whole, abs=1e-6)


# --------------------------------------------------------------------------------------------
# Rotary at explicit positions, against the formula
# --------------------------------------------------------------------------------------------


def rotated_by_formula(x: list, positions: list, base: float) -> list:
    """x[b][h][t] (a list of D numbers) rotated pair (i, i + D/2) by angle p * base^(-2i/D),
    p = positions[b][t]: RoFormer's rotation, in plain Python floats."""
    dim = len(x[0][0][0])
    half = dim // 2
    out = []
    for b, heads in enumerate(x):
        out.append([])
        for head in heads:
            rows = []
            for t, v in enumerate(head):
                p = positions[b][t]
                row = [0.0] * dim
                for i in range(half):
                    angle = p * base ** (-2 * i / dim)
                    c, s = math.cos(angle), math.sin(angle)
                    row[i] = v[i] * c - v[i + half] * s
                    row[i + half] = v[i] * s + v[i + half] * c
                rows.append(row)
            out[-1].append(rows)
    return out


def test_rotary_at_explicit_positions_is_the_rotation_by_p_theta():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)  # (B, H, T, D)
    positions = torch.tensor([[0, 3, 4, 100, 1023], [7, 8, 9, 500, 501]])  # (B, T)
    rope = Rotary(8, base=10000.0)
    want = torch.tensor(rotated_by_formula(x.tolist(), positions.tolist(), 10000.0), dtype=F64)
    torch.testing.assert_close(rope(x, positions), want, rtol=0, atol=1e-12)
    # [T]: the same positions for every window
    one = positions[1]
    want = torch.tensor(rotated_by_formula(x.tolist(), [one.tolist()] * 2, 10000.0), dtype=F64)
    torch.testing.assert_close(rope(x, one), want, rtol=0, atol=1e-12)


def test_attention_at_shifted_positions_is_unchanged():
    """Rotary scores depend on p_i - p_j only: shifting every window's positions by a constant
    leaves a softmax layer's output as it was (float64)."""
    torch.manual_seed(0)
    layer = AttentionMixer("softmax", 16, 2, rope=Rotary(8)).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    positions = torch.tensor([[0, 2, 3, 9, 10, 40], [1, 5, 6, 7, 20, 21]])
    torch.testing.assert_close(layer(x, positions + 300), layer(x, positions), rtol=0, atol=1e-10)
    assert not torch.allclose(layer(x, positions), layer(x))


# --------------------------------------------------------------------------------------------
# Bad values, refused up front
# --------------------------------------------------------------------------------------------


NOT_A_DIVISOR = (
    r"train\.window_lengths = \[8, 5\] is not accepted: 5 does not divide model\.train_len = 16;"
    r" accepted: lengths dividing train_len \(1, 2, 4, 8, 16\)"
)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window_lengths": (8, 5)}, NOT_A_DIVISOR),
        ({"window_lengths": (32,)}, r"train\.window_lengths = \[32\] is not accepted"),
        ({"random_positions": 8}, r"train\.random_positions = 8 is not accepted: .*>= 16"),
        # the closing masking phase (tests/extrapolation/test_final_mask_phase.py)
        ({"final_mask_prob": 0.15}, r"final_mask_prob = 0\.15 with train\.final_mask_steps = 0"),
        ({"final_mask_steps": 5}, r"final_mask_prob = 0 with train\.final_mask_steps = 5"),
        ({"final_mask_prob": 1.0, "final_mask_steps": 5}, r"strictly between 0 and 1"),
        ({"final_mask_prob": 0.1, "final_mask_steps": 50}, r"final_mask_steps = 50 .* 0\.\.20"),
        # copy weights (tests/extrapolation/test_copy_weights.py)
        ({"copy_weight": 4.0}, r"copy_weight = 4 is not accepted without copies"),
    ],
)
def test_bad_option_values_name_the_setting(options, message):
    cfg = TrainConfig(batch=2, steps=20, **options)
    with pytest.raises(AttnbenchError, match=message):
        check_training_options(cfg, L)
    with pytest.raises(AttnbenchError, match=message):
        TrainingBatches(COUNTING, cfg, L, seed=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("window_lengths", (0,)), ("random_positions", -1), ("copy_weight", 0.0),
     ("copy_weight", float("inf"))],
)  # fmt: skip
def test_negative_or_zero_values_are_refused_by_the_schema(field, value):
    with pytest.raises(AttnbenchError, match=f"{field} = .* is not accepted"):
        TrainConfig(**{field: value})


def test_random_positions_refused_for_a_layer_without_explicit_positions(tmp_path):
    """GAU's own layer applies rotary at 0..T-1 only: refused, naming the setting, before any
    step."""
    model = tiny_model("gau")
    cfg = TrainConfig(batch=2, steps=2, random_positions=64)
    with pytest.raises(AttnbenchError, match=r"train\.random_positions = 64 .* variant G"):
        check_training_options(cfg, L, model, "G")
    with pytest.raises(AttnbenchError, match=r"train\.random_positions = 64"):
        run_training(cfg, tmp_path / "c.pt", model=model)
    assert not (tmp_path / "c.pt").exists()
    check_training_options(TrainConfig(window_lengths=(8,)), L, model)  # lengths: any mixer


def test_a_run_refuses_random_positions_for_gau_before_training_anything(tmp_path):
    """O could train; GAU could not: the run stops before O's first step."""
    corpus = make_corpus(tmp_path / "c.txt", words=1200)
    cfg = tiny_cfg(corpus).override({"variants": "O,gau", "train.random_positions": "64"})
    with pytest.raises(AttnbenchError, match=r"train\.random_positions = 64 .* variant gau"):
        run_extrapolate(cfg, run_options(tmp_path / "out"))
    assert not list((tmp_path / "out").rglob("*.pt"))


# --------------------------------------------------------------------------------------------
# Command line and preset files
# --------------------------------------------------------------------------------------------


def test_options_from_set_and_bare_names():
    given = parse_settings(["train.window_lengths=16,32,64", "train.random_positions=1024"])
    cfg = load_preset("cpu", given)
    assert cfg.train.window_lengths == (16, 32, 64) and cfg.train.random_positions == 1024
    assert cfg.plain()["train"]["window_lengths"] == (16, 32, 64)  # the sidecar's config
    bare = cfg.override({"window_lengths": "none", "random_positions": "0"})
    assert bare.train.window_lengths == () and bare.train.random_positions == 0
    assert load_preset("cpu").train == TrainConfig(
        **{**vars(cfg.train), "window_lengths": (), "random_positions": 0}
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("train.window_lengths=16,x", r"--set train\.window_lengths=16,x: .*not accepted"),
        (
            "train.window_lengths=0",
            r"window_lengths = \[0\] is not accepted; accepted: a list of integers >= 1",
        ),
        ("train.random_positions=-5", r"random_positions = -5 is not accepted"),
    ],
)
def test_bad_values_on_the_command_line_name_the_option(setting, message):
    with pytest.raises(AttnbenchError, match=message):
        load_preset("cpu", parse_settings([setting]))


def test_options_from_a_preset_file(tmp_path):
    preset = tmp_path / "mine.toml"
    preset.write_text("[train]\nwindow_lengths = [16, 32, 64]\nrandom_positions = 1024\n")
    cfg = load_preset(str(preset))
    assert cfg.train.window_lengths == (16, 32, 64) and cfg.train.random_positions == 1024
    preset.write_text("[train]\nwindow_lengths = 32\n")
    with pytest.raises(AttnbenchError, match=r"mine\.toml line 2: .*window_lengths = 32"):
        load_preset(str(preset))


def test_end_to_end_through_the_command_line(tmp_path):
    """A tiny run with both options set by --set trains, evaluates and records them in the
    sidecar and in the checkpoint's key."""
    corpus = make_corpus(tmp_path / "c.txt", words=2400)
    out = tmp_path / "out"
    args = [
        "run",
        "extrapolate",
        *TINY,
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--variants",
        "E",
        "--eval-time",
        "none",
        "--set",
        "train.window_lengths=4,8,16",
        "--set",
        "train.random_positions=64",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    sidecar = json.loads(next(out.glob("*.json")).read_text())
    assert sidecar["config"]["train"]["window_lengths"] == [4, 8, 16]
    assert sidecar["config"]["train"]["random_positions"] == 64
    key = load_checkpoint(out / "checkpoints" / "E-seed0.pt")["key"]["train"]
    assert key["window_lengths"] == (4, 8, 16) and key["random_positions"] == 64
