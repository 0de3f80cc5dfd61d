"""The AFT family: parameters beyond the defaults, exact stabilisation, causality, the layer at
other lengths, memory, FLOPs, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbench import api, registry
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from attnbench.layers import make_layer
from attnbench.measure.memory import cpu_peak
from attnbench.variants.aft.dense import aft_dense, band_to_dense

FULL, LOCAL = registry.get("aft-full"), registry.get("aft-local")
SIMPLE, CONV = registry.get("aft-simple"), registry.get("aft-conv")
SHAPE = Shape(2, 2, 29, 8)


def _check(
    mech,
    params,
    causal,
    *,
    shape=SHAPE,
    scale_k=1.0,
    scale_bias=1.0,
    dtype=torch.float32,
    seed=None,
    set_extras=None,
):
    """Failed verdicts (outputs and gradients, attnbench.core.testing's rule against the float64
    oracle) of the default path; K and the extra inputs are scaled in float64, then rounded to
    ``dtype`` once; ``set_extras`` overrides extra inputs (float64 values)."""
    params = mech.resolve(params)
    seed = shape.seq_len if seed is None else seed
    inputs = make_inputs(mech, shape, params, dtype=torch.float64, seed=seed)
    inputs["k"] = inputs["k"] * scale_k
    for e in mech.extras_for(params):
        inputs[e.name] = inputs[e.name] * scale_bias
    inputs.update(set_extras or {})
    inputs = {name: x.to(dtype) for name, x in inputs.items()}
    fast = mech.default_path
    with torch.no_grad():
        assert torch.isfinite(fast(**inputs, causal=causal, **params)).all()
    verdicts = compare_paths(fast, mech.reference, inputs, {"causal": causal, **params})
    return [str(v) for v in verdicts if not v.ok]


CASES = [
    (FULL, {}, False),
    (FULL, {"chunk": 8}, True),
    (FULL, {"factorized": True, "rank": 4}, False),
    (FULL, {"factorized": True, "rank": 4, "chunk": 5}, True),
    (LOCAL, {"s": 4}, False),
    (LOCAL, {"s": 4}, True),
    (SIMPLE, {}, False),
    (SIMPLE, {}, True),
    (CONV, {"s": 5}, False),
]
IDS = [f"{m.name}-{'causal' if c else 'bidir'}-{p}" for m, p, c in CASES]


# -- parameters the registry-wide test does not reach ---------------------------------------------


@pytest.mark.parametrize(
    ("mech", "params", "causal"),
    [(FULL, {"chunk": c}, True) for c in (1, 5, 29, 64)]
    + [(FULL, {"factorized": True, "rank": 4}, c) for c in (False, True)]
    + [(LOCAL, {"s": s}, c) for s in (1, 3, 29, 40) for c in (False, True)]
    + [(CONV, {"s": s}, False) for s in (1, 2, 6, 41)],
    ids=lambda x: getattr(x, "name", str(x)),
)
def test_efficient_path_matches_dense(mech, params, causal):
    assert not _check(mech, params, causal)


def test_local_with_s_at_least_t_is_full():
    """The band covers every pair when s >= T: aft-local is aft-full with the band as w."""
    params = LOCAL.resolve({"s": 12})
    inputs = make_inputs(LOCAL, Shape(1, 2, 12, 4), params, dtype=torch.float64)
    w_full = band_to_dense(inputs["w"], 12)
    for causal in (False, True):
        a = LOCAL.default_path(**inputs, causal=causal, **params)
        b = FULL.default_path(
            **{n: inputs[n] for n in "qkv"}, causal=causal, **FULL.defaults, w=w_full
        )
        torch.testing.assert_close(a, b)


# -- numerical stability ------------------------------------------------------------------------


@pytest.mark.parametrize(("mech", "params", "causal"), CASES, ids=IDS)
def test_keys_times_50_stay_finite_and_exact_in_fp32(mech, params, causal):
    """K x 50 (exp(K) overflows float32 without stabilisation; a shared stabiliser underflows
    causal rows): the fp32 efficient path is finite and within the tolerance rule of the fp64
    oracle, outputs and gradients."""
    assert not _check(mech, params, causal, scale_k=50.0)


@pytest.mark.parametrize(("mech", "params", "causal"), CASES[:6] + CASES[8:], ids=IDS[:6] + IDS[8:])
def test_large_biases_are_stabilised_exactly(mech, params, causal):
    """Biases x 10: the stabiliser must cancel exactly (a per-key maximum, as in labml, does
    not, and is off by O(1) here)."""
    assert not _check(mech, params, causal, scale_bias=10.0)


def test_per_key_max_would_not_cancel():
    """The point of the test above: labml's AFT-local subtracts max over queries of w[t, t'] for
    each key t' (``pos_bias.max(dim=0)``); that factor differs between keys, so it does not
    cancel, and the result moves by O(1) with biases of order 3."""
    q, k, v = (torch.randn(1, 1, 6, 3, dtype=torch.float64) for _ in range(3))
    w = torch.randn(6, 6, dtype=torch.float64) * 3
    exact = aft_dense(q, k, v, w, causal=False)
    exp_w = torch.exp(w - w.amax(0, keepdim=True))  # (T, T'): per-key maximum, labml
    exp_k = torch.exp(k[0, 0] - k[0, 0].amax(0, keepdim=True))  # (T', D)
    labml = torch.sigmoid(q) * (exp_w @ (exp_k * v[0, 0])) / (exp_w @ exp_k)
    assert (labml - exact).abs().max() > 1e-2
    ours = FULL.default_path(q, k, v, causal=False, **FULL.defaults, w=w)
    torch.testing.assert_close(ours, exact)


# -- issue 11: the separable stabiliser underflowing --------------------------------------------

ISSUE_11 = Shape(1, 2, 129, 16)  # 4128 outputs: before the fix, 1 to 13 NaN in each case


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("causal", "params"),
    [(False, {}), (True, {}), (True, {"chunk": 8})],
    ids=["bidir", "causal-chunk32", "causal-chunk8"],
)
def test_full_float16_keys_and_bias_of_std_5_at_t_129(causal, params, seed):
    """Issue 11: float16, K and w ~ N(0, 5^2), T = 129 was NaN in every draw, both directions
    (causal with chunk < T), while the float16 reference is finite. Now finite and within the
    tolerance rule against the float64 oracle, outputs and gradients."""
    failed = _check(
        FULL,
        params,
        causal,
        shape=ISSUE_11,
        scale_k=5.0,
        scale_bias=5.0,
        dtype=torch.float16,
        seed=seed,
    )
    assert not failed


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_full_float32_span_of_keys_and_bias_beyond_100(causal):
    """Issue 11, float32: K and w ~ N(0, 40^2) at T = 129 (spans of K + w ~ 300) was NaN in
    ~4 % of the entries; these go through the float64 products now."""
    failed = _check(FULL, {"chunk": 16}, causal, shape=ISSUE_11, scale_k=40.0, scale_bias=40.0)
    assert not failed


def _separable_counterexample(span: float, dtype: torch.dtype, causal: bool):
    """Inputs no per-row, per-feature (or per-key) stabiliser can handle (aft.softmax_sums): the
    off-diagonal (row, feature) pairs have their maximum ``span`` below a_t + b_f. Causal, the
    pattern sits in the rectangle rows {2, 3} x keys {0, 1} that chunk = 1 makes a product, with
    the later keys 2 span further down so that the rectangle's terms are the ones that count."""
    pattern = torch.tensor([[0.0, -span], [-span, 0.0]], dtype=torch.float64)
    if not causal:
        w, kf = pattern, pattern
    else:
        w = torch.full((4, 4), -2 * span, dtype=torch.float64)
        w[2:, :2] = pattern
        kf = torch.zeros(4, 2, dtype=torch.float64)
        kf[:2] = pattern
    t = w.shape[0]
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(1, 1, t, 2, generator=gen, dtype=torch.float64)
    q = torch.randn(1, 1, t, 2, generator=gen, dtype=torch.float64)
    inputs = {"q": q, "k": kf[None, None], "v": v, "w": w}
    return {name: x.to(dtype) for name, x in inputs.items()}


