"""Tiny extrapolation runs: the CLI flags of a tiny config, a word corpus, a tiny config and run
options for calling ``run_extrapolate`` from Python (CPU, seconds); a tiny model and the pinned
streams of the training tests."""

from __future__ import annotations

import json
import random

import torch

from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.experiment.run import RunOptions, run_extrapolate
from attnbench.extrapolation.model.encoder import MixerSpec, ModelConfig, build_model
from attnbench.runtime.progress import Silent

#: CLI flags of a tiny run: one small layer, 12 steps, three short evaluation lengths.
TINY = [
    "--d-model", "32", "--layers", "1", "--heads", "2", "--train-len", "16", "--batch", "8",
    "--steps", "12", "--warmup", "2", "--eval-lengths", "16,32,64", "--eval-tokens", "384",
    "--threads", "1", "--ckpt-every", "5",
]  # fmt: skip

#: The training length of the tiny models of the training tests.
L = 16
#: A stream whose bytes step by one: a window is contiguous iff its bytes do.
COUNTING = (torch.arange(5000) % 256).to(torch.uint8)
#: The stream the pinned numbers below were computed on (before the options existed).
PINNED_STREAM = (torch.arange(4000) * 7919 % 251).to(torch.uint8)


def tiny_model(mechanism: str = "softmax", seed: int = 3, **params):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, layers=1, heads=2, train_len=L)
    return build_model(cfg, MixerSpec(mechanism, params=params))


def tiny_encoder(spec: MixerSpec = MixerSpec("softmax"), heads: int = 2):
    """An encoder of two blocks of width 32 trained at L = 16 (initialised from seed 0)."""
    torch.manual_seed(0)
    return build_model(ModelConfig(d_model=32, layers=2, heads=heads, train_len=16), spec)


def whole_windows(batch) -> torch.Tensor:
    """The batch's windows with their masked bytes put back."""
    tokens = batch.inputs.clone()
    tokens[batch.mask] = batch.targets
    return tokens


WORD_TEXT = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there would their we him been has when who will more no if"
)
WORDS = WORD_TEXT.split(" ")


def make_corpus(path, words: int = 6000, seed: int = 0):
    """A corpus of ``words`` words drawn from ``WORDS`` (12 a line) at ``path``; returns it."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(words // 12)]
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_cfg(corpus):
    """The cpu preset shrunk to one tiny model (E) trained for 12 steps on ``corpus``."""
    return load_preset("cpu").override(
        {
            "d_model": 32,
            "layers": 1,
            "heads": 2,
            "train_len": 16,
            "batch": 8,
            "steps": 12,
            "warmup": 2,
            "lengths": "16,64",
            "tokens": 256,
            "threads": 1,
            "ckpt_every": 5,
            "corpus": str(corpus),
            "variants": "E",
            "eval_time": "none",
        }
    )


def run_options(out, **kw):
    """Run options writing to ``out``, silent (no progress, no log); ``kw`` sets the rest."""
    return RunOptions(out=out, progress=Silent, log=lambda m: None, argv=["attnbench"], **kw)


def evaluate_rows_on_tiny_o(tmp_path, rows: str, **settings):
    """Train a tiny O for 3 steps and evaluate it with the evaluation-time ``rows``
    (comma-separated), ``settings`` overriding the tiny preset. Returns ``(status, tricks,
    sidecar)``: each row's status per (variant, eval_len), each eval-time row's recorded trick
    description per label, and the run's sidecar."""
    cfg = tiny_cfg(make_corpus(tmp_path / "c.txt")).override(
        {"variants": "O", "eval_time": rows, "steps": 3, **settings}
    )
    result = run_extrapolate(cfg, run_options(tmp_path / "out"))
    status = {(r["variant"], r["eval_len"]): r["status"] for r in result.rows}
    sidecar = json.loads((tmp_path / "out" / "extrapolate.json").read_text())
    tricks = {v["label"]: v["tricks"] for v in sidecar["variants"] if v["kind"] == "eval-time"}
    return status, tricks, sidecar


def softmax_key(cfg) -> dict:
    """A softmax variant's checkpoint key under ``cfg`` (seed 0)."""
    from attnbench.extrapolation.experiment.plan import checkpoint_key

    class Variant:  # checkpoint_key reads the variant's spec only
        class spec:  # noqa: N801
            position = None

            @staticmethod
            def plain():
                return {"mechanism": "softmax"}

    return checkpoint_key(cfg, Variant, 0, "sha")


def train_key(cfg) -> dict:
    """The ``train`` part of a softmax variant's checkpoint key under ``cfg`` (seed 0)."""
    return softmax_key(cfg)["train"]


def assert_shares_add_up(model, batch, windows: int, ranks: int, positions=None, weights=None):
    """The ranks' ``share_loss`` of ``batch`` (inputs, targets, mask) split over ``ranks``, and
    their gradients accumulated (the all-reduce's sum), equal the whole batch's ``masked_loss``
    and its gradient."""
    import pytest
    import torch

    from attnbench.extrapolation.training.batches import masked_loss, share_loss
    from attnbench.extrapolation.training.distributed import shares

    whole = masked_loss(model, *batch, positions, weights)
    whole.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    parts = 0.0
    for share in shares(windows, ranks):
        loss = share_loss(model, batch, share, torch.device("cpu"), positions, weights)
        loss.backward()  # gradients accumulate: the all-reduce's sum
        parts += loss.item()
    assert parts == pytest.approx(whole.item(), abs=1e-6)
    for want, p in zip(expected, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, want, atol=1e-6, rtol=0)
