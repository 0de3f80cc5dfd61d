"""The evaluation-time rows of issues 32 and 33 (``yarn-dim``, ``logn^P``, ``leaky``, ``hwfa``,
ReRoPE windows up to L, YaRN's settings), each against an independent float64 implementation of
its definition written here: rotary scores as complex products, the relative position each row
assigns to a (query, key) pair spelled out one pair at a time, the frequencies of YaRN's code
copied by hand from Hugging Face Transformers' ``_compute_yarn_parameters``."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.experiment.config import (
    load_preset,
    resolve_eval_time,
    resolve_variants,
)
from attnbench.extrapolation.model.encoder import MixerSpec, MLMEncoder, ModelConfig, build_model
from attnbench.extrapolation.model.tricks import TrickMixer, parse_tricks
from tests.helpers.extrapolation import evaluate_rows_on_tiny_o

pytestmark = pytest.mark.usefixtures("one_thread")

L, D_MODEL, HEADS, BASE = 16, 32, 2, 10000.0
D = D_MODEL // HEADS  # head dim 16


# ---------------------------------------------------------------------------------------------
# The reference: attention written from the definitions
# ---------------------------------------------------------------------------------------------


def rope_freqs(dim: int = D, base: float = BASE) -> torch.Tensor:
    """theta_p = base^(-2p/d) for the d/2 pairs (float64)."""
    return torch.tensor([base ** (-2 * p / dim) for p in range(dim // 2)], dtype=torch.float64)


def as_complex(x: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., d/2] complex: pair p is (x[p], x[p + d/2]) (the layout of Rotary)."""
    half = x.shape[-1] // 2
    return torch.complex(x[..., :half], x[..., half:])


def reference_scores(q, k, freqs, relpos) -> torch.Tensor:
    """Rotary scores [B, H, T, T] with key j seen from query i at relative position relpos[i, j]:
    Re sum_p q_p conj(k_p) exp(1j relpos theta_p)."""
    phase = torch.exp(1j * relpos[:, :, None] * freqs[None, None, :])  # (T, T, P)
    return torch.einsum("bhip,bhjp,ijp->bhij", as_complex(q), as_complex(k).conj(), phase).real


def reference_attention(q, k, v, freqs, relpos, row_scale, visible=None) -> torch.Tensor:
    """softmax(scores x row_scale[i] / sqrt(d), keys outside ``visible`` left out) @ v."""
    s = reference_scores(q, k, freqs, relpos) * row_scale[:, None] / math.sqrt(q.shape[-1])
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def relative(T: int, where) -> torch.Tensor:
    """[T, T] float64: where(i - j) for every query i and key j, one pair at a time."""
    rows = [[float(where(i - j)) for j in range(T)] for i in range(T)]
    return torch.tensor(rows, dtype=torch.float64)


def plain(r: int) -> float:
    return r


def clipped(w: int):
    return lambda r: max(-w, min(w, r))


def leaky(w: int, k: float):
    """Su 2023's Leaky ReRoPE: r inside the window, sign(r) (w + (|r| - w) / k) outside."""
    return lambda r: r if abs(r) < w else math.copysign(w + (abs(r) - w) / k, r)


def qkv(T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, HEADS, T, D, generator=gen, dtype=torch.float64) for _ in range(3)]


def mixer_for(row: str, *, layer=None, layers=None, **settings) -> TrickMixer:
    tricks = parse_tricks(row, L, **settings)
    return TrickMixer(D_MODEL, HEADS, tricks, layer=layer, layers=layers).double()


def both_paths(mixer: TrickMixer, q, k, v) -> list[torch.Tensor]:
    """The dense path, and the SDPA path where the row has one."""
    outs = [mixer.dense(q, k, v)]
    if not mixer.dense_only:
        outs.append(mixer.fused(q, k, v))
    return outs


def assert_matches(mixer: TrickMixer, q, k, v, want) -> None:
    for got in both_paths(mixer, q, k, v):
        assert torch.allclose(got, want, atol=1e-12, rtol=1e-10), (got - want).abs().max()


# ---------------------------------------------------------------------------------------------
# yarn-dim: YaRN's code
# ---------------------------------------------------------------------------------------------


