"""Per-row ReRoPE windows (``rerope@W``, ``leaky@W``; issue "Length extrapolation, part 4", item
2): the spelling, its labels and the settings recorded for it, the refusals, the cost mapping
reading past it, and the scores against an independent float64 implementation written here: one
(query, key) pair at a time, query i's pairs turned by its relative position to key j as ReRoPE
(Su 2023, https://kexue.fm/archives/9708) defines it with window W, dotted with key j unturned."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.costreport.mapping import Context, Row, cost_of, tricks_of
from attnbench.extrapolation.experiment.config import (
    load_preset,
    resolve_eval_time,
    resolve_variants,
)
from attnbench.extrapolation.model.tricks import TrickMixer, parse_tricks
from tests.helpers.extrapolation import evaluate_rows_on_tiny_o

pytestmark = pytest.mark.usefixtures("one_thread")

L, D_MODEL, HEADS, BASE = 16, 32, 2, 10000.0
D = D_MODEL // HEADS  # head dim 16
T = 40  # longer than every window below: far keys are remapped


# ---------------------------------------------------------------------------------------------
# The reference: scores spelled out pair by pair
# ---------------------------------------------------------------------------------------------


def turned_dot(q: list[float], k: list[float], r: float) -> float:
    """q turned by r theta_p in each pair p = (q[p], q[p + D/2]), dotted with k (plain floats)."""
    half, total = D // 2, 0.0
    for p in range(half):
        phi = r * BASE ** (-2 * p / D)
        a, b = q[p], q[p + half]
        total += (a * math.cos(phi) - b * math.sin(phi)) * k[p]
        total += (a * math.sin(phi) + b * math.cos(phi)) * k[p + half]
    return total


def reference_scores(q: torch.Tensor, k: torch.Tensor, relative_position) -> torch.Tensor:
    """Rotary scores [B, H, T, T], one pair (i, j) at a time: q_i turned by
    relative_position(i - j), dotted with k_j; for the identity this is (R_i q_i) . (R_j k_j),
    plain RoPE."""
    qs, ks = q.tolist(), k.tolist()
    scores = [
        [
            [[turned_dot(qh[i], kh[j], relative_position(i - j)) for j in range(len(kh))]
             for i in range(len(qh))]
            for qh, kh in zip(qb, kb, strict=True)
        ]
        for qb, kb in zip(qs, ks, strict=True)
    ]  # fmt: skip
    return torch.tensor(scores, dtype=torch.float64)


def rerope_position(window: int):
    """ReRoPE with window W: r kept within +-W, clipped to +-W beyond."""
    return lambda r: math.copysign(min(abs(r), window), r)


def leaky_position(window: int, k: float):
    """Leaky ReRoPE with window W: r kept when |r| < W, else sign(r) (W + (|r| - W) / k)."""
    return lambda r: r if abs(r) < window else math.copysign(window + (abs(r) - window) / k, r)


def q_and_k(seed: int, n: int = T):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, HEADS, n, D, generator=gen, dtype=torch.float64) for _ in range(2)]


def scores_of(row: str, q, k, **settings) -> torch.Tensor:
    mixer = TrickMixer(D_MODEL, HEADS, parse_tricks(row, L, **settings)).double()
    return mixer.scores(q, k)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.allclose(got, want, atol=1e-11, rtol=1e-10), (got - want).abs().max()


# ---------------------------------------------------------------------------------------------
# Scores against the reference
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [3, 11, 15])  # the run's window is L/2 = 8
def test_rerope_at_w_clips_at_the_rows_window(window):
    q, k = q_and_k(seed=window)
    want = reference_scores(q, k, rerope_position(window))
    assert_close(scores_of(f"rerope@{window}", q, k), want)
    assert_close(scores_of(f"rerope@{window}+logn", q, k), want)  # logn scales later, not here
    # The run's window is another clipping: the row's own one is what is used.
    assert not torch.allclose(scores_of("rerope", q, k), want, atol=1e-6)


def test_rerope_at_the_runs_window_is_plain_rerope():
    q, k = q_and_k(seed=1)
    row, run = parse_tricks("rerope@6", L, rerope_window=6), parse_tricks("rerope", L, None, 6)
    assert row.rerope_window == run.rerope_window == 6 and row.label != run.label
    assert torch.equal(scores_of("rerope@6", q, k), scores_of("rerope", q, k, rerope_window=6))
    assert_close(scores_of("rerope@6", q, k), reference_scores(q, k, rerope_position(6)))


@pytest.mark.parametrize(
    ("window", "leaky_k", "k_used"),
    [
        (5, 0.0, (T - 1 - 5) / (L - 1 - 5)),  # k per n: the farthest key lands at L - 1
        (12, 0.0, (T - 1 - 12) / (L - 1 - 12)),
        (11, 4.0, 4.0),
        (20, 3.0, 3.0),  # a fixed k allows any window
    ],
)
def test_leaky_at_w_compresses_beyond_the_rows_window(window, leaky_k, k_used):
    q, k = q_and_k(seed=10 + window)
    want = reference_scores(q, k, leaky_position(window, k_used))
    assert_close(scores_of(f"leaky@{window}", q, k, leaky_k=leaky_k), want)
    assert not torch.allclose(scores_of("leaky", q, k, leaky_k=leaky_k), want, atol=1e-6)
    if leaky_k == 0.0:
        assert leaky_position(window, k_used)(T - 1) == pytest.approx(L - 1, rel=1e-14)


def test_leaky_at_the_runs_window_is_plain_leaky():
    q, k = q_and_k(seed=2)
    assert torch.equal(scores_of("leaky@5", q, k), scores_of("leaky", q, k, rerope_window=5))


def test_a_rows_window_reaches_the_attention_with_logn():
    """The whole dense path of ``rerope@W+logn^2``: softmax(scores x (log n / log L)^2 / sqrt(d))
    with the reference scores."""
    q, k = q_and_k(seed=3)
    v = torch.randn(1, HEADS, T, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    scale = (math.log(T) / math.log(L)) ** 2 / math.sqrt(D)
    want = torch.softmax(reference_scores(q, k, rerope_position(13)) * scale, dim=-1) @ v
    mixer = TrickMixer(D_MODEL, HEADS, parse_tricks("rerope@13+logn^2", L)).double()
    assert_close(mixer.dense(q, k, v), want)


# ---------------------------------------------------------------------------------------------
# Spelling, labels, recorded settings, refusals
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "label", "window", "from_row"),
    [
        ("rerope@48+logn", "rerope@48+logn", 48, True),
        ("leaky@40+logn", "leaky@40+logn", 40, True),
        ("rerope@63+logn^2", "rerope@63+logn^2", 63, True),
        ("logn + rerope@048", "logn+rerope@48", 48, True),  # canonical W
        ("rerope+logn", "rerope+logn", 32, False),  # no suffix: as before, the run's window
        ("leaky+logn", "leaky+logn", 32, False),
    ],
)
def test_labels_keep_the_window_as_spelled(row, label, window, from_row):
    tricks = parse_tricks(row, 64)
    assert (tricks.label, tricks.rerope_window, tricks.window_from_row) == (label, window, from_row)
    assert parse_tricks(tricks.label, 64) == tricks  # the label reads back as the same row


def test_parameters_and_description_record_the_rows_window():
    rerope = parse_tricks("rerope@48+logn", 64)
    assert rerope.parameters("rerope") == "rerope_window=48 (the row's @48)"
    assert "clipped at +-48 (the row's @48) [rerope_window=48 (the row's @48)]" in (
        rerope.describe()
    )
    leaky = parse_tricks("leaky@40", 64, leaky_k=8.0)
    assert leaky.parameters("leaky") == "rerope_window=40 (the row's @40), leaky_k=8"
    plain = parse_tricks("rerope+logn", 64, rerope_window=20)
    assert plain.parameters("rerope") == "rerope_window=20"
    # As before the suffix existed: the committed tables' notes read the same.
    assert "clipped at +-rerope_window (20) [rerope_window=20]" in plain.describe()
    leaky_plain = parse_tricks("leaky", 64, rerope_window=20).describe()
    assert leaky_plain.startswith("Leaky ReRoPE: relative positions beyond +-rerope_window (20) ")


def test_rows_with_different_windows_sit_in_one_run():
    cfg = load_preset("cpu").override(
        {"eval_time": "rerope+logn,rerope@48+logn,rerope@63+logn,leaky@40+logn"}
    )
    rows, notes = resolve_eval_time(cfg, resolve_variants(cfg)[0])
    assert not notes
    got = {r.label: r.tricks.rerope_window for r in rows}
    want = {"O+rerope+logn": 32, "O+rerope@48+logn": 48, "O+rerope@63+logn": 63,
            "O+leaky@40+logn": 40}  # fmt: skip
    assert got == want


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ("local@8", ["'local@8'", "only rerope and leaky take a window", "accepted: rerope@W"]),
        ("logn^2@3", ["only rerope and leaky take a window", "accepted"]),
        ("hwfa@4+rerope", ["'hwfa@4'", "only rerope and leaky"]),
        ("rerope@0", ["'rerope@0'", "integer >= 1", "accepted: rerope@W"]),
        ("rerope@x", ["'rerope@x'", "integer >= 1", "accepted"]),
        ("rerope@4.5", ["'rerope@4.5'", "integer >= 1"]),
        ("leaky@-3", ["'leaky@-3'", "integer >= 1", "accepted: leaky@W"]),
        ("rerope@", ["integer >= 1"]),
        ("rerope@4+rerope@5", ["names a trick twice"]),
        ("rerope@4+leaky@5", ["remaps the relative positions twice"]),
        ("warp@4", ["unknown evaluation-time trick", "rerope@W and leaky@W"]),
    ],
)
def test_bad_windows_are_refused_with_what_is_accepted(row, words):
    with pytest.raises(AttnbenchError) as info:
        parse_tricks(row, L)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_leaky_with_k_per_n_checks_the_rows_own_window():
    """k chosen per n needs w < L - 1: checked on the row's window, whichever the run's is."""
    with pytest.raises(AttnbenchError) as info:
        parse_tricks("leaky@15+logn", L)
    assert "leaky@W < 15 (it is 15)" in str(info.value)
    assert "accepted: leaky@W with W < 15, or leaky_k >= 1" in str(info.value)
    assert parse_tricks("leaky@15", L, leaky_k=2.0).rerope_window == 15
    assert parse_tricks("leaky@8", L, rerope_window=L - 1).rerope_window == 8
    with pytest.raises(AttnbenchError, match="rerope_window < 15"):
        parse_tricks("leaky", L, rerope_window=L - 1)


# ---------------------------------------------------------------------------------------------
# The cost mapping, and a run end to end
# ---------------------------------------------------------------------------------------------


def test_the_cost_mapping_reads_past_the_window():
    row = Row("O+rerope@48+logn", "eval-time", "O", "softmax")
    assert tricks_of(row) == ["rerope", "logn"]
    assert tricks_of(Row("O+leaky@40+logn^2", "eval-time", "O", "softmax")) == ["leaky", "logn"]
    context = Context(train_len=64, local_window=32, rerope_window=32, heads=2, head_dim=64)
    plain = cost_of(Row("O+rerope+logn", "eval-time", "O", "softmax"), context)
    assert cost_of(row, context) == plain  # ReRoPE's cost does not depend on w


def test_a_run_evaluates_rows_with_their_own_windows(tmp_path):
    rows = "rerope+logn,rerope@12+logn,leaky@6"
    done, recorded, _ = evaluate_rows_on_tiny_o(tmp_path, rows)
    for row in rows.split(","):
        assert done[(f"O+{row}", 16)] == done[(f"O+{row}", 64)] == "ok", row
    assert "[rerope_window=8]" in recorded["O+rerope+logn"]  # L/2
    assert "[rerope_window=12 (the row's @12)]" in recorded["O+rerope@12+logn"]
    assert "rerope_window=6 (the row's @6), leaky_k=per n" in recorded["O+leaky@6"]
