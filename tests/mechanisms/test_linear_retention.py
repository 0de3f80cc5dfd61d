"""Linear attention and RetNet retention: the three forms agree, causality, the layer, memory
that grows linearly in n, FLOPs, bad input."""

from __future__ import annotations

import math

import pytest
import torch
import typer
from typer.testing import CliRunner

from attnbench import api, registry
from attnbench.cli.common import Group, parse_params
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from attnbench.layers import Rotary, make_layer
from attnbench.measure.memory import cpu_peak

LINEAR = registry.get("linear")
RETENTION = registry.get("retention")
#: The paths that run here (the fused Triton path needs CUDA; see interpreted_triton.py).
RETENTION_CPU_PATHS = [p for p in RETENTION.paths if not p.unavailable("cpu")]
SHAPE = Shape(2, 3, 37, 8)  # 37: no chunk size below divides it
CHUNKS = (1, 5, 16, 64)  # 64 > T: one (padded-free) chunk

LINEAR_PARAMS = [
    {"feature_map": "elu+1", "normalize": True},
    {"feature_map": "relu", "normalize": True},
    {"feature_map": "elu+1", "normalize": False},
    {"feature_map": "identity", "normalize": False},
]


def _verdicts(mech, path, params, causal, dtype=torch.float32, shape=SHAPE):
    inputs = make_inputs(mech, shape, params, dtype=dtype, seed=shape.seq_len)
    verdicts = compare_paths(mech.path(path), mech.reference, inputs, {"causal": causal, **params})
    return [str(v) for v in verdicts if not v.ok]


# -- recurrent = parallel = chunkwise -----------------------------------------------------------