def hf_yarn_inv_freq(dim, base, train_len, factor, beta_fast=32.0, beta_slow=1.0):
    """The inverse frequencies of Hugging Face Transformers' ``_compute_yarn_parameters`` (the
    same as jquesnelle/yarn's), copied by hand, in float64 instead of float32."""

    def find_correction_dim(num_rotations):
        return (dim * math.log(train_len / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot):
        low = math.floor(find_correction_dim(low_rot))
        high = math.ceil(find_correction_dim(high_rot))
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(lo, hi, n):
        if lo == hi:
            hi += 0.001  # Prevent singularity
        linear_func = (torch.arange(n, dtype=torch.float64) - lo) / (hi - lo)
        return torch.clamp(linear_func, 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = find_correction_range(beta_fast, beta_slow)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
    return (
        inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
        + inv_freq_extrapolation * inv_freq_extrapolation_factor
    )


@pytest.mark.parametrize(
    ("dim", "base", "train_len", "factor", "betas"),
    [
        (64, 10000.0, 64, 16.0, (32.0, 1.0)),  # the cpu preset at n = 1024
        (16, 10000.0, 16, 4.0, (32.0, 1.0)),
        (64, 500000.0, 64, 8.0, (16.0, 2.0)),  # other base, other betas
        (8, 10000.0, 100000, 2.0, (32.0, 1.0)),  # high = 5 > d/2 - 1: the code clamps at d - 1
        (16, 10000.0, 4, 3.0, (32.0, 1.0)),  # low = high = 0: the code's + 0.001
    ],
)
def test_yarn_dim_frequencies_are_those_of_yarns_code(dim, base, train_len, factor, betas):
    beta_fast, beta_slow = betas
    tricks = parse_tricks("yarn-dim", train_len, yarn_beta_fast=beta_fast, yarn_beta_slow=beta_slow)
    mixer = TrickMixer(dim * 2, 2, tricks, rope_base=base)
    n = int(factor * train_len)
    got = mixer.rotary(n).inv_freq()
    want = hf_yarn_inv_freq(dim, base, train_len, factor, beta_fast, beta_slow)
    assert torch.allclose(got, want, rtol=1e-13, atol=0), (got, want)


def test_yarn_dim_keeps_the_fast_pairs_and_divides_the_slow_ones_at_l64():
    """At L = 64, d = 64: low = max(0, floor(-3.98)) = 0, high = ceil(8.06) = 9, so pair 0 keeps
    its frequency, pairs 9.. are divided by s, pairs 1..8 in between; the paper's form moves
    every pair (pair 0 makes only 64 / 2 pi = 10.2 turns, fewer than beta = 32)."""
    tricks = parse_tricks("yarn-dim", 64)
    got = TrickMixer(128, 2, tricks).rotary(256).inv_freq() / rope_freqs(64)
    assert got[0].item() == pytest.approx(1.0, rel=1e-14)
    assert torch.allclose(got[9:], torch.full((23,), 0.25, dtype=torch.float64), rtol=1e-14)
    assert all(0.25 < got[p].item() < 1.0 for p in range(1, 9))
    paper = TrickMixer(128, 2, parse_tricks("yarn", 64)).rotary(256).inv_freq() / rope_freqs(64)
    assert (paper < 1).all()


def test_yarn_dim_attention_equals_the_reference():
    n = 4 * L
    q, k, v = qkv(n)
    freqs = hf_yarn_inv_freq(D, BASE, L, n / L)
    temperature = (0.1 * math.log(n / L) + 1) ** 2
    scale = torch.full((n,), temperature, dtype=torch.float64)
    want = reference_attention(q, k, v, freqs, relative(n, plain), scale)
    assert_matches(mixer_for("yarn-dim"), q, k, v, want)


def test_yarn_settings_reach_the_paper_form():
    """yarn_alpha and yarn_beta move the paper's ramp: g = clip((r - alpha) / (beta - alpha)),
    r = L theta / 2 pi, written out per pair."""
    alpha, beta, n = 0.5, 2.0, 3 * L
    mixer = mixer_for("yarn", yarn_alpha=alpha, yarn_beta=beta)
    want = []
    for theta in rope_freqs().tolist():
        g = min(1.0, max(0.0, (L * theta / (2 * math.pi) - alpha) / (beta - alpha)))
        want.append((1 - g) * theta / (n / L) + g * theta)
    got = mixer.rotary(n).inv_freq()
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-13)
    assert not torch.allclose(got, mixer_for("yarn").rotary(n).inv_freq())  # not the default


# ---------------------------------------------------------------------------------------------
# logn^P, Leaky ReRoPE, ReRoPE up to w = L, HWFA
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "power"), [("logn^2", 2.0), ("logn^0.5", 0.5), ("logn", 1.0)])
def test_logn_power_equals_the_reference(row, power):
    n = 5 * L
    q, k, v = qkv(n)
    scale = torch.full((n,), max(1.0, math.log(n) / math.log(L)) ** power, dtype=torch.float64)
    want = reference_attention(q, k, v, rope_freqs(), relative(n, plain), scale)
    assert_matches(mixer_for(row), q, k, v, want)


