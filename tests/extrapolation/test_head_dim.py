"""``model.d_head``: heads whose dimension is set apart from d_model / heads (the attention's inner
width heads x d_head then differs from d_model, as T5's d_kv). The trained layer against softmax
attention written out in float64 (outputs and gradients, odd lengths, batch and heads > 1), the
evaluation-time rows built on the same weights (the log n row equals the registry's
``softmax-logn`` layer at that head size), ALiBi's mixer at that head size, the checkpoint key (0
leaves it as it was), and what is refused: an odd head size, a mechanism whose own layer sizes its
heads."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.encoder import MixerSpec, MLMEncoder, ModelConfig, build_model
from attnbench.extrapolation.model.tricks import TrickMixer, parse_tricks
from attnbench.extrapolation.model.tricks.mixer import trick_mixers
from attnbench.layers import Rotary, make_layer
from attnbench.runtime.schema import Invalid
from tests.helpers.extrapolation import softmax_key

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = dict(rtol=1e-10, atol=1e-10)


def wide_heads(**kw) -> ModelConfig:
    """4 heads of 16 in a model of width 32: an inner width of 64, twice d_model."""
    return ModelConfig(**({"d_model": 32, "layers": 2, "heads": 4, "d_head": 16, "train_len": 16}
                          | kw))  # fmt: skip


def rope_by_hand(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding of x [B, H, T, D] on the pairs (i, i + D/2) (the half-split layout): the
    angle t / base^(2i/D)."""
    T, D = x.shape[-2], x.shape[-1]
    t = torch.arange(T, dtype=torch.float64)[:, None]
    theta = t / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)  # (T, D/2)
    cos, sin = torch.cos(theta), torch.sin(theta)
    first, second = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def attention_by_hand(x, wq, wk, wv, wo, heads: int, d: int) -> torch.Tensor:
    """x [B, T, C] -> softmax(rope(q) rope(k)^T / sqrt(d)) v, heads of d, then the output
    projection; every step written out on the dense T x T scores."""
    B, T, _ = x.shape

    def split(w):  # (B, H, T, d)
        return (x @ w.T).view(B, T, heads, d).transpose(1, 2)

    q, k, v = rope_by_hand(split(wq)), rope_by_hand(split(wk)), split(wv)
    s = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    o = (p / p.sum(-1, keepdim=True)) @ v  # (B, H, T, d)
    return o.transpose(1, 2).reshape(B, T, heads * d) @ wo.T


@pytest.mark.parametrize(("heads", "d_head", "T"), [(4, 16, 13), (3, 8, 17), (1, 64, 9)])
def test_the_layer_is_softmax_attention_with_heads_of_d_head(heads, d_head, T):
    torch.manual_seed(heads)
    cfg = wide_heads(heads=heads, d_head=d_head)
    model = build_model(cfg, MixerSpec("softmax")).double()
    layer = model.blocks[0].mixer
    inner = heads * d_head
    assert layer.wq.weight.shape == (inner, 32) and layer.wo.weight.shape == (32, inner)
    x = torch.randn(2, T, 32, dtype=torch.float64, requires_grad=True)
    weights = [layer.wq.weight, layer.wk.weight, layer.wv.weight, layer.wo.weight]
    copies = [w.detach().clone().requires_grad_() for w in weights]
    x2 = x.detach().clone().requires_grad_()
    out, ref = layer(x), attention_by_hand(x2, *copies, heads, d_head)
    torch.testing.assert_close(out, ref, **F64)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(x.grad, x2.grad, **F64)
    for w, c in zip(weights, copies, strict=True):
        torch.testing.assert_close(w.grad, c.grad, **F64)


def test_the_evaluation_rows_load_the_weights_and_log_n_is_the_registry_layer():
    """The trick rows are built at the model's head size: with no trick beyond L the row is the
    trained model; the log n row equals softmax-logn (base L, clipped) built by make_layer with
    the same head_dim."""
    torch.manual_seed(0)
    cfg = wide_heads()
    model = build_model(cfg, MixerSpec("softmax")).double().eval()
    x = torch.randint(0, 256, (2, 40))

    def rows(name: str) -> MLMEncoder:
        other = MLMEncoder(cfg, trick_mixers(parse_tricks(name, 16))).double()
        other.load_state_dict(model.state_dict())  # strict: every shape agrees
        return other.eval()

    registry = MLMEncoder(cfg, lambda c, i: make_layer(
        "softmax-logn", c.d_model, c.heads, params={"base": 16.0, "clip": True},
        rope=Rotary(c.head_dim), max_len=16, head_dim=c.d_head,
    )).double()  # fmt: skip
    registry.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(rows("logn")(x[:, :16]), model(x[:, :16]), **F64)
        torch.testing.assert_close(rows("logn")(x), registry.eval()(x), **F64)
        assert not torch.allclose(rows("logn")(x), model(x), atol=1e-6)
    mixer = rows("local").blocks[0].mixer
    assert isinstance(mixer, TrickMixer) and (mixer.heads, mixer.head_dim) == (4, 16)