@pytest.mark.parametrize("normalize", ["none", "rownorm"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_retention_chunkwise_equals_parallel(normalize, chunk):
    params = RETENTION.resolve({"normalize": normalize, "chunk": chunk})
    assert not _verdicts(RETENTION, "chunkwise", params, causal=True)


@pytest.mark.parametrize("normalize", ["none", "rownorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_retention_recurrent_equals_parallel(normalize, dtype):
    params = RETENTION.resolve({"normalize": normalize})
    assert not _verdicts(RETENTION, "recurrent", params, causal=True, dtype=dtype)


@pytest.mark.parametrize("normalize", ["none", "rownorm"])
def test_retention_three_forms_agree_in_float64(normalize):
    """recurrent, chunkwise (several chunk sizes) and parallel: one function, to 1e-12."""
    inputs = make_inputs(RETENTION, SHAPE, {}, dtype=torch.float64, seed=3)
    outs = [RETENTION.path("parallel")(**inputs, causal=True, normalize=normalize, chunk=1)]
    outs.append(RETENTION.path("recurrent")(**inputs, causal=True, normalize=normalize, chunk=1))
    for chunk in CHUNKS:
        outs.append(
            RETENTION.path("chunkwise")(**inputs, causal=True, normalize=normalize, chunk=chunk)
        )
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-12, atol=1e-12)


def test_retention_parallel_worked_example():
    """A worked example, T = 3: o_3 = g^2 q3.k1 v1 + g q3.k2 v2 + q3.k3 v3 (/ sqrt d)."""
    q, k, v = (torch.randn(1, 1, 3, 4, dtype=torch.float64) for _ in range(3))
    g = 1 - 2**-5  # head 0
    o = RETENTION.reference(q, k, v, causal=True, normalize="none", chunk=1)
    qk = (q[0, 0] @ k[0, 0].T) / 2.0  # sqrt(4)
    want = g**2 * qk[2, 0] * v[0, 0, 0] + g * qk[2, 1] * v[0, 0, 1] + qk[2, 2] * v[0, 0, 2]
    torch.testing.assert_close(o[0, 0, 2], want)


def test_retention_decays_are_multi_scale():
    """Head h decays by gamma_h = 1 - 2^(-5-h): a single key at position 0, read at position n,
    is weighted gamma_h^n."""
    h, t, d = 4, 10, 2
    q = torch.zeros(1, h, t, d, dtype=torch.float64)
    k = torch.zeros_like(q)
    v = torch.zeros(1, h, t, 1, dtype=torch.float64)
    q[..., 0], k[:, :, 0, 0], v[:, :, 0, 0] = math.sqrt(d), 1.0, 1.0
    for path in RETENTION_CPU_PATHS:
        o = path(q, k, v, causal=True, normalize="none", chunk=3)[0, :, :, 0]  # (H, T)
        gammas = 1 - 2.0 ** (-5 - torch.arange(h, dtype=torch.float64))
        want = gammas[:, None] ** torch.arange(t, dtype=torch.float64)[None, :]
        torch.testing.assert_close(o, want, msg=path.name)


def test_rownorm_is_the_papers_normalisation():
    """rownorm on one head by hand: decay rows / sqrt(row sum), scores / max(|row sum|, 1)."""
    q, k, v = (torch.randn(1, 1, 6, 4, dtype=torch.float64) for _ in range(3))
    g, n = 1 - 2**-5, 6
    decay = torch.tensor(
        [[g ** (i - j) if i >= j else 0.0 for j in range(n)] for i in range(n)], dtype=q.dtype
    )
    decay = decay / decay.sum(-1, keepdim=True).sqrt()
    r = (q[0, 0] @ k[0, 0].T) / 2.0 * decay
    want = (r / r.sum(-1, keepdim=True).abs().clamp(min=1)) @ v[0, 0]
    for path in RETENTION_CPU_PATHS:
        o = path(q, k, v, causal=True, normalize="rownorm", chunk=4)
        torch.testing.assert_close(o[0, 0], want, msg=path.name)


@pytest.mark.parametrize("params", LINEAR_PARAMS, ids=lambda p: f"{p['feature_map']}")
@pytest.mark.parametrize("causal", [False, True])
def test_linear_chunkwise_equals_reference(params, causal):
    for chunk in CHUNKS if causal else (16,):
        resolved = LINEAR.resolve({**params, "chunk": chunk})
        assert not _verdicts(LINEAR, "chunkwise", resolved, causal), f"chunk={chunk}"


@pytest.mark.parametrize("params", LINEAR_PARAMS[:3], ids=lambda p: f"{p['feature_map']}")
@pytest.mark.parametrize("causal", [False, True])
def test_linear_recurrent_equals_reference(params, causal):
    assert not _verdicts(LINEAR, "recurrent", LINEAR.resolve(params), causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_elu_plus_one_against_a_float64_oracle(dtype):
    """elu(x) + 1 = x + 1 (x > 0), e^x (x <= 0), and its derivative e^min(x, 0), over the whole
    range where e^x is a normal number: computed as 2^(x log2 e), the relative error grows like
    |x| eps / 2 (the rounding of x log2 e; measured up to 0.62 |x| eps at x = -44, float32) plus
    the exponential's own few ulp: |x| eps + 4 eps is the bound."""
    from attnbench.variants.linear import elu_plus_one

    lowest = math.log(torch.finfo(dtype).tiny)  # e^x normal above this: -87 (float32)
    x = torch.linspace(lowest, 30.0, 20_001, dtype=dtype).requires_grad_()
    y = elu_plus_one(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    x64 = x.detach().double()
    want = torch.where(x64 > 0, x64 + 1, x64.exp())
    want_grad = torch.exp(x64.clamp(max=0))
    bound = (x64.abs() + 4) * torch.finfo(dtype).eps  # relative, per element
    assert bool(((y.double() - want).abs() <= bound * want).all())
    assert bool(((grad.double() - want_grad).abs() <= bound * want_grad).all())


# -- causality ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "path"),
    [(LINEAR, "chunkwise"), (LINEAR, "recurrent"), (RETENTION, "chunkwise")]
    + [(RETENTION, "recurrent"), (RETENTION, "parallel"), (LINEAR, "reference")],
    ids=lambda x: getattr(x, "name", x),
)
@pytest.mark.parametrize("normalize", [False, True])
def test_causal_outputs_ignore_later_positions(mech, path, normalize):
    """Changing q, k, v from position 20 on leaves outputs 0..19 bit-for-bit unchanged."""
    params = mech.resolve(
        {"chunk": 8, "normalize": normalize}
        if mech is LINEAR
        else {"chunk": 8, "normalize": "rownorm" if normalize else "none"}
    )
    inputs = make_inputs(mech, SHAPE, params, seed=1)
    changed = {name: x.clone() for name, x in inputs.items()}
    for x in changed.values():
        x[:, :, 20:] = torch.randn_like(x[:, :, 20:]) * 3
    fn = mech.path(path)
    a = fn(**inputs, causal=True, **params)
    b = fn(**changed, causal=True, **params)
    assert torch.equal(a[:, :, :20], b[:, :, :20])
    assert not torch.equal(a[:, :, 20:], b[:, :, 20:])


# -- the multi-scale retention layer ------------------------------------------------------------


@pytest.mark.parametrize("rope", [False, True])
def test_msr_layer_forward_backward_and_paths_agree(rope):
    torch.manual_seed(0)
    layers = {
        p.name: make_layer(
            "retention", 32, 4, causal=True, path=p.name, rope=Rotary(8) if rope else None
        )
        for p in RETENTION_CPU_PATHS
    }
    state = layers["parallel"].state_dict()
    for layer in layers.values():
        layer.load_state_dict(state)
    x = torch.randn(2, 29, 32)
    outs = {p: layer(x) for p, layer in layers.items()}
    assert outs["parallel"].shape == (2, 29, 32)
    for p, o in outs.items():
        torch.testing.assert_close(o, outs["parallel"], atol=2e-5, rtol=1e-4, msg=p)
    outs["chunkwise"].square().sum().backward()
    layer = layers["chunkwise"]
    for name, param in layer.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_msr_layer_groupnorm_absorbs_rownorm():
    """GroupNorm is invariant to a positive per-(position, head) scale, which is all rownorm
    changes: with GroupNorm's eps at 0 the two layers agree to rounding."""
    torch.manual_seed(0)
    a = make_layer("retention", 32, 4, causal=True, params={"normalize": "none"})
    b = make_layer("retention", 32, 4, causal=True, params={"normalize": "rownorm"})
    b.load_state_dict(a.state_dict())
    a.norm.eps = b.norm.eps = 0.0
    x = torch.randn(2, 40, 32)
    torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-4)
    unnormalised = a.path(
        *(torch.randn(1, 4, 40, 8) for _ in range(3)), causal=True, normalize="none", chunk=64
    )
    assert unnormalised.abs().max() > 0  # (the operator itself differs; the layer does not)


def test_msr_layer_is_causal_only():
    with pytest.raises(AttnbenchError, match="causal only"):
        make_layer("retention", 32, 4, causal=False)


# -- memory grows linearly ----------------------------------------------------------------------


def _fwd_bwd_peak(mech, path, n, causal, params):
    inputs = make_inputs(mech, Shape(1, 2, n, 16), params, requires_grad=True)
    grad_out = torch.randn(1, 2, n, 16)
    fn = mech.path(path)

    def run():
        o = fn(**inputs, causal=causal, **params)
        return torch.autograd.grad(o, list(inputs.values()), grad_out)

    return cpu_peak(run).bytes


@pytest.mark.parametrize(
    ("mech", "path", "causal", "params"),
    [
        (LINEAR, "chunkwise", True, {}),
        (LINEAR, "chunkwise", False, {}),
        (RETENTION, "chunkwise", True, {}),
        (RETENTION, "chunkwise", True, {"normalize": "rownorm"}),
    ],
    ids=["linear-causal", "linear-bidir", "retention", "retention-rownorm"],
)
def test_memory_is_linear_in_n(mech, path, causal, params):
    """Peak bytes of forward + backward (deterministic storage count) at 2n vs n: ~2x, not 4x.
    The dense reference is measured too, to show the counter sees quadratic growth."""
    params = mech.resolve(params)
    ratio = _fwd_bwd_peak(mech, path, 1024, causal, params) / _fwd_bwd_peak(
        mech, path, 512, causal, params
    )
    assert 1.8 < ratio < 2.2, ratio
    dense = _fwd_bwd_peak(mech, mech.reference.name, 1024, causal, params) / _fwd_bwd_peak(
        mech, mech.reference.name, 512, causal, params
    )
    assert dense > 3.5, dense


# -- FLOPs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "causal", "params"),
    [
        (LINEAR, True, {"chunk": 16}),
        (LINEAR, True, {"chunk": 16, "normalize": False}),
        (LINEAR, False, {}),
        (RETENTION, True, {"chunk": 16}),
        (RETENTION, True, {"chunk": 16, "normalize": "rownorm"}),
    ],
)
def test_flops_match_what_the_default_path_issues(mech, causal, params):
    from torch.utils.flop_counter import FlopCounterMode

    params = mech.resolve(params)
    shape = Shape(2, 3, 37, 8)
    inputs = make_inputs(mech, shape, params)
    with FlopCounterMode(display=False) as counter:
        mech.default_path(**inputs, causal=causal, **params)
    assert mech.forward_flops(shape, causal, params) == counter.get_total_flops()


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "words"),
    [
        ("linear", {"chunk": 0}, "chunk"),
        ("linear", {"chunk": "-3"}, "chunk"),
        ("linear", {"feature_map": "tanh"}, "feature_map"),
        ("linear", {"feature_map": "identity"}, "identity"),
        ("linear", {"eps": -1.0}, "eps"),
        ("retention", {"chunk": 0}, "chunk"),
        ("retention", {"normalize": "layernorm"}, "normalize"),
        ("retention", {"normalize": "True"}, "normalize"),
    ],
)
def test_bad_parameters_are_one_line_errors(name, params, words):
    q = k = v = torch.randn(1, 2, 5, 4)
    with pytest.raises(AttnbenchError, match=words) as info:
        api.attention(name, q, k, v, causal=True, **params)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_retention_has_no_bidirectional_form():
    q = k = v = torch.randn(1, 2, 5, 4)
    with pytest.raises(AttnbenchError, match="causal only"):
        api.attention("retention", q, k, v, causal=False)
    for path in RETENTION.paths:  # called directly, too
        with pytest.raises(AttnbenchError, match="causal only"):
            path(q, k, v, causal=False, normalize="none", chunk=4)


