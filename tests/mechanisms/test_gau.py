"""GAU, FLASH and MC-TFM (Hua et al. 2022; Su 2022): normalisers against literal and hand-checked
values, the non-default parameters against the reference, causality, layers, memory, half
precision, FLOPs and bad input. The default parameters are covered by
tests/mechanisms/test_paths.py."""

from __future__ import annotations

import math

import pytest
import torch
import typer
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from attnbench import registry
from attnbench.api import attention
from attnbench.cli.common import Group
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import FLOOR, compare_paths
from attnbench.layers import Rotary, make_layer
from attnbench.measure.memory import cpu_peak
from attnbench.variants.gau import overflow_bound

GAU = registry.get("gau")
FLASH = registry.get("flash")
MC = registry.get("mc-softmax")
F64 = torch.float64


def run(mech, path, causal=False, **tensors_and_params):
    """Call one path by name through the api (validation included)."""
    t = tensors_and_params
    return attention(mech, t.pop("q"), t.pop("k"), t.pop("v"), causal=causal, path=path, **t)


def inputs(mech, shape, params, dtype=torch.float32, seed=0, requires_grad=False):
    shape = mech.shape_for(shape, mech.resolve(params))
    return make_inputs(mech, shape, params, dtype=dtype, seed=seed, requires_grad=requires_grad)


def assert_paths_agree(mech, shape, params, causal, dtype=torch.float32):
    params = mech.resolve(params)
    x = inputs(mech, shape, params, dtype=dtype, seed=shape.seq_len)
    verdicts = compare_paths(
        mech.path("efficient"), mech.reference, x, {"causal": causal, **params}
    )
    failed = [str(v) for v in verdicts if not v.ok]
    assert not failed, "; ".join(failed)


# --------------------------------------------------------------------------------------------
# GAU: normalisers
# --------------------------------------------------------------------------------------------


