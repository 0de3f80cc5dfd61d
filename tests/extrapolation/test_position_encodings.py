"""The trained position encodings besides rotary (``model.position``: ALiBi, T5's bias, xPos,
NoPE), each against a direct float64 formula of its bias or rotation written out here: the slopes
and bucket rules element by element, the mixer's dense path against softmax of the written-out
scores, its SDPA path (outputs and gradients) against the dense one, bidirectional and causal,
O's scale and E's log_512(n_i). Then the models built with them, and what is refused."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.encoder import MixerSpec, ModelConfig, build_model
from attnbench.extrapolation.model.position_encodings import (
    XPOS_SCALE_BASE,
    T5Bias,
    alibi_bias,
    alibi_slopes,
    row_note,
    t5_bucket,
)
from attnbench.extrapolation.model.position_mixer import PositionMixer
from attnbench.runtime.schema import Invalid

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = dict(rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# The formulas, written out
# ---------------------------------------------------------------------------------------------


def reference_slopes(heads: int) -> list[float]:
    """Press et al. 2022's ``get_slopes``, as its reference code writes it."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_2(closest) + reference_slopes(2 * closest)[0::2][: heads - closest]


def reference_bucket(relative: int, bidirectional: bool, buckets: int, max_distance: int) -> int:
    """T5's ``_relative_position_bucket`` for one relative position j - i, in scalar arithmetic."""
    ret = 0
    n = -relative
    if bidirectional:
        buckets //= 2
        ret += buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = buckets // 2
    if n < exact:
        return ret + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (buckets - exact))
    return ret + min(large, buckets - 1)


def projections(mixer, x):
    """q, k, v [B, H, T, D] of ``mixer`` on x [B, T, C] (unrotated)."""
    B, T, _ = x.shape
    H, D = mixer.heads, mixer.head_dim
    return [w(x).view(B, T, H, D).transpose(1, 2) for w in (mixer.wq, mixer.wk, mixer.wv)]


def attend(mixer, x, scores):
    """The mixer's output for the written-out scores [B, H, T, T] (-inf where masked)."""
    B, T, C = x.shape
    v = projections(mixer, x)[2]
    o = torch.softmax(scores, dim=-1) @ v
    return mixer.wo(o.transpose(1, 2).reshape(B, T, C))


def row_scale(mixer, T: int, causal: bool) -> torch.Tensor:
    """[T, 1]: 1/sqrt(d) (O) or log_512(n_i)/sqrt(d), n_i = i + 1 causal, T otherwise (E)."""
    d = mixer.head_dim
    if mixer.mechanism == "softmax":
        return torch.full((T, 1), 1 / math.sqrt(d), dtype=torch.float64)
    n = (
        torch.arange(1, T + 1, dtype=torch.float64)
        if causal
        else torch.full((T,), float(T), dtype=torch.float64)
    )
    return (torch.log(n) / math.log(512.0) / math.sqrt(d))[:, None]


def causal_fill(scores, causal: bool):
    if not causal:
        return scores
    T = scores.shape[-1]
    later = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(later, float("-inf"))


def alibi_scores(mixer, x, causal):
    q, k, _ = projections(mixer, x)
    T = q.shape[-2]
    m = torch.tensor(reference_slopes(mixer.heads), dtype=torch.float64)
    i = torch.arange(T, dtype=torch.float64)
    distance = (i[:, None] - i[None, :]).abs()
    bias = -m[:, None, None] * distance  # (H, T, T): -m (i - j) below the diagonal
    return causal_fill(q @ k.transpose(-2, -1) * row_scale(mixer, T, causal) + bias, causal)