def test_cli_turns_parameter_errors_into_exit_2():
    """What any command that takes ``--param`` does: AttnbenchError -> one line, exit code 2."""
    app = typer.Typer(cls=Group)

    @app.command()
    def resolve(name: str, param: list[str] = typer.Option(None, "--param")) -> None:
        typer.echo(registry.get(name).resolve(parse_params(param)))

    @app.command()
    def other() -> None:  # a second command keeps Typer from collapsing the group
        pass

    runner = CliRunner()
    ok = runner.invoke(app, ["resolve", "retention", "--param", "chunk=8"])
    assert ok.exit_code == 0, ok.output
    for name, bad in [("retention", "normalize=bogus"), ("linear", "chunk=0")]:
        result = runner.invoke(app, ["resolve", name, "--param", bad])
        assert result.exit_code == 2
        assert result.output.count("\n") == 1 and result.output.startswith("error: ")


@pytest.mark.parametrize("causal", [False, True])
def test_linear_uses_the_generic_layer(causal):
    """linear has no learned extra inputs: make_layer gives the generic mixer, rope included."""
    layer = make_layer("linear", 32, 4, causal=causal, rope=Rotary(8))
    y = layer(torch.randn(2, 30, 32))
    y.square().sum().backward()
    assert y.shape == (2, 30, 32)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