def test_logn_power_counts_the_visible_keys_and_composes_with_rerope():
    n, window = 5 * L, 20
    q, k, v = qkv(n, seed=1)
    visible = relative(n, plain).abs() <= window
    keys = visible.sum(-1).to(torch.float64)
    scale = (keys.log() / math.log(L)).clamp(min=1) ** 2
    want = reference_attention(q, k, v, rope_freqs(), relative(n, plain), scale, visible)
    assert_matches(mixer_for("local+logn^2", local_window=window), q, k, v, want)
    scale = torch.full((n,), (math.log(n) / math.log(L)) ** 2, dtype=torch.float64)
    want = reference_attention(q, k, v, rope_freqs(), relative(n, clipped(6)), scale)
    assert_matches(mixer_for("rerope+logn^2", rerope_window=6), q, k, v, want)


@pytest.mark.parametrize(
    ("n", "window", "leaky_k", "k_used"),
    [
        (50, 8, 0.0, (50 - 1 - 8) / (L - 1 - 8)),  # k per n: the farthest key lands at L - 1
        (50, 5, 4.0, 4.0),
        (40, 1, 16.0, 16.0),
        (37, 14, 0.0, (37 - 1 - 14) / (L - 1 - 14)),  # w = L - 2: a steep k
    ],
)
def test_leaky_rerope_equals_the_reference(n, window, leaky_k, k_used):
    q, k, v = qkv(n, seed=2)
    mixer = mixer_for("leaky", rerope_window=window, leaky_k=leaky_k)
    assert mixer.tricks.leaky_factor(n) == pytest.approx(k_used, rel=1e-15)
    ones = torch.ones(n, dtype=torch.float64)
    want = reference_attention(q, k, v, rope_freqs(), relative(n, leaky(window, k_used)), ones)
    assert_matches(mixer, q, k, v, want)
    if leaky_k == 0.0:  # the farthest key sits at the farthest trained distance
        assert leaky(window, k_used)(n - 1) == pytest.approx(L - 1, rel=1e-14)


def test_leaky_rerope_composes_with_logn_and_a_rotary_trick():
    n = 48
    q, k, v = qkv(n, seed=3)
    kk = (n - 1 - 8) / (L - 1 - 8)
    freqs = rope_freqs() * (L / n)  # pi: positions x L / n, i.e. frequencies x L / n
    scale = torch.full((n,), math.log(n) / math.log(L), dtype=torch.float64)
    want = reference_attention(q, k, v, freqs, relative(n, leaky(8, kk)), scale)
    assert_matches(mixer_for("leaky+logn+pi"), q, k, v, want)


