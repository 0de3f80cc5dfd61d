"""``run extrapolate --train-only``, and one training data-parallel over torchrun's processes
(CPU, gloo): the checkpoints equal single-process training up to float reassociation."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.experiment.run import run_extrapolate
from attnbench.extrapolation.model.encoder import MixerSpec, ModelConfig, build_model
from attnbench.extrapolation.training.batches import BatchSampler
from attnbench.extrapolation.training.distributed import shares
from tests.helpers.extrapolation import TINY, assert_shares_add_up, make_corpus, run_options

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not torch.distributed.is_available(), reason="this torch has no torch.distributed"
    ),
]

runner = CliRunner()

#: Tiny training settings. A batch of 7 windows splits 4 + 3 over two processes: each one's
#: share of the masked tokens differs from half the batch's, so the loss must be normalised by
#: the whole batch's count for the gradients to add up to the single-process one.
SETTINGS = {
    "d_model": 32, "layers": 1, "heads": 2, "train_len": 16, "batch": 7, "steps": 6,
    "warmup": 2, "threads": 1, "ckpt_every": 3, "lengths": "16,32", "tokens": 256,
    "eval_time": "none",
}  # fmt: skip
OPTIONS = [
    "--d-model", "32", "--layers", "1", "--heads", "2", "--train-len", "16", "--batch", "7",
    "--steps", "6", "--warmup", "2", "--threads", "1", "--ckpt-every", "3",
    "--eval-lengths", "16,32", "--eval-tokens", "256", "--eval-time", "none",
]  # fmt: skip
#: Largest absolute weight difference allowed between torchrun's and one process's checkpoint
#: after 6 steps: the summed gradients differ from one process's only by float reassociation
#: (measured: below 1e-7).
WEIGHT_TOL = 1e-6
LOSS_TOL = 1e-5  # the same for the recorded final loss (a sum over ranks of partial sums)
TIMEOUT_S = 180  # a torchrun launch imports torch three times: ~15 s on a busy 2-core machine

#: What torchrun sets in the processes it starts (MASTER_PORT unused: the check comes first).
TORCHRUN_ENV = {
    "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533",
}  # fmt: skip


class Killed(Exception):
    """Stands for SIGKILL: training stops with no chance to save."""


def run_command(args: list[str], env: dict[str, str] | None = None):
    """``args`` in a fresh process with one OpenMP thread (and no torchrun variables of ours)."""
    base = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    base |= {"OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, *args],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def attnbench(*args: str) -> list[str]:
    return ["-m", "attnbench", "run", "extrapolate", *args]


def torchrun(*args: str, processes: int = 2) -> list[str]:
    return ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            *attnbench(*args)]  # fmt: skip


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_shares_are_contiguous_and_uneven_splits_allowed():
    assert shares(7, 2) == [slice(0, 4), slice(4, 7)]
    assert shares(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert shares(2, 2) == [slice(0, 1), slice(1, 2)]
    with pytest.raises(ValueError, match="cannot be split over 2 torchrun processes"):
        shares(1, 2)


def test_share_losses_add_up_to_the_batch_loss():
    """In one process: the ranks' losses and gradients of a 7-window batch split 4 + 3 sum to
    the whole batch's masked_loss and its gradient."""
    torch.manual_seed(0)
    config = ModelConfig(d_model=32, layers=1, heads=2, train_len=16)
    model = build_model(config, MixerSpec("softmax"))
    stream = torch.randint(0, 250, (4000,), dtype=torch.uint8)
    batch = BatchSampler(stream, 16, 7, 0.15, seed=3).next()
    assert_shares_add_up(model, batch, 7, 2)


def test_torchrun_training_equals_one_process(tmp_path):
    """Two gloo processes train O afresh and resume E from an interrupted checkpoint (step 3);
    both checkpoints equal a single-process --train-only run within WEIGHT_TOL (absolute)."""
    corpus = make_corpus(tmp_path / "c.txt")
    one, two = tmp_path / "one", tmp_path / "two"
    single = run_command(attnbench("--train-only", *OPTIONS, "--corpus", str(corpus),
                                   "--out", str(one)))  # fmt: skip
    assert single.returncode == 0, single.stderr

    cfg = load_preset("cpu").override(SETTINGS | {"corpus": str(corpus), "variants": "E"})

    def kill(label, seed, step):
        if step == 4:  # the periodic checkpoint of step 3 survives
            raise Killed

    with pytest.raises(Killed):
        run_extrapolate(cfg, run_options(two, on_step=kill, train_only=True))
    assert load(two / "checkpoints/E-seed0.pt")["step"] == 3

    res = run_command(torchrun("--train-only", "--resume", *OPTIONS, "--corpus", str(corpus),
                               "--out", str(two)))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("O-seed0.pt", "E-seed0.pt"):
        a, b = load(two / "checkpoints" / name), load(one / "checkpoints" / name)
        assert (a["step"], a["done"]) == (b["step"], b["done"]) == (6, True), name
        assert abs(a["final_loss"] - b["final_loss"]) <= LOSS_TOL, name
        assert torch.equal(a["rng"]["sampler"], b["rng"]["sampler"]), name  # same batches drawn
        worst = max((a["model"][k] - b["model"][k]).abs().max().item() for k in b["model"])
        assert worst <= WEIGHT_TOL, f"{name}: weights differ by {worst:.2e} (absolute)"
    # rank 0 alone logs and writes; nothing is evaluated
    assert "data-parallel training over 2 torchrun processes" in res.stderr
    assert res.stderr.count("O seed 0: checkpoint") == 1, res.stderr
    assert (two / "curves.csv").exists() and not (two / "extrapolate.csv").exists()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        ([], "add --train-only"),
        (["--train-only", "--batch", "1"], "cannot be split over 2 torchrun processes"),
    ],
    ids=["without --train-only", "batch below the processes"],
)
def test_under_torchrun_bad_input_is_one_line(tmp_path, args, expect):
    """A process as torchrun starts it (its variables set) refuses before joining the group."""
    corpus = make_corpus(tmp_path / "c.txt")
    res = run_command(
        attnbench(*OPTIONS, "--corpus", str(corpus), "--out", str(tmp_path / "out"), *args),
        env=TORCHRUN_ENV,
    )
    assert res.returncode == 2, res.stderr
    assert expect in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "out").exists()


def test_train_only_with_eval_only_is_refused(tmp_path):
    res = runner.invoke(app, ["run", "extrapolate", *TINY, "--out", str(tmp_path / "out"),
                              "--train-only", "--eval-only"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "--train-only and --eval-only exclude each other" in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out").exists()


def test_train_only_then_eval_only(tmp_path):
    corpus = make_corpus(tmp_path / "c.txt")
    out = tmp_path / "out"
    common = ["run", "extrapolate", *TINY, "--corpus", str(corpus), "--out", str(out),
              "--eval-time", "chunk"]  # fmt: skip
    trained = runner.invoke(app, [*common, "--train-only"])
    assert trained.exit_code == 0, trained.output
    assert (out / "checkpoints/O-seed0.pt").exists() and (out / "checkpoints/E-seed0.pt").exists()
    assert not (out / "extrapolate.csv").exists() and not (out / "table.md").exists()
    assert "checkpoint" in trained.output and "--eval-only" in trained.output
    assert load(out / "checkpoints/E-seed0.pt")["done"]

    evaluated = runner.invoke(app, [*common, "--eval-only"])
    assert evaluated.exit_code == 0, evaluated.output
    assert (out / "extrapolate.csv").exists() and "| O+chunk | eval-time |" in evaluated.output
