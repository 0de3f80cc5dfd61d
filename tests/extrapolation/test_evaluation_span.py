"""The evaluation span and the model's inputs: windows contiguous and masks shared, pieces spread
over every held-out work, the corpus cut at a work's boundary, the masked rows' shortcut equal to
the whole forward, every variant seeing the same inputs, and the length guard."""

from __future__ import annotations

import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation.evaluate import (
    LengthCheckError,
    evaluate,
    make_eval_stream,
    spread,
)
from attnbench.extrapolation.model.encoder import MixerSpec
from tests.helpers.extrapolation import tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def test_eval_windows_are_contiguous_and_masks_shared():
    heldout = (torch.arange(5000) % 251).to(torch.uint8)
    whole = (("text", 0, 5000),)
    stream = make_eval_stream(heldout, whole, (16, 48, 64), 192, 64, mask_prob=0.15, seed=7)
    assert stream.size == 3 * 64 and stream.pieces == 3
    for n in (16, 48, 64):
        toks, mask = stream.windows(n)
        assert toks.shape == (3 * (64 // n), n)
        for w, start in enumerate(stream.starts):  # each window lies inside one piece
            for j in range(64 // n):
                row = toks[w * (64 // n) + j]
                assert torch.equal(row, heldout[start + j * n : start + (j + 1) * n].long())
    again = make_eval_stream(heldout, whole, (16, 48, 64), 192, 64, mask_prob=0.15, seed=7)
    assert torch.equal(again.mask, stream.mask) and again.starts == stream.starts


def test_eval_pieces_spread_over_every_held_out_work():
    """Pieces go to every work in proportion to its length, evenly spaced, never across a
    boundary, never overlapping; a corpus too short says what it needs."""
    works = (("a", 0, 3000), ("b", 3001, 4001), ("c", 4002, 10002))
    placed = spread(works, 10, 100)
    counts = {name: sum(1 for n, _ in placed if n == name) for name, _, _ in works}
    assert counts == {"a": 3, "b": 1, "c": 6}
    starts = sorted(s for _, s in placed)
    assert all(b - a >= 100 for a, b in zip(starts, starts[1:], strict=False))  # no overlap
    for name, start in placed:
        _, lo, hi = next(w for w in works if w[0] == name)
        assert lo <= start and start + 100 <= hi
    a_starts = [s for n, s in placed if n == "a"]
    assert a_starts[0] > 0 and a_starts[-1] + 100 < 3000  # spread, not packed at the start
    with pytest.raises(AttnbenchError, match="corpus too short"):
        spread((("a", 0, 250),), 3, 100)


def test_the_default_corpus_is_cut_at_a_play_boundary():
    from attnbench.data.corpus import load_corpus

    corpus = load_corpus()
    split = corpus.split(0.1)
    cut = split.train.numel()
    assert split.at_boundary and cut in {w.offset for w in corpus.works}
    assert 0.08 < split.heldout.numel() / len(corpus) < 0.12
    first = split.works[0]
    assert first[1] == 0  # the first held-out play starts the held-out stream: title and all
    assert [w.name for w in corpus.works if w.offset >= cut] == [w[0] for w in split.works]


def test_a_folder_corpus_is_cut_at_a_file_boundary(tmp_path):
    from attnbench.data.corpus import load_corpus

    for i, size in enumerate((5000, 3000, 1500, 600)):
        (tmp_path / f"{i}.txt").write_text(chr(ord("a") + i) * size)
    split = load_corpus(tmp_path).split(0.1)
    assert split.at_boundary and [w[0] for w in split.works] == ["3.txt"]
    assert bytes(split.heldout.tolist()) == b"d" * 600


@pytest.mark.parametrize("mechanism", ["softmax", "gau", "aft-conv"])
def test_hidden_at_the_masked_rows_equals_the_whole_forward(mechanism):
    """Training and evaluation run the last FFN and the final norm on the masked rows only:
    the same hidden states and the same gradients as the whole forward, indexed (float64)."""
    model = tiny_encoder(MixerSpec(mechanism)).double()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 257, (3, 21), generator=gen)  # odd length, [MASK] ids included
    rows = torch.rand(3, 21, generator=gen) < 0.3
    rows[1] = False  # a window with nothing masked
    weights = torch.randn(int(rows.sum()), 256, generator=gen, dtype=torch.float64)
    grads = []
    for hidden in (lambda: model(tokens)[rows], lambda: model.hidden_at(tokens, rows)):
        model.zero_grad()
        out = model.logits(hidden())  # (N, 256)
        (out * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        if len(grads) == 1:
            whole = out.detach()
    torch.testing.assert_close(out.detach(), whole, rtol=1e-12, atol=1e-12)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_every_variant_sees_the_same_inputs():
    heldout = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
    stream = make_eval_stream(
        heldout.to(torch.uint8), (("t", 0, 4096),), (16, 64), 256, 64, 0.15, 3
    )
    seen = {}
    for name, spec in (("O", MixerSpec("softmax")), ("E", MixerSpec("softmax-logn"))):
        model = tiny_encoder(spec)
        inputs = []
        hook = lambda m, args, acc=inputs: acc.append(args[0].clone())  # noqa: E731
        model.embed.register_forward_pre_hook(hook)  # the token ids the model reads
        res = evaluate(model, stream, 64, batch_tokens=128)
        seen[name] = (torch.cat(inputs), res.masked)
    assert torch.equal(seen["O"][0], seen["E"][0]) and seen["O"][1] == seen["E"][1]
    assert seen["O"][0].shape == (4, 64)


def test_length_guard_catches_truncation():
    heldout = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
    stream = make_eval_stream(heldout.to(torch.uint8), (("t", 0, 4096),), (64,), 128, 64, 0.15, 3)
    model = tiny_encoder()
    evaluate(model, stream, 64)  # fine as built
    model.embed.register_forward_hook(lambda m, args, out: out[:, :32])  # a silent truncation
    with pytest.raises(LengthCheckError, match="received length 32"):
        evaluate(model, stream, 64)


def test_a_corpus_without_a_boundary_near_the_holdout_is_cut_inside_a_work(tmp_path):
    from attnbench.data.corpus import load_corpus

    (tmp_path / "a.txt").write_text("a" * 1000)
    (tmp_path / "b.txt").write_text("b" * 100_000)
    split = load_corpus(tmp_path).split(0.1)
    assert not split.at_boundary
    assert split.describe()["heldout_share"] == pytest.approx(0.1, abs=0.001)