def t5_scores(mixer, x, causal):
    q, k, _ = projections(mixer, x)
    T = q.shape[-2]
    table = mixer.relative_bias.table.weight  # (buckets, H)
    t5 = mixer.relative_bias
    bias = torch.zeros(mixer.heads, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(T):
            b = reference_bucket(j - i, not causal, t5.buckets, t5.max_distance)
            bias[:, i, j] = table[b]
    return causal_fill(q @ k.transpose(-2, -1) * row_scale(mixer, T, causal) + bias, causal)


def xpos_scores(mixer, x, causal):
    """sum over pairs p of zeta_p^((n - m)/512) [(q1 k1 + q2 k2) cos((n - m) theta_p)
    + (q1 k2 - q2 k1) sin((n - m) theta_p)], theta_p = base^(-2p/D),
    zeta_p = (p/(D/2) + 0.4)/1.4."""
    q, k, _ = projections(mixer, x)
    T, D = q.shape[-2], q.shape[-1]
    half = D // 2
    p = torch.arange(half, dtype=torch.float64)
    theta = mixer.rope_base ** (-2 * p / D)
    zeta = (p / half + 0.4) / 1.4
    q1, q2, k1, k2 = q[..., :half], q[..., half:], k[..., :half], k[..., half:]
    scores = torch.zeros(q.shape[0], q.shape[1], T, T, dtype=torch.float64)
    for n in range(T):
        for m in range(T):
            r = n - m
            dot = (q1[..., n, :] * k1[..., m, :] + q2[..., n, :] * k2[..., m, :]) * torch.cos(
                r * theta
            ) + (q1[..., n, :] * k2[..., m, :] - q2[..., n, :] * k1[..., m, :]) * torch.sin(
                r * theta
            )
            scores[..., n, m] = (zeta ** (r / XPOS_SCALE_BASE) * dot).sum(-1)
    return causal_fill(scores * row_scale(mixer, T, causal), causal)


FORMULAS = {"alibi": alibi_scores, "t5": t5_scores, "xpos": xpos_scores}


def make_mixer(position, mechanism, causal, heads=4, d_model=32, seed=0):
    torch.manual_seed(seed)
    params = {"base": 512.0, "clip": False, "min_n": 1} if mechanism == "softmax-logn" else {}
    t5 = T5Bias(heads, 8, 12, not causal) if position == "t5" else None
    mixer = PositionMixer(d_model, heads, mechanism=mechanism, params=params, position=position,
                          causal=causal, t5=t5)  # fmt: skip
    if t5 is not None:
        torch.nn.init.normal_(t5.table.weight, std=1.0)  # biases that matter
    return mixer.double()


CASES = [
    ("alibi", False),
    ("alibi", True),
    ("t5", False),
    ("t5", True),
    ("xpos", True),
]


# ---------------------------------------------------------------------------------------------
# The slopes and the buckets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 6, 8, 12, 16])
def test_alibi_slopes_are_the_reference_codes(heads):
    assert alibi_slopes(heads) == pytest.approx(reference_slopes(heads), rel=1e-15)


def test_alibi_slopes_of_eight_heads_are_the_published_geometric_sequence():
    assert alibi_slopes(8) == pytest.approx([2.0**-k for k in range(1, 9)], rel=1e-15)


@pytest.mark.parametrize(("bidirectional", "buckets", "max_distance"),
                         [(True, 32, 128), (False, 32, 128), (True, 32, 64), (False, 32, 64),
                          (True, 8, 12), (False, 8, 12), (False, 16, 20)])  # fmt: skip
def test_t5_buckets_are_the_papers_rule(bidirectional, buckets, max_distance):
    relative = torch.arange(-300, 301)
    got = t5_bucket(relative, bidirectional, buckets, max_distance).tolist()
    want = [reference_bucket(r, bidirectional, buckets, max_distance) for r in relative.tolist()]
    assert got == want


def test_t5_buckets_saturate_beyond_max_distance():
    """Every distance from max_distance on shares the last bucket of its side: T5's bias is
    constant there, so n > L adds no new bias value once max_distance <= L."""
    far = torch.arange(64, 5000)
    assert set(t5_bucket(-far, False, 32, 64).tolist()) == {31}  # keys before the query
    assert set(t5_bucket(far, True, 32, 64).tolist()) == {31}  # keys after it
    assert set(t5_bucket(-far, True, 32, 64).tolist()) == {15}


# ---------------------------------------------------------------------------------------------
# The mixer against the formulas
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("position", "causal"), CASES)
@pytest.mark.parametrize("mechanism", ["softmax", "softmax-logn"])
def test_the_dense_path_is_softmax_of_the_written_out_scores(position, causal, mechanism):
    mixer = make_mixer(position, mechanism, causal)
    mixer.force_dense = True
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    want = attend(mixer, x, FORMULAS[position](mixer, x, causal))
    torch.testing.assert_close(mixer(x), want, **F64)


@pytest.mark.parametrize(("position", "causal"), CASES)
@pytest.mark.parametrize("mechanism", ["softmax", "softmax-logn"])
def test_the_sdpa_path_equals_the_dense_one_with_gradients(position, causal, mechanism):
    mixer = make_mixer(position, mechanism, causal, seed=1)
    x = torch.randn(3, 13, 32, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 13, 32, dtype=torch.float64)
    outs, grads = [], []
    for dense in (True, False):
        mixer.force_dense = dense
        mixer.zero_grad()
        x.grad = None
        out = mixer(x)
        out.backward(grad)
        outs.append(out.detach())
        grads.append([x.grad.clone()] + [p.grad.clone() for p in mixer.parameters()])
    torch.testing.assert_close(outs[0], outs[1], **F64)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize(("position", "causal"), CASES)
def test_float32_and_bfloat16_stay_near_the_float64_formula(position, causal):
    mixer = make_mixer(position, "softmax", causal, seed=2)
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    want = mixer(x)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        got = mixer.to(dtype)(x.to(dtype)).double()
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())
        mixer.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_alibi_bias_rounds_once_at_distances_a_low_precision_integer_cannot_hold(dtype):
    """-m |i - j| for distances up to 4095 (bfloat16 holds integers exactly only up to 256):
    the float64 product rounded once to the dtype, never a rounded distance times m."""
    slopes = torch.tensor(alibi_slopes(6), dtype=torch.float64)  # not powers of two
    got = alibi_bias(slopes.to(dtype), 4096)
    pos = torch.arange(4096, dtype=torch.float64)
    exact = -slopes.to(dtype).double()[:, None, None] * (pos[:, None] - pos[None, :]).abs()
    assert torch.equal(got, exact.to(dtype))  # one rounding of the exact value
    assert got[0, 4095, 0].item() == exact[0, 4095, 0].to(dtype).item() != 0


