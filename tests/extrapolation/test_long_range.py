"""The long-range span: planted copies, which bytes are scored, and the score itself, each
against a plain loop written here."""

from __future__ import annotations

import pytest
import torch

from attnbench.extrapolation.evaluation import longrange
from attnbench.extrapolation.model.encoder import MASK_ID, MixerSpec, ModelConfig, build_model
from attnbench.extrapolation.training import copies as planting


def plain_plant(window: list[int], start: int, d: int, m: int) -> tuple[list[int], list[int]]:
    copied, control = list(window), list(window)
    for j in range(m):
        copied[start + j] = window[start + j - d]
        control[start + j] = window[start + j - d]
        control[start + j - d] = window[start + j]
    return copied, control


@pytest.mark.parametrize(
    ("n", "d", "length"), [(40, 8, 20), (40, 25, 64), (64, 16, 64), (99, 30, 20)]
)
def test_plant_copies_bytes_from_d_back_in_order(n, d, length):
    tokens = torch.randint(0, 256, (5, n), generator=torch.Generator().manual_seed(1))
    copies = planting.plant(tokens, d, length, torch.Generator().manual_seed(2))
    m = min(length, d - planting.GAP, n - d)
    assert copies.length == m and copies.distance == d
    for w in range(5):
        start = int(torch.nonzero(copies.region[w])[0])
        assert d <= start <= n - m and int(copies.region[w].sum()) == m
        copied, control = plain_plant(tokens[w].tolist(), start, d, m)
        assert copies.tokens[w].tolist() == copied and copies.control[w].tolist() == control
        # the copy's near neighbours are the same text in the copy window and its control
        near = slice(start - planting.GAP, start)
        assert torch.equal(copies.tokens[w, near], copies.control[w, near])
        assert torch.equal(copies.tokens[w, near], tokens[w, near])
        where = copies.region[w].nonzero().flatten()
        # every copied byte equals the one d before it: recoverable from there alone
        assert torch.equal(copies.tokens[w, where], copies.tokens[w, where - d])


def test_recoverable_needs_masked_in_region_and_visible_source():
    tokens = torch.arange(16).view(1, 16)
    copies = planting.plant(tokens, 8, 4, torch.Generator().manual_seed(0))
    mask = torch.zeros(1, 16, dtype=torch.bool)
    start = int(torch.nonzero(copies.region[0])[0])
    mask[0, start] = mask[0, start + 1] = True
    mask[0, start + 1 - 8] = True  # the source of the second is hidden too
    mask[0, start - 2] = True  # a masked byte in the gap, outside the copy
    got = longrange.recoverable(copies, mask)[0].nonzero().flatten().tolist()
    assert got == [start]


def test_distances_need_room_for_a_copy():
    assert longrange.distances_at(64) == [16, 32, 48]
    assert longrange.distances_at(1024)[-1] == 768
    assert longrange.distances_at(16) == []


def _tiny():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, layers=1, heads=2, train_len=16)
    return build_model(cfg, MixerSpec("softmax")).double()


def test_score_counts_only_scored_positions_like_a_full_forward():
    model = _tiny()
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (6, 32), generator=gen)
    mask = torch.rand(6, 32, generator=gen) < 0.3
    scored = mask & (torch.rand(6, 32, generator=gen) < 0.5)
    correct, total = longrange.score(model, tokens, mask, scored, batch_tokens=64)
    with torch.no_grad():
        guess = model.logits(model(tokens.masked_fill(mask, MASK_ID))).argmax(-1)
    assert total == int(scored.sum())
    assert correct == int((guess == tokens)[scored].sum())
    # chunked: each half of a window on its own
    c2, t2 = longrange.score(model, tokens, mask, scored, chunk=16)
    halves = tokens.view(12, 16).masked_fill(mask.view(12, 16), MASK_ID)
    with torch.no_grad():
        g2 = model.logits(model(halves)).argmax(-1).view(6, 32)
    assert (c2, t2) == (int((g2 == tokens)[scored].sum()), total)


def test_chunks_with_a_shorter_tail_score_like_evaluate():
    """n not a multiple of the chunk: the last, shorter chunk runs on its own, as the standard
    span's evaluate does."""
    model = _tiny()
    gen = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, 256, (3, 40), generator=gen)
    mask = torch.rand(3, 40, generator=gen) < 0.4
    got = longrange.hits(model, tokens, mask, mask, chunk=16)
    for lo, hi in ((0, 16), (16, 32), (32, 40)):
        alone = longrange.hits(model, tokens[:, lo:hi], mask[:, lo:hi], mask[:, lo:hi])
        assert torch.equal(got[:, lo:hi], alone)


def test_scored_positions_must_be_masked():
    tokens = torch.zeros(1, 8, dtype=torch.long)
    mask = torch.zeros(1, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="must be masked"):
        longrange.score(_tiny(), tokens, mask, ~mask)


