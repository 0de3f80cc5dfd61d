"""The causal language-model objective (``model.objective = "clm"``): its batches (windows of
L + 1 bytes, every position predicting the next), its loss, its evaluation (loss, accuracy and
the per-position bins against a direct computation over the windows), the eval-time tricks made
causal against their formula, the causal count floor against a plain-Python table, the
checkpoint key (the defaults leave it as it was), what the objective refuses, and a tiny run end
to end."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation.causal_floor import NextByteCounts
from attnbench.extrapolation.evaluation.evaluate import evaluate, make_eval_stream
from attnbench.extrapolation.evaluation.targets import position_bins
from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.experiment.plan import checkpoint_key
from attnbench.extrapolation.experiment.run import run_extrapolate
from attnbench.extrapolation.model.encoder import MixerSpec, MLMEncoder, ModelConfig, build_model
from attnbench.extrapolation.model.tricks import TrickMixer, parse_tricks
from attnbench.extrapolation.training.batches import BatchSampler, TrainingBatches, masked_loss
from attnbench.extrapolation.training.options import TrainConfig
from attnbench.runtime.tomlconfig import parse_settings
from tests.helpers.extrapolation import COUNTING, make_corpus, run_options, tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")

L = 16


def causal_model(position="rope", mechanism="softmax", seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, layers=2, heads=4, train_len=L, objective="clm",
                      position=position, t5_buckets=8)  # fmt: skip
    return build_model(cfg, MixerSpec(mechanism)).double().eval()


# ---------------------------------------------------------------------------------------------
# Training batches and loss
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lengths", [(), (4, 8, 16)])
def test_a_causal_batch_predicts_each_next_byte_of_contiguous_windows(lengths):
    cfg = TrainConfig(batch=4, steps=5, window_lengths=lengths)
    batches = TrainingBatches(COUNTING, cfg, L, seed=3, causal=True)
    for _ in range(5):
        b = batches.next()
        W, length = b.inputs.shape
        assert W * length == 4 * L  # the same tokens every step
        assert b.mask.all() and b.positions is None
        steps = (b.inputs[:, 1:] - b.inputs[:, :-1]) % 256
        assert (steps == 1).all()  # contiguous text, nothing masked
        assert torch.equal(b.targets.view(W, length), (b.inputs + 1) % 256)  # the next bytes


def test_the_causal_batches_are_the_samplers_draws():
    sampler = BatchSampler(COUNTING, L, 4, 0.15, 9)
    want = sampler.next_causal()
    got = TrainingBatches(COUNTING, TrainConfig(batch=4), L, seed=9, causal=True).next()
    assert torch.equal(got.inputs, want[0]) and torch.equal(got.targets, want[1])


def test_the_causal_loss_is_the_mean_next_byte_cross_entropy():
    model = causal_model()
    b = TrainingBatches(COUNTING, TrainConfig(batch=3), L, seed=1, causal=True).next()
    logits = model.logits(model(b.inputs))  # (W, L, 256)
    want = F.cross_entropy(logits.reshape(-1, 256), b.targets)
    torch.testing.assert_close(masked_loss(model, b.inputs, b.targets, b.mask), want)


def test_copies_and_masking_phases_are_refused_with_the_causal_batches():
    with pytest.raises(AttnbenchError, match="no masks"):
        TrainingBatches(COUNTING, TrainConfig(copy_share=0.5), L, seed=0, causal=True)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def _stream(n_tokens=512, chunk=128):
    gen = torch.Generator().manual_seed(4)
    text = torch.randint(0, 256, (2000,), generator=gen, dtype=torch.uint8)
    return make_eval_stream(text, [("a", 0, 2000)], (16, 64), n_tokens, chunk, 0.15, 7)


def direct(model, stream, n):
    """(correct, scored, loss sum, {bin: (scored, correct, loss sum)}) of next-byte prediction
    over the windows, computed window by window from the whole forward."""
    tokens, _ = stream.windows(n)
    logits = model.logits(model(tokens))[:, :-1]  # (W, n - 1, 256): position t predicts t + 1
    targets = tokens[:, 1:]
    losses = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), reduction="none")
    right = logits.argmax(-1).reshape(-1) == targets.reshape(-1)
    col = torch.arange(n - 1).repeat(tokens.shape[0])
    bins = {}
    for lo, hi in position_bins(n, L):
        inside = (col >= lo) & (col < hi)
        bins[lo] = (int(inside.sum()), int(right[inside].sum()), float(losses[inside].sum()))
    return int(right.sum()), len(losses), float(losses.sum()), bins


@pytest.mark.parametrize("position", ["rope", "alibi", "nope"])
@pytest.mark.parametrize("n", [16, 64])
def test_causal_evaluation_equals_the_direct_computation(position, n):
    model = causal_model(position)
    stream = _stream()
    with torch.no_grad():
        res = evaluate(model, stream, n, batch_tokens=96, entropy_tokens=64, causal=True,
                       train_len=L)  # fmt: skip
        correct, scored, loss_sum, bins = direct(model, stream, n)
    assert (res.masked, res.correct) == (scored, correct)
    assert res.masked == stream.windows(n)[0].shape[0] * (n - 1)
    assert res.loss_sum == pytest.approx(loss_sum, rel=1e-9)
    assert sum(res.piece_correct) == correct and sum(res.piece_masked) == scored
    for lo, _, s, c, loss in res.bins:
        assert (s, c) == bins[lo][:2] and loss == pytest.approx(bins[lo][2], rel=1e-9, abs=1e-9)
    assert all(h is not None for h in res.entropy)  # the probe reads every causal mixer


def test_the_chunk_row_scores_the_same_bytes():
    model = causal_model()
    stream = _stream()
    with torch.no_grad():
        whole = evaluate(model, stream, 64, causal=True, train_len=L, entropy_tokens=0)
        chunks = evaluate(model, stream, 64, causal=True, train_len=L, entropy_tokens=0,
                          chunk=L)  # fmt: skip
    assert chunks.masked == whole.masked and chunks.piece_masked == whole.piece_masked
    assert [b[:3] for b in chunks.bins] == [b[:3] for b in whole.bins]
    assert chunks.loss != whole.loss


def test_masked_evaluation_bins_add_up_to_the_totals():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, layers=1, heads=4, train_len=L)
    model = build_model(cfg, MixerSpec("softmax")).eval()
    with torch.no_grad():
        res = evaluate(model, _stream(), 64, train_len=L, entropy_tokens=0)
    assert [(lo, hi) for lo, hi, *_ in res.bins] == [(0, 16), (16, 32), (32, 64)]
    assert sum(b[2] for b in res.bins) == res.masked
    assert sum(b[3] for b in res.bins) == res.correct
    assert sum(b[4] for b in res.bins) == pytest.approx(res.loss_sum, rel=1e-5)


@pytest.mark.parametrize(
    ("n", "bins"), [(16, [(0, 16)]), (8, [(0, 8)]), (100, [(0, 16), (16, 32), (32, 64), (64, 100)])]
)
def test_position_bins_double_from_l(n, bins):
    assert position_bins(n, L) == bins


# ---------------------------------------------------------------------------------------------
# Evaluation-time tricks on a causal model
# ---------------------------------------------------------------------------------------------


def trick_scores(mixer, x, row):
    """The written-out scores of a causal O with ``logn`` and a one-sided ``local`` window:
    rotary q.k / sqrt(d) x max(1, log n_i / log L), n_i = min(i, w) + 1, -inf after i or
    farther back than w."""
    B, T, C = x.shape
    H, D = mixer.heads, mixer.head_dim
    q, k = (w(x).view(B, T, H, D).transpose(1, 2) for w in (mixer.wq, mixer.wk))
    rot = mixer.rotary(T)
    q, k = rot(q), rot(k)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    window = row.local_window if row.has("local") else T
    visible = (j <= i) & (i - j <= window)
    n_i = visible.sum(-1, keepdim=True).double()
    scale = (
        1
        / math.sqrt(D)
        * ((n_i.log() / math.log(L)).clamp(min=1) if row.has("logn") else torch.ones_like(n_i))
    )
    s = q @ k.transpose(-2, -1) * scale
    return s.masked_fill(~visible, float("-inf"))


@pytest.mark.parametrize("text", ["logn", "local", "local+logn"])
def test_tricks_on_a_causal_model_are_their_formula(text):
    row = parse_tricks(text, L, local_window=5)
    torch.manual_seed(0)
    mixer = TrickMixer(32, 4, row, causal=True).double()
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    v = mixer.wv(x).view(2, 40, 4, 8).transpose(1, 2)
    want = torch.softmax(trick_scores(mixer, x, row), -1) @ v
    want = mixer.wo(want.transpose(1, 2).reshape(2, 40, 32))
    mixer.force_dense = True
    torch.testing.assert_close(mixer(x), want, rtol=1e-10, atol=1e-10)
    mixer.force_dense = False
    torch.testing.assert_close(mixer(x), want, rtol=1e-10, atol=1e-10)  # the SDPA path


def test_tricks_at_n_le_l_are_the_trained_causal_model():
    model = causal_model()
    x = torch.randint(0, 256, (2, L))
    for text in ("logn", "ntk", "yarn", "pi", "temperature", "ntk+logn"):
        other = MLMEncoder(model.cfg, lambda c, i, t=parse_tricks(text, L): TrickMixer(
            c.d_model, c.heads, t, causal=True))  # fmt: skip
        other.load_state_dict(model.state_dict())
        torch.testing.assert_close(other.double().eval()(x), model(x), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# The causal count floor
# ---------------------------------------------------------------------------------------------


def plain_next_byte_table(windows, targets, width):
    """{k: {the k previous symbols: most frequent next byte (ties: the smaller)}}."""
    counts = {k: defaultdict(Counter) for k in range(width + 1)}
    for window, nexts in zip(windows, targets, strict=True):
        for t in range(len(window)):
            for k in range(width + 1):
                ctx = tuple(int(window[j]) if j >= 0 else "E" for j in range(t - k + 1, t + 1))
                counts[k][ctx][int(nexts[t])] += 1
    return {k: {c: min(cnt, key=lambda b: (-cnt[b], b)) for c, cnt in table.items()}
            for k, table in counts.items()}  # fmt: skip


def test_the_causal_floor_is_a_plain_count_table():
    gen = torch.Generator().manual_seed(0)
    text = torch.randint(0, 3, (3000,), generator=gen, dtype=torch.uint8)
    cfg = TrainConfig(batch=6, steps=15)
    floor = NextByteCounts.from_training(text, cfg, 8, seed=2, width=3)
    batches = TrainingBatches(text, cfg, 8, seed=2, causal=True)
    windows, nexts = [], []
    for _ in range(15):
        b = batches.next()
        windows += b.inputs.tolist()
        nexts += b.targets.view(b.inputs.shape).tolist()
    table = plain_next_byte_table(windows, nexts, 3)
    assert floor.examples == 15 * 6 * 8
    probe = torch.randint(0, 4, (5, 12), generator=gen)  # byte 3 never seen: backs off
    rows = torch.ones(5, 12, dtype=torch.bool)
    guess = floor.predict(probe, rows)
    for w in range(5):
        for t in range(12):
            for k in range(3, -1, -1):
                ctx = tuple(int(probe[w, j]) if j >= 0 else "E" for j in range(t - k + 1, t + 1))
                if ctx in table[k]:
                    assert guess[w, t] == table[k][ctx]
                    break


# ---------------------------------------------------------------------------------------------
# Keys, refusals, a run
# ---------------------------------------------------------------------------------------------


def key_of(cfg, spec=MixerSpec("softmax")):
    class Variant:
        pass

    Variant.spec = spec
    return checkpoint_key(cfg, Variant, 0, "sha")


def test_the_defaults_leave_the_key_as_it_was_and_the_options_enter_it():
    cpu = load_preset("cpu")
    plain = key_of(cpu)
    assert {"position", "objective", "t5_buckets", "t5_max_distance"}.isdisjoint(plain["model"])
    assert "position" not in plain["mixer"]
    clm = key_of(cpu.override({"objective": "clm"}))
    assert clm["model"]["objective"] == "clm" and "position" not in clm["model"]
    t5 = key_of(cpu.override({"position": "t5"}))
    assert t5["model"]["position"] == "t5" and t5["model"]["t5_buckets"] == 32
    # a variant's own position is the same training as the model's: the same key
    assert key_of(cpu, MixerSpec("softmax", position="t5")) == t5
    assert ModelConfig(**plain["model"]).position == "rope"  # old keys still make a model


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (["model.position=nope"], "needs model.objective = clm"),
        (["model.objective=clm", "train.copy_share=0.5"], "train.copy_share"),
        (["model.objective=clm", "eval.long_range=true"], "eval.long_range"),
        (["model.position=rotary"], "rope, alibi, t5, nope, xpos"),
    ],
)
def test_refusals_are_one_line_and_exit_2(tmp_path, settings, words):
    args = ["run", "extrapolate", "--out", str(tmp_path)]
    for s in settings:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_variant_table_with_a_position_is_checked_when_read(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('[model]\nobjective = "mlm"\n[variants.bad]\nmechanism = "softmax"\n'
                      'position = "xpos"\n')  # fmt: skip
    with pytest.raises(AttnbenchError, match=r"p.toml.*\[variants.bad\].*objective = clm"):
        load_preset(str(preset), parse_settings([]))


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        (["model.position=alibi", "run.variants=softmax:efficient"], "model"),
        (["model.objective=clm", "model.position=t5", "run.variants=softmax:sdpa-flash"], "model"),
    ],
)
def test_a_path_with_a_bias_on_the_scores_is_refused(tmp_path, settings, where):
    """ALiBi, T5 and xPos are computed by attnbench's own mixer: a registry path named beside
    them would be written into the row while the mixer ran instead, so it is refused."""
    args = ["run", "extrapolate", "--out", str(tmp_path)]
    for s in settings:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "computes softmax without position" in result.output, where
    assert "Traceback" not in result.output


def test_a_variant_table_with_a_path_and_a_bias_is_refused_when_read(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('[model]\nobjective = "clm"\n[variants.bad]\nmechanism = "softmax"\n'
                      'path = "efficient"\nposition = "alibi"\n')  # fmt: skip
    with pytest.raises(AttnbenchError, match=r"\[variants.bad\].*path efficient computes"):
        load_preset(str(preset), parse_settings([]))


def test_eval_time_rows_skip_an_o_without_rope(tmp_path):
    cfg = tiny_cfg(make_corpus(tmp_path / "c.txt")).override(
        {"variants": "O", "eval_time": "logn", "position": "alibi", "steps": 2, "lengths": "16"}
    )
    result = run_extrapolate(cfg, run_options(tmp_path / "out"))
    assert any("O here has position alibi" in n for n in result.notes)
    assert {r["variant"] for r in result.rows} == {
        "O",
        "count-baseline",
        "count-eval-masks",
        "count-backoff",
    }


def test_a_tiny_causal_run_writes_loss_and_the_per_position_view(tmp_path):
    cfg = tiny_cfg(make_corpus(tmp_path / "c.txt")).override(
        {"objective": "clm", "variants": "O,E", "eval_time": "logn,chunk", "steps": 4,
         "lengths": "16,64", "tokens": 256, "heldout_every": 2, "heldout_windows": 8}
    )  # fmt: skip
    out = tmp_path / "out"
    run_extrapolate(cfg, run_options(out))
    table = pd.read_csv(out / "extrapolate.csv")
    o = table[(table["variant"] == "O") & (table["eval_len"] == 64)].iloc[0]
    assert o["bits_per_byte"] == pytest.approx(o["loss"] / math.log(2), rel=1e-5)
    assert o["scored_beyond_L"] == sum(64 - 1 - 16 for _ in range(int(o["windows"])))
    floor = table[table["variant"] == "count-baseline"]
    assert len(floor) == 2 and set(table["variant"]) >= {"O", "E", "O+logn", "O+chunk"}
    assert "count-backoff" not in set(table["variant"])  # the masked rule has no causal form
    positions = pd.read_csv(out / "positions.csv")
    at = positions[(positions["variant"] == "O") & (positions["eval_len"] == 64)]
    assert list(at["bin_start"]) == [0, 16, 32] and at["scored"].sum() == o["masked_tokens"]
    md = (out / "table.md").read_text()
    assert "Next-byte accuracy" in md and "bits per byte" in md and "Su 2021" not in md
    assert (out / "loss_by_position.png").exists()
    sidecar = json.loads((out / "extrapolate.json").read_text())
    assert "loss_by_position.png" in sidecar["outputs"]
    assert sidecar["config"]["model"]["objective"] == "clm"
    again = tmp_path / "again"
    result = CliRunner().invoke(app, ["plot", str(out / "extrapolate.csv"), "--out", str(again)])
    assert result.exit_code == 0, result.output
    assert (again / "accuracy_vs_length.png").is_file()
    assert (again / "loss_by_position.png").is_file()


def test_the_positions_preset_is_the_cpu_preset_as_causal_lms():
    """Equal training tokens: the cpu preset's model, steps, batches and windows; only the
    objective (and the rows) differ."""
    cpu, positions = load_preset("cpu"), load_preset("cpu-positions")
    assert positions.model == cpu.model.__class__(**{**cpu.model.__dict__, "objective": "clm"})
    assert positions.train == cpu.train
    assert positions.eval.lengths == (64, 128, 256, 512, 1024)  # L..16L
    rows = {name: positions.variant_defs[name].position for name in positions.run.variants}
    assert rows == {"O": None, "E": None, "ALiBi": "alibi", "T5": "t5", "NoPE": "nope"}
    assert positions.variant_defs["xPos"].position == "xpos"