@pytest.mark.parametrize(
    ("dtype", "span"),
    [(torch.float16, 20.0), (torch.float32, 120.0), (torch.float32, 1000.0), (torch.float64, 1e3)],
    ids=["fp16-span20", "fp32-span120", "fp32-span1000", "fp64-span1000"],
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_full_exact_where_no_separable_stabiliser_is(dtype, span, causal):
    """The two-key counterexample of aft.softmax_sums: 0/0 before issue 11's fix. A span of 120
    in float32 needs the float64 products, 1000 the dense recomputation (e^-1000 underflows
    float64 too). Outputs and gradients are finite and match the float64 reference."""
    params = {**FULL.defaults, "chunk": 1}
    inputs = _separable_counterexample(span, dtype, causal)
    leaves = {n: x.clone().requires_grad_(True) for n, x in inputs.items()}
    out = FULL.default_path(**leaves, causal=causal, **params)
    exact = FULL.reference(**{n: x.double() for n, x in inputs.items()}, causal=causal, **params)
    torch.testing.assert_close(out.double(), exact, rtol=2 * torch.finfo(dtype).eps, atol=0)
    out.sum().backward()
    for name, leaf in leaves.items():
        assert torch.isfinite(leaf.grad).all(), name


def test_full_unit_inputs_stay_one_float32_product(monkeypatch):
    """The certificate is free for ordinary inputs: the products are taken once, in float32;
    only stretched inputs (K and w ~ N(0, 20^2), T = 1024) take them again in float64."""
    from attnbench.variants.aft import full

    calls = []
    real = full._all_keys

    def spy(w, kf, vf):
        calls.append(kf.dtype)
        return real(w, kf, vf)

    monkeypatch.setattr(full, "_all_keys", spy)
    for std, t, expected in (
        (1.0, 256, [torch.float32]),
        (20.0, 1024, [torch.float32, torch.float64]),
    ):
        inputs = make_inputs(FULL, Shape(1, 1, t, 4), FULL.defaults, dtype=torch.float64, seed=t)
        inputs["k"], inputs["w"] = inputs["k"] * std, inputs["w"] * std
        inputs = {n: x.half() for n, x in inputs.items()}
        calls.clear()
        FULL.default_path(**inputs, causal=False, **FULL.defaults)
        assert calls == expected, std


@pytest.mark.parametrize(
    ("dtype", "t", "beta", "gamma", "scale_k"),
    [
        (torch.float16, 5, -100.0, 1.0, 1.0),
        (torch.float32, 5, -100.0, 1.0, 1.0),
        (torch.float16, 7, -100.0, 1.0, 20.0),
        (torch.float32, 7, -100.0, 1.0, 20.0),
        (torch.float16, 129, 0.0, 20.0, 1.0),
    ],
    ids=[
        "fp16-beta-100",
        "fp32-beta-100",
        "fp16-beta-100-K20",
        "fp32-beta-100-K20",
        "fp16-gamma20",
    ],
)
def test_conv_extreme_kernel_is_finite_and_exact(dtype, t, beta, gamma, scale_k):
    """Issue 11 for aft-conv: a large negative beta (every key inside the kernel at T <= s: the
    taps' e^beta underflow) was 0/0 in float16 (24 of 40 outputs) and 1.5 % off in float32;
    gamma ~ 20 (taps up to e^60) overflowed float16 (half the outputs NaN). Now finite and within
    the tolerance rule, outputs and gradients."""
    heads = 2
    gen = torch.Generator().manual_seed(t)
    extras = {
        "beta": torch.full((heads,), beta, dtype=torch.float64),
        "gamma": torch.randn(heads, generator=gen, dtype=torch.float64) * gamma,
    }
    shape = Shape(1, heads, t, 4)
    failed = _check(
        CONV, {"s": 7}, False, shape=shape, scale_k=scale_k, dtype=dtype, set_extras=extras
    )
    assert not failed


# -- causality ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "params"),
    [(FULL, {"chunk": 8}), (LOCAL, {"s": 4}), (SIMPLE, {})],
    ids=lambda v: getattr(v, "name", None) or str(v),
)
def test_causal_outputs_ignore_later_positions_and_future_biases(mech, params):
    """Changing q, k, v at positions >= 13 and every bias entry of a pair t' > t leaves outputs
    0..12 bit-for-bit unchanged."""
    params = mech.resolve(params)
    inputs = make_inputs(mech, SHAPE, params, seed=2)
    changed = {n: x.clone() for n, x in inputs.items()}
    for n in "qkv":
        changed[n][:, :, 13:] = torch.randn_like(changed[n][:, :, 13:]) * 3
    if "w" in changed and mech is FULL:
        changed["w"] = changed["w"] + torch.randn_like(changed["w"]).triu(1) * 5
    if "w" in changed and mech is LOCAL:
        s = params["s"]
        changed["w"][:, s:] = torch.randn_like(changed["w"][:, s:])  # offsets t' - t > 0
    fn = mech.default_path
    a, b = fn(**inputs, causal=True, **params), fn(**changed, causal=True, **params)
    assert torch.equal(a[:, :, :13], b[:, :, :13])
    assert not torch.equal(a[:, :, 13:], b[:, :, 13:])