#: Error bound of a path run on half inputs against a float64 oracle on the same (rounded)
#: inputs: C_HALF * eps(dtype) * the output's scale. With float32 sums the only half-precision
#: rounding left is the output's own (half an ulp): 2 eps leaves room for the float32 sums.
C_HALF = 2.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("retention", "recurrent"),
        ("retention", "chunkwise"),
        ("linear", "recurrent"),
        ("linear", "chunkwise"),
    ],
)
def test_running_states_of_half_inputs_are_summed_in_float32(name, path, dtype):
    """T = 1000, 8 heads of 64 (RetNet's slowest decay 1 - 2^-12 keeps ~4000 steps): in the
    input's half dtype the states were off by up to 67 % (retention, bfloat16) and linear
    attention's float16 normaliser passed 65504; now within C_HALF ulps of the output."""
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape

    mech = registry.get(name)
    params = mech.resolve({})
    shape = mech.shape_for(Shape(1, 8, 1000, 64), params)
    inputs = make_inputs(mech, shape, params, dtype=dtype, device="cpu", seed=3)
    fn = next(p for p in mech.paths if p.name == path)
    with torch.no_grad():
        out = fn(**inputs, causal=True, **params)
        oracle = mech.reference(**{k: x.double() for k, x in inputs.items()}, causal=True,
                                   **params)  # fmt: skip
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    scale = oracle.abs().max().item()
    error = (out.double() - oracle).abs().max().item()
    assert error <= C_HALF * torch.finfo(dtype).eps * scale, f"{error / scale:.3g} of the scale"


@pytest.mark.parametrize("t", [1, 15, 16, 17, 100, 257, 1000, 4099])
def test_prefix_sum_is_cumsum_along_the_sequence(t):
    """The two-level scan of causal linear:triton's normaliser: torch's cumsum in float64 (up to
    rounding), its float32 error no larger than cumsum's own, and its gradient (float64)."""
    from attnbench.variants.linear import prefix_sum

    x = torch.rand(2, 3, t, 5, dtype=torch.float64)
    torch.testing.assert_close(prefix_sum(x), x.cumsum(-2), rtol=1e-12, atol=1e-12)
    x32 = x.float()
    err = (prefix_sum(x32).double() - x.cumsum(-2)).abs().max()
    err_cumsum = (x32.cumsum(-2).double() - x.cumsum(-2)).abs().max()
    assert err <= 2 * err_cumsum + 1e-6 * t
    leaf = torch.randn(1, 2, min(t, 70), 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(prefix_sum, (leaf,))
