"""Evaluating the model at other lengths: one held-out stream, the same masks for everyone.

The evaluation span is ``tokens // chunk`` pieces of ``chunk`` contiguous held-out tokens, spread
evenly over every held-out work (each work gets pieces in proportion to its length, evenly spaced
inside it; no piece crosses from one work into the next), whatever the lengths: adding a length
never changes the other lengths' numbers. Its masked positions are drawn once (each position with
probability ``mask_prob``, generator seeded by ``eval_seed``), so every variant, every training
seed and every length n sees the same text with the same positions masked. At length n each piece
is cut into ``chunk // n`` contiguous windows of exactly n tokens (never padded, never tiled, never
across two pieces; with n not dividing the chunk, each piece's tail is left out and the row says
how many tokens were evaluated). A model of the causal objective is scored on every next byte of
those windows instead of the masked ones (:mod:`.targets`), which also bins the scores by
position for the per-position view (the loss of the positions beyond L, apart).

:class:`LengthGuard` checks, at every block's mixer, that the sequences reaching the model really
have the length being evaluated (no silent truncation anywhere). :class:`EntropyProbe` measures,
per layer, the mean entropy of attention rows, the share of each row's mass on keys at least the
training length away (farther than training ever showed), and the spread of each row's scores,
for any mixer whose operator is q, k, v -> A v with A row-stochastic: A is read off as the
operator's output for v = the identity.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation.targets import (
    Targets,
    chunked,
    make_targets,
    position_bins,
)
from attnbench.extrapolation.model.position_mixer import PositionMixer
from attnbench.extrapolation.model.positions import EvalPositions
from attnbench.extrapolation.model.tricks import TrickMixer
from attnbench.layers import AttentionMixer

#: A row counts as a probability distribution when its entries are >= -ROW_TOL and sum to 1 +-.
ROW_TOL = 1e-3


class LengthCheckError(AssertionError):
    """What reached the model does not have the length being evaluated (a bug, not bad input)."""


@dataclass(frozen=True)
class EvalStream:
    """The evaluation span: tokens [S] (uint8) and its fixed mask [S] (bool), S = pieces x
    ``chunk`` contiguous held-out tokens; ``starts`` says where each piece begins in the held-out
    stream and ``works`` which work it is from."""

    tokens: Tensor
    mask: Tensor
    chunk: int
    starts: tuple[int, ...] = ()
    works: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return self.tokens.numel()

    @property
    def pieces(self) -> int:
        return self.size // self.chunk

    def positions(self, n: int) -> Tensor:
        """Where each token of :meth:`windows` lies in the span: [W, n] long."""
        per = self.chunk // n
        idx = torch.arange(self.size).view(self.pieces, self.chunk)[:, : per * n]
        return idx.reshape(-1, n)

    def windows(self, n: int) -> tuple[Tensor, Tensor]:
        """Windows of exactly n contiguous tokens inside the pieces: (tokens [W, n] long, mask
        [W, n] bool), W = pieces x (chunk // n)."""
        if n < 1:
            raise AttnbenchError(f"invalid evaluation length {n}; accepted: an integer >= 1")
        per = self.chunk // n
        if per < 1:
            raise AttnbenchError(
                f"evaluation length n={n} is longer than the span's pieces of {self.chunk} "
                f"tokens; accepted: eval.chunk >= the longest length (--set eval.chunk={n})"
            )
        used = per * n
        toks = self.tokens.view(self.pieces, self.chunk)[:, :used].reshape(-1, n).long()
        return toks, self.mask.view(self.pieces, self.chunk)[:, :used].reshape(-1, n)

    def describe(self) -> dict:
        counts: dict[str, int] = {}
        for w in self.works:
            counts[w] = counts.get(w, 0) + 1
        return {"pieces": self.pieces, "chunk": self.chunk, "pieces_per_work": counts}


def spread(works: Sequence[tuple[str, int, int]], pieces: int, chunk: int) -> list[tuple[str, int]]:
    """``pieces`` non-overlapping starts of ``chunk`` tokens over ``works`` [(name, start, end)]:
    each work gets a share in proportion to its length (largest remainders, at most what fits),
    evenly spaced inside it. Deterministic; raises if they cannot fit."""
    fits = [max(0, (end - start) // chunk) for _, start, end in works]
    if sum(fits) < pieces:
        have = sum(end - start for _, start, end in works)
        raise AttnbenchError(
            f"corpus too short: evaluating {pieces * chunk:,} tokens ({pieces} piece"
            f"{'s' if pieces != 1 else ''} of {chunk:,} inside held-out works) needs "
            f"{pieces * chunk:,} held-out tokens, the held-out part has {have:,} (room for "
            f"{sum(fits)}); use a larger corpus or fewer --eval-tokens"
        )
    sizes = [end - start for _, start, end in works]
    total = sum(size for size, fit in zip(sizes, fits, strict=True) if fit)
    ideal = [pieces * size / total if fit else 0.0 for size, fit in zip(sizes, fits, strict=True)]
    share = [min(int(x), fit) for x, fit in zip(ideal, fits, strict=True)]
    by_remainder = sorted(range(len(works)), key=lambda i: (-(ideal[i] - int(ideal[i])), i))
    while sum(share) < pieces:  # hand out the rest, largest remainder first, where it fits
        for i in by_remainder:
            if sum(share) < pieces and share[i] < fits[i]:
                share[i] += 1
    out = []
    for (name, start, end), k in zip(works, share, strict=True):
        if not k:
            continue
        gap = ((end - start) - k * chunk) / k  # free bytes per piece, half before, half after
        out += [(name, start + int(j * (chunk + gap) + gap / 2)) for j in range(k)]
    return out


def make_eval_stream(
    heldout: Tensor,
    works: Sequence[tuple[str, int, int]],
    lengths: tuple[int, ...],
    tokens: int,
    chunk: int,
    mask_prob: float,
    seed: int,
) -> EvalStream:
    """``tokens // chunk`` pieces of ``chunk`` held-out tokens spread over ``works`` and their
    mask, the same whatever the lengths; errors say what is needed and what there is."""
    bad = [n for n in lengths if n < 1]
    if not lengths or bad:
        raise AttnbenchError(f"invalid evaluation lengths {list(lengths)}; accepted: integers >= 1")
    longest = max(lengths)
    if chunk < longest:
        raise AttnbenchError(
            f"eval.chunk={chunk:,} is shorter than the longest evaluation length {longest:,}; "
            f"accepted: eval.chunk >= {longest:,} (--set eval.chunk={longest})"
        )
    if tokens < chunk:
        raise AttnbenchError(
            f"the evaluation span of {tokens:,} tokens is shorter than one piece of eval.chunk="
            f"{chunk:,}; accepted: --eval-tokens >= {chunk:,}"
        )
    placed = spread(works, tokens // chunk, chunk)
    span = torch.cat([heldout[start : start + chunk] for _, start in placed])  # (S,)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(span.numel(), generator=gen) < mask_prob  # (S,)
    return EvalStream(
        span.clone(), mask, chunk, tuple(s for _, s in placed), tuple(n for n, _ in placed)
    )


@dataclass
class EvalResult:
    n: int
    windows: int
    tokens: int
    masked: int
    correct: int
    loss_sum: float
    entropy: list[float | None] = field(default_factory=list)
    #: Per layer: the mean share of a row's mass on keys >= train_len away, and the mean standard
    #: deviation of a row's (scaled) scores (None where the probe cannot read the rows).
    far_mass: list[float | None] = field(default_factory=list)
    score_std: list[float | None] = field(default_factory=list)
    seconds: float = 0.0
    #: Per piece of the span: masked tokens scored and correct (the unit of the bootstrap).
    piece_masked: list[int] = field(default_factory=list)
    piece_correct: list[int] = field(default_factory=list)
    #: The per-position view: (start, end, scored, correct, loss sum) per bin of window
    #: positions (:func:`.targets.position_bins`).
    bins: list[tuple[int, int, int, int, float]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return 100.0 * self.correct / max(1, self.masked)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(1, self.masked)


def mixers(model: nn.Module) -> list[nn.Module]:
    return [block.mixer for block in model.blocks]


class LengthGuard:
    """Records the sequence length reaching every block's mixer during a forward pass."""

    def __init__(self, model: nn.Module):
        self.model, self.seen, self._handles = model, [], []

    def __enter__(self) -> LengthGuard:
        for i, m in enumerate(mixers(self.model)):
            self._handles.append(
                m.register_forward_pre_hook(lambda mod, args, i=i: self.seen.append((i, args[0])))
            )
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()

    def expect(self, n: int) -> None:
        """Raise unless every mixer saw exactly length n since the last call."""
        seen, self.seen = self.seen, []
        layers = len(mixers(self.model))
        if len(seen) != layers:
            raise LengthCheckError(f"expected {layers} mixer calls at n={n}, saw {len(seen)}")
        for i, x in seen:
            if x.shape[1] != n:
                raise LengthCheckError(
                    f"layer {i} received length {x.shape[1]}, the evaluation length is {n}"
                )


def row_entropy(probs: Tensor) -> Tensor:
    """Entropy (nats) of every row of probs [..., T]: -sum p log p, with 0 log 0 = 0."""
    p = probs.to(torch.float64)
    return -(p * torch.log(p.clamp_min(1e-300))).sum(-1)


def far_mass(probs: Tensor, far: int) -> Tensor:
    """The mass of every row of probs [..., T, T] on keys j with |i - j| >= ``far``."""
    T = probs.shape[-1]
    at = torch.arange(T, device=probs.device)
    beyond = (at[:, None] - at[None, :]).abs() >= far  # (T, T)
    return (probs.to(torch.float64) * beyond).sum(-1)


def score_std(probs: Tensor) -> Tensor:
    """The standard deviation of every row's scores over the keys it can see, read off the
    probabilities: within a row log p_j = s_j - logsumexp(s), so the spread of log p over the
    keys with p_j > 0 is the spread of the scaled scores (keys masked out, p = 0, are not seen;
    a score so low that its p underflows to 0 is left out too)."""
    p = probs.to(torch.float64)
    seen = p > 0
    count = seen.sum(-1).clamp_min(1)
    logp = torch.where(seen, torch.log(p.clamp_min(1e-300)), 0.0)
    mean = logp.sum(-1) / count
    var = (torch.where(seen, logp - mean[..., None], 0.0) ** 2).sum(-1) / count
    return var.sqrt()


class EntropyProbe:
    """Mean attention-row entropy per layer while ``active``; with ``far`` (the training
    length), also the mean row mass on keys at least ``far`` away (:func:`far_mass`) and the
    mean row score spread (:func:`score_std`).

    TrickMixer and PositionMixer hand their probabilities over directly (their dense path, while
    active). For an
    AttentionMixer the probe wraps the layer's path: it calls the mechanism's reference with
    v = identity [B, Hkv, T, T] on the same q, k and parameters, which returns the attention
    matrix A of any operator of the form A v. Rows that are not distributions (negative entries,
    sums off 1: e.g. relu^2 attention) give None.
    Other mixers (whole layers with their own factories) give None.
    """

    def __init__(self, model: nn.Module, far: int | None = None):
        self.model = model
        self.far = far
        self._active = False
        self._tricks: list[tuple[int, nn.Module]] = []  # handed a hook only while active
        n = len(mixers(model))
        self.sums = [0.0] * n
        self.far_sums = [0.0] * n
        self.std_sums = [0.0] * n
        self.rows = [0] * n
        self.invalid = [False] * n
        self.supported = [False] * n
        self._undo: list = []

    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, on: bool) -> None:
        """A TrickMixer holds the hook only while active: with a hook it takes its dense path,
        without one the fused (SDPA) path (the default evaluation: 103 s -> 75 s on 2 CPU cores)."""
        self._active = on
        for i, m in self._tricks:
            m.probs_hook = (lambda p, i=i: self._record(i, p)) if on else None

    def _record(self, i: int, probs: Tensor) -> None:
        if not self.active:
            return
        sums = probs.sum(-1)
        if probs.min() < -ROW_TOL or (sums - 1).abs().max() > ROW_TOL or not probs.isfinite().all():
            self.invalid[i] = True
            return
        h = row_entropy(probs)
        self.sums[i] += h.sum().item()
        self.rows[i] += h.numel()
        if self.far is not None:
            self.far_sums[i] += far_mass(probs, self.far).sum().item()
            self.std_sums[i] += score_std(probs).sum().item()

    def __enter__(self) -> EntropyProbe:
        for i, m in enumerate(mixers(self.model)):
            if isinstance(m, (TrickMixer, PositionMixer)):
                self._tricks.append((i, m))
                self._undo.append(lambda m=m: setattr(m, "probs_hook", None))
                self.supported[i] = True
            elif isinstance(m, AttentionMixer):
                orig = m.path
                m.path = dataclasses.replace(orig, fn=self._wrap(i, m, orig))
                self._undo.append(lambda m=m, orig=orig: setattr(m, "path", orig))
                self.supported[i] = True
        self.active = self._active  # hand the hooks over if already active
        return self

    def _wrap(self, i: int, layer: AttentionMixer, fn):
        reference = layer.mech.reference

        def probed(q, k, v, *, causal, **kw):
            out = fn(q, k, v, causal=causal, **kw)
            if self.active:
                B, Hkv, T = k.shape[0], k.shape[1], k.shape[2]
                eye = torch.eye(T, dtype=v.dtype, device=v.device).expand(B, Hkv, T, T)
                try:
                    probs = reference(q, k, eye, causal=causal, **kw)  # (B, H, T, T)
                except (AttnbenchError, RuntimeError, TypeError):
                    self.invalid[i] = True
                else:
                    self._record(i, probs)
            return out

        return probed

    def __exit__(self, *exc) -> None:
        for undo in self._undo:
            undo()

    def means(self, sums: list[float] | None = None) -> list[float | None]:
        """Per layer, the mean over the recorded rows of ``sums`` (default: the entropy)."""
        sums = self.sums if sums is None else sums
        flags = zip(sums, self.rows, self.supported, self.invalid, strict=True)
        return [(s / r) if ok and not bad and r else None for s, r, ok, bad in flags]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    stream: EvalStream,
    n: int,
    *,
    chunk: int | None = None,
    batch_tokens: int = 16384,
    entropy_tokens: int = 2048,
    positions: EvalPositions | None = None,
    causal: bool = False,
    train_len: int | None = None,
) -> EvalResult:
    """Accuracy and loss of ``model`` on the span cut into windows of n tokens: of the masked
    bytes, or with ``causal`` of every next byte (:mod:`.targets`).

    ``chunk``: run each window as independent chunks of that many tokens (the sanity floor).
    Entropy is measured on the windows within the first ``entropy_tokens`` tokens of the span
    (at least one window; the same text for every variant); 0 turns it off. ``positions``: the
    rotary positions of each window (or chunk) for a model trained with randomized positions
    (:class:`EvalPositions`); None: 0..n-1. ``train_len``: L, the per-position view's bins
    (:func:`.targets.position_bins`; None: one bin).
    """
    t0 = time.perf_counter()
    model.eval()
    toks, mask = stream.windows(n)  # (W, n)
    problem = make_targets(toks, mask, stream.positions(n), causal)
    W = toks.shape[0]
    parts = chunked(problem, chunk) if chunk else [problem]
    res = EvalResult(n=n, windows=W, tokens=W * n, masked=0, correct=0, loss_sum=0.0)
    tally = _Tally(stream.size, position_bins(n, train_len or n))
    far = getattr(getattr(model, "cfg", None), "train_len", None)
    with LengthGuard(model) as guard, EntropyProbe(model, far) as probe:
        for part in parts:
            rows, m = part.inputs.shape
            rotary = positions.draw(rows, m) if positions is not None else None
            first = max(1, entropy_tokens // n) if entropy_tokens else 0  # windows probed
            split = min(rows, first * (rows // W))  # their rows (chunks) in this part
            per_batch = max(1, batch_tokens // m)
            for lo, hi, active in ((0, split, True), (split, rows, False)):
                probe.active = active
                for b0 in range(lo, hi, per_batch):
                    b1 = min(hi, b0 + per_batch)
                    at = rotary[b0:b1] if rotary is not None else None
                    _score(model, part[b0:b1], res, guard, m, at, tally)
        res.entropy = probe.means()
        if far is not None:
            res.far_mass, res.score_std = probe.means(probe.far_sums), probe.means(probe.std_sums)
    res.seconds = time.perf_counter() - t0
    expected = int(problem.rows.sum())
    if res.masked != expected:
        raise LengthCheckError(f"scored {res.masked} tokens, the windows hold {expected}")
    tally.finish(res, problem, stream.pieces)
    return res


class _Tally:
    """What the batches of one evaluation add up besides the totals: which span bytes were
    predicted right (the per-piece counts) and the per-position bins."""

    def __init__(self, size: int, bins: list[tuple[int, int]]) -> None:
        self.hits = torch.zeros(size, dtype=torch.bool)  # (S,) scored and predicted right
        self.bins = bins
        self.scored = [0] * len(bins)
        self.correct = [0] * len(bins)
        self.loss = [0.0] * len(bins)

    def add(self, places: Tensor, columns: Tensor, right: Tensor, losses: Tensor) -> None:
        """One batch's scored bytes: their span places, window positions, hits and losses [N]."""
        self.hits[places[right]] = True
        for i, (lo, hi) in enumerate(self.bins):
            inside = (columns >= lo) & (columns < hi)
            self.scored[i] += int(inside.sum())
            self.correct[i] += int((right & inside).sum())
            self.loss[i] += float(losses[inside].sum())

    def finish(self, res: EvalResult, problem: Targets, pieces: int) -> None:
        scored = torch.zeros_like(self.hits)
        scored[problem.places[problem.rows]] = True
        res.piece_masked = scored.view(pieces, -1).sum(1).tolist()
        res.piece_correct = self.hits.view(pieces, -1).sum(1).tolist()
        if sum(res.piece_correct) != res.correct:
            raise LengthCheckError(f"{sum(res.piece_correct)} hits by piece, {res.correct} in all")
        res.bins = [
            (lo, hi, s, c, loss)
            for (lo, hi), s, c, loss in zip(self.bins, self.scored, self.correct, self.loss,
                                             strict=True)
        ]  # fmt: skip


def _score(
    model: nn.Module, part: Targets, res: EvalResult, guard, m: int, at: Tensor | None,
    tally: _Tally,
) -> None:  # fmt: skip
    """Score one batch of windows into ``res`` and ``tally``. ``at``: the windows' rotary
    positions (None: 0..m-1)."""
    if part.length != m:
        raise LengthCheckError(f"batch has length {part.length}, expected {m}")
    device = next(model.parameters()).device
    inputs, rows = part.inputs.to(device), part.rows.to(device)  # (b, m)
    try:
        at = at.to(device) if at is not None else None
        hidden = model.hidden_at(inputs, rows, at)  # (N, C): the predicting positions only
    except (IndexError, RuntimeError):  # a length mismatch inside: say so if it is one
        guard.expect(m)
        raise
    guard.expect(m)
    targets = part.targets[part.rows].to(device)  # (N,)
    if hidden.shape[0] != targets.numel():
        raise LengthCheckError(
            f"model returned {hidden.shape[0]} hidden states for {targets.numel()} scored tokens"
        )
    logits = model.logits(hidden)  # (N, 256)
    res.masked += targets.numel()
    right = (logits.argmax(-1) == targets).cpu()  # (N,)
    losses = F.cross_entropy(logits, targets, reduction="none").double().cpu()  # (N,)
    if targets.numel():
        res.correct += int(right.sum())
        res.loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))  # as before
    tally.add(part.places[part.rows], part.columns[part.rows], right, losses)