# -- the layer and other lengths ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "causal"),
    [
        ("aft-full", {}, False),
        ("aft-full", {}, True),
        ("aft-full", {"factorized": True, "rank": 8}, False),
        ("aft-local", {"s": 5}, False),
        ("aft-local", {"s": 5}, True),
        ("aft-simple", {}, True),
        ("aft-conv", {"s": 3}, False),
    ],
    ids=str,
)
def test_layer_forward_backward_at_and_beyond_max_len(name, params, causal):
    torch.manual_seed(0)
    layer = make_layer(name, 16, 2, causal=causal, params=params, max_len=12)
    for p in layer.parameters():  # a trained-looking layer: non-zero biases
        torch.nn.init.normal_(p, std=0.3)
    for t in (5, 12, 23):
        y = layer(torch.randn(2, t, 16))
        assert y.shape == (2, t, 16)
        y.square().sum().backward()
        for n, p in layer.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), (n, t)
        layer.zero_grad()


def test_layer_bias_at_other_lengths_is_the_documented_one():
    """T <= max_len: w[:T, :T]; T > max_len: pairs touching a position >= max_len get bias 0."""
    layer = make_layer("aft-full", 8, 2, params={}, max_len=6)
    torch.nn.init.normal_(layer.bias["w"])
    w = layer.bias["w"].detach()
    torch.testing.assert_close(layer.extras(4)["w"], w[:4, :4])
    big = layer.extras(9)["w"]
    torch.testing.assert_close(big[:6, :6], w)
    assert big[6:].abs().sum() == 0 and big[:, 6:].abs().sum() == 0

    local = make_layer("aft-local", 8, 2, params={"s": 3}, max_len=6)
    torch.nn.init.normal_(local.bias["w"])
    dense = band_to_dense(local.extras(9)["w"], 3)  # (9, 9) as the reference sees it
    torch.testing.assert_close(dense[:6, :6], band_to_dense(local.bias["w"].detach(), 3))
    assert dense[6:].abs().sum() == 0 and dense[:, 6:].abs().sum() == 0

    fact = make_layer("aft-full", 8, 2, params={"factorized": True, "rank": 4}, max_len=6)
    ex = fact.extras(9)
    w9 = ex["w_u"] @ ex["w_v"].T
    torch.testing.assert_close(w9[:6, :6], fact.bias["w_u"] @ fact.bias["w_v"].T)
    assert w9[6:].abs().sum() == 0 and w9[:, 6:].abs().sum() == 0