def literal_relu2(q, k, v, causal, norm):
    """o_i = sum over visible j of max(q_i . k_j, 0)^2 v_j / (n_i s) or / n_i^2, with loops."""
    B, H, T, s = q.shape
    o = torch.zeros(B, H, T, v.shape[-1], dtype=F64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                keys = range(i + 1) if causal else range(T)
                n = len(keys)
                for j in keys:
                    x = max(float(q[b, h, i] @ k[b, h, j]), 0.0)
                    o[b, h, i] += x * x * v[b, h, j] / (n * s if norm == "ns" else n * n)
    return o


@pytest.mark.parametrize("norm", ["ns", "n2"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("path", ["reference", "efficient"])
def test_relu2_norms_against_literal_loops(norm, causal, path):
    x = inputs(GAU, Shape(1, 2, 9, 3), {}, dtype=F64, seed=3)
    want = literal_relu2(x["q"], x["k"], x["v"], causal, norm)
    got = run("gau", path, causal, norm=norm, tile=4, **x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_causal_rows_divide_by_their_own_count():
    """q = k = 1 (s = 1): every score is 1, so row i averages the values it sees."""
    q = k = torch.ones(1, 1, 3, 1, dtype=F64)
    v = torch.tensor([1.0, 2.0, 4.0], dtype=F64).view(1, 1, 3, 1)
    for path in ("reference", "efficient"):
        ns = run("gau", path, True, q=q, k=k, v=v, norm="ns")
        n2 = run("gau", path, True, q=q, k=k, v=v, norm="n2")
        both = run("gau", path, False, q=q, k=k, v=v)
        assert ns.flatten().tolist() == pytest.approx([1.0, 3 / 2, 7 / 3])
        assert n2.flatten().tolist() == pytest.approx([1.0, 3 / 4, 7 / 9])
        assert both.flatten().tolist() == pytest.approx([7 / 3] * 3)


# --------------------------------------------------------------------------------------------
# GAU: the other scorings and non-default knobs, efficient against reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"norm": "n2"},
        {"tile": 5},
        {"scoring": "softmax"},
        {"scoring": "softmax_plus"},
        {"scoring": "softmax_plus", "min_n": 16},
    ],
    ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()),
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_gau_options_match_reference(params, causal):
    assert_paths_agree(GAU, Shape(2, 2, 37, 16), params, causal)


@pytest.mark.parametrize("dv", [8, 16, 40])
def test_gau_softmax_any_value_width(dv):
    """SDPA needs equal widths: the efficient path pads q, k or v; the result must not move."""
    for scoring in ("softmax", "softmax_plus"):
        x = inputs(GAU, Shape(1, 2, 29, 16), {}, seed=dv)
        x["v"] = torch.randn(1, 2, 29, dv)
        want = run("gau", "reference", True, scoring=scoring, **x)
        got = run("gau", "efficient", True, scoring=scoring, **x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_softmax_plus_is_softmax_at_512_keys():
    """log_512(512) = 1: with 512 keys softmax_plus is plain softmax; causal rows differ."""
    x = inputs(GAU, Shape(1, 1, 512, 8), {}, dtype=F64)
    for path in ("reference", "efficient"):
        plus = run("gau", path, False, scoring="softmax_plus", **x)
        plain = run("gau", path, False, scoring="softmax", **x)
        torch.testing.assert_close(plus, plain, rtol=1e-12, atol=1e-12)
        causal_plus = run("gau", path, True, scoring="softmax_plus", **x)
        causal_plain = run("gau", path, True, scoring="softmax", **x)
        assert torch.equal(causal_plus[..., 0, :], x["v"][..., 0, :])  # log 1 = 0: row 0 is v_0
        torch.testing.assert_close(causal_plus[..., -1, :], causal_plain[..., -1, :])
        assert not torch.allclose(causal_plus[..., 100, :], causal_plain[..., 100, :])


# --------------------------------------------------------------------------------------------
# FLASH and MC-TFM: hand-checked normalisers, chunk sizes that do not divide T
# --------------------------------------------------------------------------------------------


def flash_case(q, k, q_lin, k_lin):
    """T = 5, c = 2, s = 1: chunks {0, 1}, {2, 3}, {4}; v = 1..5."""
    ones = torch.ones(1, 1, 5, 1, dtype=F64)
    v = torch.arange(1.0, 6.0, dtype=F64).view(1, 1, 5, 1)
    return {"q": q * ones, "k": k * ones, "v": v, "q_lin": q_lin * ones, "k_lin": k_lin * ones}


@pytest.mark.parametrize("path", ["reference", "efficient"])
def test_flash_global_part_counts_the_tokens_summed(path):
    """Local part off (q = k = 0), global on: causal row i averages the earlier chunks' values,
    divided by the tokens summed (2, then 4), not by n = 5 as in the paper's appendix code."""
    case = flash_case(0.0, 0.0, 1.0, 1.0)
    causal = run("flash", path, True, chunk=2, **case).flatten().tolist()
    assert causal == pytest.approx([0.0, 0.0, 3 / 2, 3 / 2, 10 / 4])
    both = run("flash", path, False, chunk=2, **case).flatten().tolist()
    assert both == pytest.approx([3.0] * 5)  # 15 / 5


@pytest.mark.parametrize("path", ["reference", "efficient"])
def test_flash_local_part_counts_the_keys_seen(path):
    """Global part off, every score 1: the partial last chunk {4} divides by 1, not c = 2; causal
    rows divide by their position in the chunk plus one."""
    case = flash_case(1.0, 1.0, 0.0, 0.0)
    both = run("flash", path, False, chunk=2, **case).flatten().tolist()
    assert both == pytest.approx([3 / 2, 3 / 2, 7 / 2, 7 / 2, 5.0])
    causal = run("flash", path, True, chunk=2, **case).flatten().tolist()
    assert causal == pytest.approx([1.0, 3 / 2, 3.0, 7 / 2, 5.0])
    n2 = run("flash", path, False, chunk=2, norm="n2", **case).flatten().tolist()
    assert n2 == pytest.approx([3 / 4, 3 / 4, 7 / 4, 7 / 4, 5.0])


@pytest.mark.parametrize("chunk", [1, 7, 16, 40])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("mech", [FLASH, MC], ids=["flash", "mc-softmax"])
def test_mixed_chunk_sizes_match_reference(mech, causal, chunk):
    """T = 37: c = 1 (no local context), 7 and 16 (partial last chunk), 40 (one chunk, c > T)."""
    assert_paths_agree(mech, Shape(2, 2, 37, 8), {"chunk": chunk}, causal)


def test_flash_n2_matches_reference():
    for causal in (False, True):
        assert_paths_agree(FLASH, Shape(1, 2, 50, 8), {"chunk": 16, "norm": "n2"}, causal)


# --------------------------------------------------------------------------------------------
# Causality: changing later tokens leaves earlier outputs alone (every efficient form)
# --------------------------------------------------------------------------------------------

CAUSAL_CASES = [
    (GAU, {"tile": 8}),
    (GAU, {"scoring": "softmax"}),
    (GAU, {"scoring": "softmax_plus"}),
    (FLASH, {"chunk": 8}),
    (MC, {"chunk": 8}),
]


@pytest.mark.parametrize(
    ("mech", "params"), CAUSAL_CASES, ids=lambda x: x.name if hasattr(x, "name") else str(x)
)
def test_causality(mech, params):
    x = inputs(mech, Shape(1, 2, 41, 8), params, dtype=F64)
    cut = 19  # inside a chunk and a tile
    y = {name: t.clone() for name, t in x.items()}
    for t in y.values():
        t[:, :, cut:] = torch.randn_like(t[:, :, cut:]) * 3
    a = run(mech, "efficient", True, **x, **params)
    b = run(mech, "efficient", True, **y, **params)
    torch.testing.assert_close(a[:, :, :cut], b[:, :, :cut], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, :, cut:], b[:, :, cut:])


# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gau", "flash-quad", "flash", "mc-softmax"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_layer_shapes_and_gradients(name, causal):
    params = {"gau": {"s": 16}, "flash": {"s": 16, "chunk": 8}, "mc-softmax": {"chunk": 8}}
    params["flash-quad"] = params["gau"]
    params = params[name]
    torch.manual_seed(0)
    rope = Rotary(8)  # built for d_model / heads = 8; GAU/FLASH re-create it at width s = 16
    layer = make_layer(name, d_model=32, heads=4, causal=causal, params=params, rope=rope)
    x = torch.randn(2, 21, 32, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 21, 32)
    y.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    missing = [n for n, p in layer.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing, f"no gradient reaches {missing}"
    if causal:  # the layer as a whole is causal too
        x2 = x.detach().clone()
        x2[:, 15:] += 1.0
        with torch.no_grad():
            torch.testing.assert_close(layer(x2)[:, :15], y.detach()[:, :15])


@pytest.mark.parametrize("name", ["gau", "flash"])
def test_a_fresh_layer_attends_from_the_first_step(name):
    """With the model's N(0, 0.02) weights, gamma ~ N(0, 0.02) left A ~ 1e-11 and the gradients
    of the maps ~1e-12 (below Adam's eps: the encoder never trained); gamma ~ 1 + N(0, 0.02)
    makes A a working attention and gives the maps real gradients."""
    torch.manual_seed(0)
    params = {"s": 32, "chunk": 16} if name == "flash" else {"s": 32}
    layer = make_layer(name, d_model=64, heads=1, params=params)
    for m in layer.modules():  # the extrapolation model's init of every Linear
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.02)
            torch.nn.init.zeros_(m.bias)
    x = torch.nn.functional.layer_norm(torch.randn(2, 64, 64), (64,))
    y = layer(x)
    (y * torch.randn_like(y)).sum().backward()  # a loss with O(1) gradient at the output
    g = layer.maps.gamma
    assert (g.detach() - 1).abs().max() < 0.2  # 1 + N(0, 0.02)
    fresh = g.grad.abs().max().item()
    assert fresh > 1e-7, fresh  # well above Adam's eps (1e-8): seen 1.3e-6 (gau), 4e-4 (flash)
    with torch.no_grad():  # the paper's gamma ~ N(0, 0.02): the same layer, gradients vanish
        g.normal_(std=0.02)
    layer.zero_grad()
    y = layer(x)
    (y * torch.randn_like(y)).sum().backward()
    paper = g.grad.abs().max().item()
    assert fresh > 30 * paper, (fresh, paper)  # seen 4e-12 (gau, x3e5 less), 9e-6 (flash)


def test_layer_records():
    assert GAU.whole_block and FLASH.whole_block and not MC.whole_block
    assert registry.get("flash-quad") is GAU
    layer = make_layer("gau", d_model=24, heads=3)
    e, s = 2 * 24, 128
    assert layer.hidden.weight.shape == (2 * e + s, 24)
    assert layer.wo.weight.shape == (24, e)


# --------------------------------------------------------------------------------------------
# Memory: FLASH (and the GAU core) stay linear in n
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "params"),
    [(FLASH, {"chunk": 64}), (MC, {"chunk": 64}), (GAU, {"tile": 64})],
    ids=["flash", "mc-softmax", "gau"],
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_peak_memory_is_linear_in_n(mech, params, causal):
    def peak(T):
        x = inputs(mech, Shape(1, 1, T, 16), params, requires_grad=True)

        def fwd_bwd():
            o = mech.path("efficient")(**x, causal=causal, **mech.resolve(params))
            o.sum().backward()

        return cpu_peak(fwd_bwd).bytes

    ratio = peak(1024) / peak(512)
    assert 1.9 < ratio < 2.1, f"peak bytes grew {ratio:.2f}x when n doubled"


# --------------------------------------------------------------------------------------------
# Half precision: relu² stays finite at realistic scales
# --------------------------------------------------------------------------------------------


def test_literal_relu2_overflows_where_the_folded_form_does_not():
    """q, k of rms 2.5 at s = 128: some q.k pass 255.9, where relu²(q.k) is inf in float16."""
    torch.manual_seed(0)
    T, s = 1024, 128
    q, k = 2.5 * torch.randn(1, 1, T, s, dtype=F64), 2.5 * torch.randn(1, 1, T, s, dtype=F64)
    v = torch.randn(1, 1, T, 2 * s, dtype=F64)
    assert torch.isinf((q.half() @ k.half().transpose(-2, -1)).relu().square()).any()
    assert (q @ k.transpose(-2, -1)).abs().max() < overflow_bound(T, s)
    oracle = run("gau", "reference", False, q=q, k=k, v=v)
    for dtype in (torch.float16, torch.bfloat16):
        o = run("gau", "efficient", False, q=q.to(dtype), k=k.to(dtype), v=v.to(dtype))
        assert torch.isfinite(o).all()
        rel = (o.double() - oracle).abs().max() / oracle.abs().max()
        assert rel < FLOOR[dtype], f"{dtype}: relative error {rel:.3g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_half_precision_flash_and_gau_fwd_bwd(dtype, causal):
    """s = 128, e = 256, n = 1024, q and k of rms 2.5, v swish-like (positive mean): outputs and
    gradients finite, outputs within the dtype's floor of the float64 reference. rms 2.5 puts
    the largest q.k past 255.9, where the literal relu²(q.k) would be inf in float16."""
    torch.manual_seed(1)
    T, s = 1024, 128
    base = {
        "q": 2.5 * torch.randn(1, 1, T, s, dtype=F64),
        "k": 2.5 * torch.randn(1, 1, T, s, dtype=F64),
        "v": torch.nn.functional.silu(2 * torch.randn(1, 1, T, 2 * s, dtype=F64)),
        "q_lin": 2 * torch.randn(1, 1, T, s, dtype=F64),
        "k_lin": 2 * torch.randn(1, 1, T, s, dtype=F64),
    }
    for name, extra in (("gau", ()), ("flash", ("q_lin", "k_lin"))):
        keep = {n: t for n, t in base.items() if n in ("q", "k", "v", *extra)}
        oracle = run(name, "reference", causal, **keep)
        x = {n: t.to(dtype).requires_grad_() for n, t in keep.items()}
        o = run(name, "efficient", causal, **{n: t for n, t in x.items()})
        o.float().square().mean().backward()
        assert torch.isfinite(o).all()
        assert all(torch.isfinite(t.grad).all() for t in x.values())
        rel = (o.double() - oracle).abs().max() / oracle.abs().max()
        assert rel < FLOOR[dtype], f"{name} {dtype}: relative error {rel:.3g}"


def test_overflow_bound():
    # 1/(n s): one row may carry |q.k| up to sqrt(65504 s), independent of n.
    assert overflow_bound(4096, 128) == pytest.approx(math.sqrt(65504 * 128))
    # 1/n^2: the bound grows like sqrt(n).
    assert overflow_bound(4096, 128, "n2") == pytest.approx(math.sqrt(65504 * 4096))


# --------------------------------------------------------------------------------------------
# FLOPs: the declared count equals what the efficient path issues (bidirectional)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "params", "T"),
    [(GAU, {"tile": 16}, 50), (FLASH, {"chunk": 16}, 64), (FLASH, {"chunk": 16}, 50)],
    ids=["gau", "flash", "flash-partial"],
)
def test_flops_match_the_flop_counter(mech, params, T):
    params = mech.resolve(params)
    shape = mech.shape_for(Shape(2, 3, T, 8), params)
    x = make_inputs(mech, shape, params)
    with FlopCounterMode(display=False) as counter:
        mech.path("efficient")(**x, causal=False, **params)
    assert counter.get_total_flops() == mech.forward_flops(shape, False, params)


