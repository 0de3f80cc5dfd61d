"""Copies weighted in the training loss (``train.copy_weight``): which masked bytes get the
weight, the weighted loss against a float64 oracle, the shares under torchrun, and that the
option changes nothing else (the same windows, masks and copies; off, the same checkpoint key)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.model.encoder import MixerSpec, ModelConfig, build_model
from attnbench.extrapolation.training import copies as planting
from attnbench.extrapolation.training.batches import TrainingBatches, masked_loss
from attnbench.extrapolation.training.loop import train
from attnbench.extrapolation.training.options import TrainConfig
from attnbench.runtime.tomlconfig import parse_settings
from tests.helpers.extrapolation import assert_shares_add_up, tiny_model, train_key

pytestmark = pytest.mark.usefixtures("one_thread")

L = 64
STREAM = torch.randint(0, 256, (6000,), generator=torch.Generator().manual_seed(8)).to(torch.uint8)


def weights_by_loops(sources, mask, weight):
    """The weight of each masked byte, row-major, one byte at a time."""
    out = []
    for b in range(mask.shape[0]):
        for i in range(mask.shape[1]):
            if mask[b, i]:
                src = int(sources[b, i])
                out.append(weight if src >= 0 and not mask[b, src] else 1.0)
    return torch.tensor(out, dtype=torch.float64)


def test_sources_point_at_the_byte_each_copied_byte_repeats():
    tokens = torch.randint(0, 256, (300, L), generator=torch.Generator().manual_seed(5))
    out, sources = planting.plant_training_copies(tokens, 0.5, 64, torch.Generator().manual_seed(6))
    copied = sources >= 0
    rows = copied.any(1)
    assert 0.35 < rows.float().mean() < 0.65
    assert not ((out != tokens).any(1) & ~rows).any()  # a changed row has sources
    b, i = copied.nonzero(as_tuple=True)
    assert torch.equal(out[b, i], tokens[b, sources[b, i]])  # the copy repeats its source
    distance = i - sources[b, i]
    assert int(distance.min()) >= 8 and int(distance.max()) <= L - 8
    for row in rows.nonzero().flatten().tolist():  # one distance per window
        assert len((torch.arange(L) - sources[row])[copied[row]].unique()) == 1
    same, none = planting.plant_training_copies(tokens, 0.0, 64, torch.Generator())
    assert torch.equal(same, tokens) and bool((none == -1).all())


@pytest.mark.parametrize("weight", [4.0, 0.25])
def test_the_weight_goes_to_masked_copy_bytes_whose_source_is_visible(weight):
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (200, L), generator=gen)
    _, sources = planting.plant_training_copies(tokens, 0.7, 64, gen)
    mask = torch.rand(200, L, generator=gen) < 0.3
    got = planting.copy_weights(sources, mask, weight)
    want = weights_by_loops(sources, mask, weight)
    assert got.shape == (int(mask.sum()),)
    assert torch.equal(got.double(), want)
    assert 0 < int((got == weight).sum()) < len(got)  # both kinds present
    copied_hidden = (sources >= 0) & mask & mask.gather(1, sources.clamp(min=0))
    assert copied_hidden.any()  # masked copy bytes whose source is masked too: weight 1


def test_batches_draw_the_same_with_and_without_weights():
    plain = TrainingBatches(STREAM, TrainConfig(batch=32, copy_share=1.0), L, seed=3)
    weighted = TrainingBatches(STREAM, TrainConfig(batch=32, copy_share=1.0, copy_weight=3.0), L,
                               seed=3)  # fmt: skip
    for _ in range(3):
        a, b = plain.next(), weighted.next()
        assert a.weights is None
        for x, y in zip(a[:3], b[:3], strict=True):
            assert torch.equal(x, y)
        assert b.weights.shape == b.targets.shape
        assert set(b.weights.unique().tolist()) == {1.0, 3.0}


@torch.no_grad()
def test_the_weighted_loss_is_the_weighted_mean_in_float64():
    model = tiny_model().double()
    cfg = TrainConfig(batch=40, copy_share=1.0, copy_weight=5.0, mask_prob=0.3)
    batch = TrainingBatches(STREAM, cfg, 32, seed=2).next()  # copies need L >= 17
    assert set(batch.weights.unique().tolist()) == {1.0, 5.0}
    got = masked_loss(model, *batch)
    hidden = model.hidden_at(batch.inputs, batch.mask)
    each = F.cross_entropy(model.logits(hidden), batch.targets, reduction="none")  # (N,)
    w = batch.weights.double()
    assert float(got) == pytest.approx(float((each * w).sum() / w.sum()), rel=1e-12)
    assert float(got) != pytest.approx(float(each.mean()), rel=1e-6)  # the weights matter
    ones = torch.ones_like(batch.weights)
    assert float(masked_loss(model, *batch[:4], ones)) == pytest.approx(
        float(masked_loss(model, *batch[:4])), rel=1e-12
    )


def test_weighted_share_losses_add_up_to_the_batch_loss():
    model = tiny_model()
    cfg = TrainConfig(batch=6, copy_share=1.0, copy_weight=4.0, mask_prob=0.3)
    batch = TrainingBatches(STREAM, cfg, 32, seed=0).next()
    assert set(batch.weights.unique().tolist()) == {1.0, 4.0}
    assert_shares_add_up(model, batch[:3], 6, 4, batch.positions, batch.weights)


def test_a_training_step_takes_the_weighted_loss(tmp_path):
    """The loss train() logs for its first step is the weighted loss of the untrained model on
    the first batch, not the plain mean."""
    torch.manual_seed(3)
    model = build_model(ModelConfig(d_model=16, layers=1, heads=2, train_len=32),
                        MixerSpec("softmax"))  # fmt: skip
    before = copy.deepcopy(model)
    cfg = TrainConfig(batch=8, steps=1, warmup=0, copy_share=1.0, copy_weight=4.0, mask_prob=0.3)
    logged = []
    train(model, STREAM, cfg, train_len=32, seed=3, path=tmp_path / "c.pt", key={},
          ckpt_every=0, log_every=1, on_log=lambda p: logged.append(p.loss))  # fmt: skip
    batch = TrainingBatches(STREAM, cfg, 32, seed=3).next()
    with torch.no_grad():
        weighted = masked_loss(before, *batch).item()
        plain = masked_loss(before, *batch[:4]).item()
    assert logged[0] == pytest.approx(weighted, rel=1e-5)
    assert weighted != pytest.approx(plain, rel=1e-4)


def test_off_it_leaves_the_checkpoint_key_as_it_was_and_on_it_enters_it():
    copies = load_preset("cpu", parse_settings(["train.copy_share=1.0"]))
    assert "copy_weight" not in train_key(copies)
    weighted = load_preset("cpu", parse_settings(["train.copy_share=1.0", "train.copy_weight=4"]))
    assert train_key(weighted)["copy_weight"] == 4.0
