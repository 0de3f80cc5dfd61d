"""``--keep-weights``: float16 weights beside a table, evaluated later with --eval-only."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.experiment.run import run_extrapolate
from attnbench.extrapolation.training import weights
from attnbench.extrapolation.training.checkpoints import load_checkpoint
from tests.helpers.extrapolation import make_corpus, run_options, tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")


def test_kept_weights_are_half_and_evaluate_like_the_checkpoint(tmp_path):
    cfg = tiny_cfg(make_corpus(tmp_path / "corpus.txt")).override(
        {"variants": "O,E", "eval_time": "logn"}
    )
    out = tmp_path / "out"
    run_extrapolate(cfg, run_options(out, keep_weights=["O"]))
    kept = sorted(p.name for p in (out / weights.FOLDER).iterdir())
    assert kept == ["O-seed0.pt"]  # O only, as asked
    full = load_checkpoint(out / "checkpoints" / "O-seed0.pt")
    small = load_checkpoint(out / weights.FOLDER / "O-seed0.pt")
    assert small["key_hash"] == full["key_hash"] and small["done"] and small["optim"] is None
    for name, t in small["model"].items():
        assert t.dtype == torch.float16, name
        assert torch.equal(t, full["model"][name].half()), name
    size = (out / weights.FOLDER / "O-seed0.pt").stat().st_size
    assert size < (out / "checkpoints" / "O-seed0.pt").stat().st_size / 3

    # The weights evaluate as a finished checkpoint: O and its eval-time rows, no training.
    again = tmp_path / "again"
    run_extrapolate(
        cfg.override({"variants": "O"}),
        run_options(again, eval_only=True, checkpoints=out / weights.FOLDER),
    )
    first, second = pd.read_csv(out / "extrapolate.csv"), pd.read_csv(again / "extrapolate.csv")
    key = ["variant", "eval_len"]
    both = first[first["variant"].isin(["O", "O+logn"])].merge(second, on=key, suffixes=("", "_h"))
    assert len(both) == 4
    # float16 weights: the same predictions up to a few of the 40-odd masked tokens
    assert (both["accuracy"] - both["accuracy_h"]).abs().max() < 10


def test_unfinished_checkpoints_and_unknown_variants_are_refused(tmp_path):
    with pytest.raises(AttnbenchError, match="unfinished"):
        weights.half({"done": False, "step": 3, "model": {}})
    cfg = tiny_cfg(make_corpus(tmp_path / "corpus.txt"))
    with pytest.raises(AttnbenchError, match="--keep-weights O: not a trained variant.*E"):
        run_extrapolate(cfg, run_options(tmp_path / "out", keep_weights=["O"]))