@pytest.mark.parametrize("window", [L // 2, L - 1, L])
def test_rerope_works_for_any_window_up_to_l(window):
    """w = L keeps every trained distance 0..L-1 and puts the farther keys at L."""
    n = 3 * L
    q, k, v = qkv(n, seed=4)
    ones = torch.ones(n, dtype=torch.float64)
    want = reference_attention(q, k, v, rope_freqs(), relative(n, clipped(window)), ones)
    assert_matches(mixer_for("rerope", rerope_window=window), q, k, v, want)


def test_hwfa_windows_every_layer_but_the_last():
    n, window = 4 * L, 6
    q, k, v = qkv(n, seed=5)
    rel = relative(n, plain)
    ones = torch.ones(n, dtype=torch.float64)
    windowed = reference_attention(q, k, v, rope_freqs(), rel, ones, rel.abs() <= window)
    scale = torch.full((n,), math.log(n) / math.log(L), dtype=torch.float64)
    full = reference_attention(q, k, v, rope_freqs(), rel, scale)
    for layer, want in ((0, windowed), (1, windowed), (2, full)):
        mixer = mixer_for("hwfa", layer=layer, layers=3, local_window=window)
        assert_matches(mixer, q, k, v, want)


def test_hwfa_needs_the_layer_index():
    tricks = parse_tricks("hwfa", L)
    for layer, layers in ((None, 2), (0, None), (2, 2)):
        with pytest.raises(AttnbenchError, match="layer index"):
            TrickMixer(D_MODEL, HEADS, tricks, layer=layer, layers=layers)


# ---------------------------------------------------------------------------------------------
# Where each row is the plain O model
# ---------------------------------------------------------------------------------------------


def _plain_and_swapped(row: str, **settings):
    """The trained-O stand-in (float64, 2 layers, L = 16) and the same weights under ``row``."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=D_MODEL, layers=2, heads=HEADS, train_len=L)
    model = build_model(cfg, MixerSpec("softmax")).double().eval()
    tricks = parse_tricks(row, L, **settings)
    other = MLMEncoder(
        cfg, lambda c, i: TrickMixer(c.d_model, c.heads, tricks, layer=i, layers=c.layers)
    )
    other.load_state_dict(model.state_dict())
    return model, other.double().eval()


@pytest.mark.parametrize(
    ("row", "settings", "same_up_to", "differs_at"),
    [
        ("yarn-dim", {}, L, L + 8),  # s = 1: frequencies and temperature unchanged
        ("logn^2", {}, L, L + 8),  # max(1, log n / log L) = 1
        ("rerope+logn^2", {}, L // 2 + 1, L + 8),  # no distance reaches w = L/2 below that
        ("leaky", {}, L, L + 8),  # k per n is 1 for n <= L
        ("leaky", {"leaky_k": 4.0}, L // 2 + 1, L),  # a fixed k compresses from w on
        ("rerope", {"rerope_window": L}, L, L + 8),  # w = L: every distance below L kept
        ("hwfa", {}, L // 2 + 1, L),  # all keys inside +-L/2, and log n / log L <= 1
    ],
)
def test_rows_are_plain_o_where_they_should_be(row, settings, same_up_to, differs_at):
    model, swapped = _plain_and_swapped(row, **settings)
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for n in (same_up_to // 2, same_up_to):
            x = torch.randint(0, 256, (2, n), generator=gen)
            assert torch.allclose(swapped(x), model(x), atol=1e-12, rtol=1e-10), (row, n)
        x = torch.randint(0, 256, (2, differs_at), generator=gen)
        assert not torch.allclose(swapped(x), model(x), atol=1e-6), (row, differs_at)


# ---------------------------------------------------------------------------------------------
# Settings, the sidecar, bad input
# ---------------------------------------------------------------------------------------------


def test_settings_reach_the_rows_and_their_description():
    """The eval settings reach each row's Tricks, and its description (the sidecar's ``tricks``
    and the CSV's ``note``) names them."""
    cfg = load_preset("cpu").override(
        {
            "eval_time": "yarn,yarn-dim,leaky+logn,rerope+logn^2,hwfa",
            "yarn_alpha": 0.5,
            "yarn_beta": 16,
            "yarn_beta_fast": 24,
            "yarn_beta_slow": 2,
            "leaky_k": 8,
            "rerope_window": 48,
            "local_window": 20,
        }
    )
    trained, _ = resolve_variants(cfg)
    rows, notes = resolve_eval_time(cfg, trained)
    assert not notes
    labels = [r.label for r in rows]
    assert labels == ["O+yarn", "O+yarn-dim", "O+leaky+logn", "O+rerope+logn^2", "O+hwfa"]
    text = {r.label: r.tricks.describe() for r in rows}
    assert "yarn_alpha=0.5, yarn_beta=16" in text["O+yarn"]
    assert "yarn_beta_fast=24, yarn_beta_slow=2" in text["O+yarn-dim"]
    assert "rerope_window=48, leaky_k=8" in text["O+leaky+logn"]
    assert "p=2" in text["O+rerope+logn^2"] and "rerope_window=48" in text["O+rerope+logn^2"]
    assert "local_window=20" in text["O+hwfa"] and "global through depth only" in text["O+hwfa"]
    assert cfg.plain()["eval"]["leaky_k"] == 8 and cfg.plain()["eval"]["yarn_beta_fast"] == 24
    t = rows[1].tricks
    assert (t.yarn_alpha, t.yarn_beta, t.yarn_beta_fast, t.yarn_beta_slow) == (0.5, 16, 24, 2)


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ("yarn-dims", ["unknown evaluation-time trick", "yarn-dim", "logn^P"]),
        ("logn^0", ["logn^P", "accepted", "yarn-dim"]),
        ("logn^-1", ["logn^P", "accepted"]),
        ("logn^two", ["logn^P", "accepted"]),
        ("logn^inf", ["logn^P", "accepted"]),
        ("leaky+rerope", ["remaps the relative positions twice", "accepted"]),
        ("yarn-dim+yarn", ["rotary frequencies twice", "yarn-dim"]),
        ("yarn-dim+temperature", ["already holds the temperature"]),
        ("hwfa+local", ["already holds 'local'", "accepted"]),
        ("hwfa+logn^2", ["already holds 'logn'", "accepted"]),
        ("logn+logn^2", ["names a trick twice"]),
    ],
)
def test_bad_rows_are_refused_with_what_is_accepted(row, words):
    with pytest.raises(AttnbenchError) as info:
        parse_tricks(row, L)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"yarn_alpha": 32.0}, ["yarn_alpha=32", "accepted: 0 <= yarn_alpha < yarn_beta"]),
        ({"yarn_beta_fast": 1.0}, ["accepted: 0 < yarn_beta_slow < yarn_beta_fast"]),
        ({"leaky_k": 0.5}, ["leaky_k=0.5", "accepted: 0 (k chosen per n) or >= 1"]),
        ({"rerope_window": L - 1}, ["rerope_window <", "accepted", "leaky_k >= 1"]),
    ],
)
def test_bad_settings_are_refused_with_what_is_accepted(settings, words):
    with pytest.raises(AttnbenchError) as info:
        parse_tricks("leaky", L, **settings)
    for word in words:
        assert word in str(info.value), str(info.value)
    assert parse_tricks("leaky", L, rerope_window=L - 1, leaky_k=2.0).rerope_window == L - 1


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("eval.yarn_alpha", "40", ["yarn_beta", "0 <= yarn_alpha < yarn_beta"]),
        ("eval.yarn_beta_slow", "64", ["yarn_beta_fast", "yarn_beta_slow < yarn_beta_fast"]),
        ("eval.leaky_k", "0.5", ["leaky_k", "0 or >= 1"]),
        ("eval.yarn_beta", "0", ["yarn_beta", "> 0"]),
    ],
)
def test_bad_settings_in_a_preset_name_the_setting(key, value, words):
    with pytest.raises(AttnbenchError) as info:
        load_preset("cpu").override({key: value})
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_run_evaluates_the_new_rows_and_records_their_settings(tmp_path):
    """End to end on a tiny O: every new row evaluates (hwfa gets each block's index from the
    evaluation), and the sidecar records each row's settings as the description says them."""
    rows = "hwfa,leaky+logn,yarn-dim,rerope+logn^2"
    done, recorded, sidecar = evaluate_rows_on_tiny_o(tmp_path, rows, layers=2, yarn_beta_fast=16)
    for row in rows.split(","):
        assert done[(f"O+{row}", 16)] == done[(f"O+{row}", 64)] == "ok", row
    assert "leaky_k=per n, (n - 1 - w) / (L - 1 - w)" in recorded["O+leaky+logn"]
    assert "yarn_beta_fast=16, yarn_beta_slow=1" in recorded["O+yarn-dim"]
    assert "[p=2]" in recorded["O+rerope+logn^2"] and "[local_window=8]" in recorded["O+hwfa"]
    assert sidecar["config"]["eval"]["yarn_beta_fast"] == 16