def test_layer_trained_short_reads_long_bidirectionally():
    """The extrapolation suite's use: built for 64, evaluated at 1024, bidirectional."""
    for name in ("aft-full", "aft-local", "aft-simple", "aft-conv"):
        layer = make_layer(name, 16, 2, causal=False, max_len=64)
        with torch.no_grad():
            y = layer(torch.randn(1, 1024, 16))
        assert y.shape == (1, 1024, 16) and torch.isfinite(y).all(), name


def test_layer_starts_as_aft_simple():
    """The paper's init (w = 0; gamma = beta = 0): every fresh AFT layer computes AFT-simple."""
    x = torch.randn(2, 10, 16)
    for name in ("aft-full", "aft-local", "aft-conv"):
        torch.manual_seed(0)
        layer = make_layer(name, 16, 2, max_len=10)
        torch.manual_seed(0)
        simple = make_layer("aft-simple", 16, 2, max_len=10)
        torch.testing.assert_close(layer(x), simple(x), msg=name)


# -- memory and FLOPs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "params", "causal"),
    [(SIMPLE, {}, True), (SIMPLE, {}, False), (LOCAL, {"s": 8}, True), (CONV, {}, False)],
    ids=["simple-causal", "simple-bidir", "local-causal", "conv"],
)
def test_memory_is_linear_in_n(mech, params, causal):
    """Peak bytes of forward + backward (deterministic storage count) at 2n vs n: ~2x, not 4x."""
    params = mech.resolve(params)

    def peak(n):
        inputs = make_inputs(mech, Shape(1, 2, n, 16), params, requires_grad=True)
        grad_out = torch.randn(1, 2, n, 16)

        def run():
            o = mech.default_path(**inputs, causal=causal, **params)
            return torch.autograd.grad(o, list(inputs.values()), grad_out)

        return cpu_peak(run).bytes

    assert 1.8 < peak(1024) / peak(512) < 2.2