def test_alibi_rows_of_the_bidirectional_encoder_say_they_are_adapted():
    assert "adapted for a bidirectional encoder" in row_note("alibi", causal=False)
    assert row_note("alibi", causal=True) == ""
    assert row_note("t5", causal=False) == row_note("rope", causal=False) == ""


def test_alibi_and_t5_at_lengths_beyond_training():
    """ALiBi's bias keeps growing with the distance (-m (n - 1) at the farthest key); T5's stays
    at the last bucket's value beyond max_distance."""
    alibi = make_mixer("alibi", "softmax", True)
    far = alibi.bias(300, torch.device("cpu"), torch.float64)
    assert far[0, 299, 0].item() == pytest.approx(-0.25 * 299)  # 4 heads: m_1 = 2^(-8/4)
    t5 = make_mixer("t5", "softmax", True)
    bias = t5.bias(300, torch.device("cpu"), torch.float64)
    last = t5.relative_bias.table.weight[-1]
    torch.testing.assert_close(bias[:, 299, 12], last, **F64)  # distance 287
    torch.testing.assert_close(bias[:, 299, 0], last, **F64)


def test_e_in_the_causal_objective_scales_the_first_row_by_zero():
    """log_512(1) = 0: the first query's scores are all zero, so it attends uniformly to its one
    key (itself); query i gets log_512(i + 1) < 1 until i + 1 = 512."""
    mixer = make_mixer("alibi", "softmax-logn", True)
    scale = mixer.row_scale(64, torch.device("cpu")) * math.sqrt(mixer.head_dim)
    assert scale[0].item() == 0.0
    assert scale[63].item() == pytest.approx(math.log(64) / math.log(512))


# ---------------------------------------------------------------------------------------------
# The models built with them
# ---------------------------------------------------------------------------------------------


def tiny(position, objective="clm", layers=2, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, layers=layers, heads=4, train_len=16, position=position,
                      objective=objective, t5_buckets=8, **kw)  # fmt: skip
    return build_model(cfg, MixerSpec("softmax")).double().eval()


@pytest.mark.parametrize("position", ["rope", "alibi", "t5", "nope", "xpos"])
def test_a_causal_model_never_reads_later_bytes(position):
    model = tiny(position)
    x = torch.randint(0, 256, (2, 30))
    y = x.clone()
    y[:, 20:] = torch.randint(0, 256, (2, 10))
    torch.testing.assert_close(model(x)[:, :20], model(y)[:, :20], **F64)
    assert not torch.allclose(model(x)[:, 20:], model(y)[:, 20:])


@pytest.mark.parametrize(("position", "unchanged"), [("nope", True), ("rope", False)])
def test_nope_has_no_position_but_the_causal_mask(position, unchanged):
    """In one NoPE layer, query i reads the set of bytes 0..i with no order: reversing the bytes
    before it leaves its output as it was (RoPE's changes)."""
    model = tiny(position, layers=1)
    x = torch.randint(0, 256, (1, 12))
    y = x.clone()
    y[0, :11] = x[0, :11].flip(0)
    same = torch.allclose(model(x)[0, 11], model(y)[0, 11], rtol=1e-10, atol=1e-10)
    assert same is unchanged


def test_t5_table_is_one_parameter_shared_by_every_layer():
    model = tiny("t5", objective="mlm")
    tables = {id(block.mixer.relative_bias) for block in model.blocks}
    assert len(tables) == 1
    names = [n for n, _ in model.named_parameters() if "relative_bias" in n]
    assert names == ["blocks.0.mixer.relative_bias.table.weight"]


def test_the_masked_rows_path_agrees_with_the_whole_forward():
    for position in ("alibi", "t5"):
        model = tiny(position, objective="mlm")
        tokens = torch.randint(0, 256, (2, 13))
        rows = torch.rand(2, 13) < 0.4
        rows[0, 0] = True
        torch.testing.assert_close(model.hidden_at(tokens, rows), model(tokens)[rows], **F64)


@pytest.mark.parametrize("position", ["nope", "xpos"])
def test_nope_and_xpos_are_refused_with_the_masked_objective(position):
    with pytest.raises(Invalid, match="needs model.objective = clm"):
        ModelConfig(position=position)
    cfg = ModelConfig(d_model=32, heads=4, train_len=16)
    with pytest.raises(AttnbenchError, match="needs model.objective = clm"):
        build_model(cfg, MixerSpec("softmax", position=position))


def test_a_bias_needs_softmax_scores():
    cfg = ModelConfig(d_model=32, heads=4, train_len=16, objective="clm")
    with pytest.raises(AttnbenchError, match="scores of softmax attention"):
        build_model(cfg, MixerSpec("linear", position="alibi"))


def test_t5_refuses_a_max_distance_inside_the_exact_buckets():
    with pytest.raises(AttnbenchError, match="t5_max_distance"):
        T5Bias(4, 32, 16, bidirectional=False)
    T5Bias(4, 32, 17, bidirectional=False)
    T5Bias(4, 32, 9, bidirectional=True)