def test_causal_flops_count_only_what_is_summed():
    p = FLASH.resolve({"chunk": 4})
    shape = Shape(1, 1, 10, 2, value_dim=3)  # chunks of 4, 4, 2
    local = 2 * (10 + 10 + 3) * (2 + 3)  # causal pairs per chunk: 10, 10, 3
    glob = 2 * 8 * 2 * 3 + 1 * 2 * 3 + 2 * 6 * 2 * 3  # k_lin^T v, running sum, q_lin . state
    assert FLASH.forward_flops(shape, True, p) == local + glob


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

BAD = [
    ("flash", {"chunk": 0}, "chunk"),
    ("flash", {"chunk": -3}, "chunk"),
    ("mc-softmax", {"chunk": "0"}, "chunk"),
    ("flash", {"s": 0}, "s="),
    ("gau", {"s": -1}, "s="),
    ("gau", {"tile": 0}, "tile"),
    ("gau", {"norm": "n3"}, "norm"),
    ("flash", {"norm": "softmax"}, "norm"),
    ("gau", {"scoring": "relu"}, "scoring"),
    ("gau", {"expansion": 0}, "expansion"),
]


@pytest.mark.parametrize(("name", "params", "word"), BAD, ids=lambda x: str(x))
def test_bad_parameters_raise_one_line(name, params, word):
    with pytest.raises(AttnbenchError) as info:
        registry.get(name).resolve(params)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "\n" not in message and word in message and "accepted" in message


def test_bad_parameters_through_the_api():
    x = inputs(FLASH, Shape(1, 1, 8, 4), {})
    with pytest.raises(ValueError, match="chunk"):
        attention("flash", **x, chunk=0)
    with pytest.raises(ValueError, match="q_lin"):
        attention("flash", x["q"], x["k"], x["v"], k_lin=x["k_lin"])


def test_bad_parameters_exit_2_from_the_cli():
    """The error the registry raises reaches the CLI's error handler: one line, exit code 2."""
    app = typer.Typer(cls=Group)

    @app.callback()
    def root() -> None:
        """A stand-in root until a suite command takes --param."""

    @app.command()
    def resolve(name: str, chunk: str) -> None:
        registry.get(name).resolve({"chunk": chunk})

    result = CliRunner().invoke(app, ["resolve", "flash", "0"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: flash: invalid chunk")