@pytest.mark.parametrize(
    ("mech", "params", "uncounted"),
    [
        (FULL, {}, 0),
        (FULL, {"factorized": True, "rank": 4}, 0),
        (CONV, {"s": 5}, 1),  # the sums outside the kernel are cumsums, not counted by torch
    ],
    ids=["full", "full-factorized", "conv"],
)
def test_flops_match_what_the_path_issues(mech, params, uncounted):
    from torch.utils.flop_counter import FlopCounterMode

    params = mech.resolve(params)
    inputs = make_inputs(mech, SHAPE, params)
    with FlopCounterMode(display=False) as counter:
        mech.default_path(**inputs, causal=False, **params)
    sums = 4 * SHAPE.batch * SHAPE.heads * SHAPE.seq_len * SHAPE.head_dim * uncounted
    assert mech.forward_flops(SHAPE, False, params) == counter.get_total_flops() + sums


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kwargs", "words"),
    [
        ("aft-full", {"chunk": 0}, "chunk"),
        ("aft-full", {"rank": 0, "factorized": True}, "rank"),
        ("aft-local", {"s": 0}, "s="),
        ("aft-local", {"s": -2}, "s="),
        ("aft-conv", {"s": 0}, "s="),
        ("aft-full", {"factorized": "maybe"}, "factorized"),
    ],
)
def test_bad_parameters_are_one_line_errors(name, kwargs, words):
    q = k = v = torch.randn(1, 2, 5, 4)
    with pytest.raises(AttnbenchError, match=words) as info:
        api.attention(name, q, k, v, **kwargs)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_bias_that_does_not_match_the_length_is_an_error():
    q = k = v = torch.randn(1, 2, 5, 4)
    cases = [
        ("aft-full", {"w": torch.zeros(6, 6)}),
        ("aft-full", {"factorized": True, "w_u": torch.zeros(4, 128), "w_v": torch.zeros(5, 128)}),
        ("aft-local", {"s": 2, "w": torch.zeros(5, 2)}),
        ("aft-conv", {"kernel": torch.zeros(2, 3), "gamma": torch.zeros(2), "beta": torch.ones(2)}),
    ]
    for name, kwargs in cases:
        with pytest.raises(AttnbenchError, match="shape") as info:
            api.attention(name, q, k, v, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(AttnbenchError, match="needs the extra input 'w'"):
        api.attention("aft-full", q, k, v)


def test_forms_that_do_not_exist_are_errors():
    q = k = v = torch.randn(1, 2, 5, 4)
    extras = {"kernel": torch.zeros(2, 7), "gamma": torch.zeros(2), "beta": torch.zeros(2)}
    with pytest.raises(AttnbenchError, match="no causal form"):
        api.attention("aft-conv", q, k, v, causal=True, **extras)
    with pytest.raises(AttnbenchError, match="no causal form"):
        make_layer("aft-conv", 8, 2, causal=True)
    with pytest.raises(AttnbenchError, match="elementwise"):
        api.attention("aft-simple", q, k, F.pad(v, (0, 1)))