def test_evaluate_reports_every_distance_with_a_no_copy_level():
    model = _tiny()
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 256, (4, 64), generator=gen)
    mask = torch.rand(4, 64, generator=gen) < 0.15
    first = longrange.evaluate_long_range(model, tokens, mask, seed=7)
    again = longrange.evaluate_long_range(model, tokens, mask, seed=7)
    assert [r.distance for r in first] == [16, 32, 48] and first == again
    assert all(r.scored > 0 and 0 <= r.no_copy_accuracy <= 100 for r in first)
    for r in first:  # each cell, scored on its own: the copy, and the same bytes without it
        copies = planting.plant(
            tokens, r.distance, 64, torch.Generator().manual_seed(7 * 100_003 + r.distance)
        )
        scored = longrange.recoverable(copies, mask)
        assert longrange.score(model, copies.tokens, mask, scored) == (r.correct, r.scored)
        assert longrange.score(model, copies.control, mask, scored) == (r.no_copy_correct, r.scored)


def test_training_copies_touch_only_the_chosen_share():
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 256, (400, 64), generator=gen)
    out, _ = planting.plant_training_copies(tokens, 0.5, 64, torch.Generator().manual_seed(6))
    changed = (out != tokens).any(1)
    assert 0.35 < changed.float().mean() < 0.65
    assert torch.equal(planting.plant_training_copies(tokens, 0.0, 64, gen)[0], tokens)
    for w in torch.nonzero(changed).flatten()[:20].tolist():
        diff = (out[w] != tokens[w]).nonzero().flatten()  # inside the copy (a byte may match)
        found = [
            d
            for d in range(8, 57)
            if int(diff[0]) >= d and torch.equal(out[w, diff], tokens[w, diff - d])
        ]
        assert found and int(diff[-1]) - int(diff[0]) < min(found)  # one piece, <= d long


def test_training_batches_with_copies_keep_the_masks_and_the_default_draws():
    from attnbench.extrapolation.training.batches import TrainingBatches
    from attnbench.extrapolation.training.options import TrainConfig

    stream = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(8))
    stream = stream.to(torch.uint8)
    plain = TrainingBatches(stream, TrainConfig(batch=64), 64, seed=3)
    copied = TrainingBatches(stream, TrainConfig(batch=64, copy_share=0.5), 64, seed=3)
    for _ in range(3):
        a, b = plain.next(), copied.next()
        assert torch.equal(a.mask, b.mask)  # the same windows and masks, draw for draw
        text_a = a.inputs.masked_scatter(a.mask, a.targets)
        text_b = b.inputs.masked_scatter(b.mask, b.targets)
        changed = (text_a != text_b).any(1)
        assert 0.2 < changed.float().mean() < 0.8
        assert torch.equal(b.targets, text_b[b.mask])
        assert (b.inputs[b.mask] == MASK_ID).all()


def test_a_run_with_the_long_range_span_writes_both_spans(tmp_path):
    import pandas as pd

    from attnbench.extrapolation.experiment.run import run_extrapolate
    from tests.helpers.extrapolation import make_corpus, run_options, tiny_cfg

    cfg = tiny_cfg(make_corpus(tmp_path / "corpus.txt")).override(
        {"variants": "O", "eval_time": "chunk,local", "train_len": 16, "lengths": "16,64",
         "eval.long_range": "true", "train.copy_share": "0.5", "copy_distances": "16,40"}
    )  # fmt: skip
    out = tmp_path / "out"
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_extrapolate(cfg, run_options(out))
    finally:
        torch.set_num_threads(old)
    cells = pd.read_csv(out / "longrange.csv")
    # d + 16 <= n: none at n = 16; 16 and 40 at n = 64; every model row, no count row
    assert set(zip(cells["eval_len"], cells["distance"], strict=True)) == {(64, 16), (64, 40)}
    assert set(cells["variant"]) == {"O", "O+chunk", "O+local"}
    assert (cells["scored"] > 0).all() and cells["accuracy"].between(0, 100).all()
    # At d = 40, n = 64 the copy is bytes 40..63 of 0..23: in chunks of L = 16 no chunk holding
    # a copied byte holds any of the source, so O+chunk reads the copy and the control alike.
    far = cells[(cells["variant"] == "O+chunk") & (cells["distance"] == 40)]
    assert (far["correct"] == far["no_copy_correct"]).all()
    md = (out / "longrange.md").read_text()
    assert "Copy accuracy, distances d >= L = 16" in md and "No-copy level" in md
    # Su 2021's published numbers were measured on the standard span only
    assert "Su 2021" not in md and "Su 2021" in (out / "table.md").read_text()
    # every model row against the window row, on both spans
    against = md.split("## Against the window row O+local")[1]
    assert "Standard span:" in against
    assert "Long-range span, copy accuracy at d >= L = 16" in against
    assert "| O+chunk |" in against and "| O |" in against and "| O+local |" not in against
    assert (out / "standard_vs_long_range.png").stat().st_size > 10_000
    side = (out / "extrapolate.json").read_text()
    assert "longrange.csv" in side and '"copy_share": 0.5' in side