@pytest.mark.parametrize("mechanism", ["softmax", "softmax-logn"])
def test_alibi_at_a_set_head_size_agrees_on_both_paths(mechanism):
    torch.manual_seed(1)
    cfg = wide_heads(position="alibi")
    model = build_model(cfg, MixerSpec(mechanism)).double()
    mixer = model.blocks[0].mixer
    assert mixer.wq.weight.shape == (64, 32) and mixer.head_dim == 16
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    fused = mixer(x)
    mixer.force_dense = True
    torch.testing.assert_close(mixer(x), fused, **F64)


def test_heads_need_not_divide_d_model_once_d_head_is_set():
    cfg = ModelConfig(d_model=128, heads=3, d_head=64)
    assert cfg.head_dim == 64
    assert ModelConfig(d_model=128, heads=8).head_dim == 16  # 0: d_model / heads, as before
    with pytest.raises(Invalid, match="d_head = 63 is odd"):
        ModelConfig(d_model=128, heads=2, d_head=63)
    with pytest.raises(Invalid, match="or model.d_head set"):
        ModelConfig(d_model=128, heads=3)


def test_zero_leaves_the_checkpoint_key_as_it_was():
    from attnbench.extrapolation.experiment.config import load_preset
    from attnbench.runtime.tomlconfig import parse_settings

    plain = softmax_key(load_preset("cpu"))["model"]
    assert "d_head" not in plain
    assert ModelConfig(**plain).head_dim == 16  # keys from before the option load
    wide = softmax_key(load_preset("cpu", parse_settings(["model.heads=4", "model.d_head=64"])))
    assert wide["model"]["d_head"] == 64 and ModelConfig(**wide["model"]).head_dim == 64
    # d_head set to d_model / heads is the default's model, and its checkpoints are the same
    same = load_preset("cpu", parse_settings(["model.d_head=16"]))
    assert softmax_key(same) == softmax_key(load_preset("cpu"))


def test_a_mechanism_with_its_own_layer_refuses_a_head_size():
    with pytest.raises(AttnbenchError, match="gau builds its own layer"):
        build_model(wide_heads(), MixerSpec("gau"))
    with pytest.raises(AttnbenchError, match="accepted only by the generic attention layer"):
        make_layer("gau", 32, 2, head_dim=8)


def test_a_bad_head_size_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    result = CliRunner().invoke(
        app, ["run", "extrapolate", "--set", "model.d_head=7", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert "d_head = 7 is odd" in result.output and "Traceback" not in result.output


def test_a_model_with_d_head_trains_and_is_evaluated_again_from_its_checkpoint(tmp_path):
    """3 heads of 16 in a width of 32 (inner width 48): trained, every evaluation-time row of the
    preset evaluated on it (all ok), and the same numbers from its checkpoint with --eval-only."""
    from attnbench.extrapolation.experiment.run import run_extrapolate
    from tests.helpers.extrapolation import make_corpus, run_options, tiny_cfg

    cfg = tiny_cfg(make_corpus(tmp_path / "c.txt")).override(
        {"heads": 3, "d_head": 16, "variants": "O", "steps": 3, "ckpt_every": 0,
         "eval_time": "logn,local,rerope@48+logn,ntk,yarn,hwfa"}
    )  # fmt: skip
    first = run_extrapolate(cfg, run_options(tmp_path / "out"))
    assert {r["status"] for r in first.rows} == {"ok"}
    checkpoints = tmp_path / "out" / "checkpoints"
    again = run_extrapolate(
        cfg, run_options(tmp_path / "again", eval_only=True, checkpoints=checkpoints)
    )

    def accuracies(result):
        return {(r["variant"], r["eval_len"]): r["accuracy"] for r in result.rows}

    assert accuracies(again) == accuracies(first)
    trained = torch.load(tmp_path / "out/checkpoints/O-seed0.pt", weights_only=False)
    assert trained["model"]["blocks.0.mixer.wq.weight"].shape == (48, 32)
