"""The SwiGLU FFN of the extrapolation model (``model.ffn = "swiglu"``, Shazeer 2020): its output
and gradients against the formula written out in float64, its width (about the GELU FFN's
parameters), the model built with it (the masked-rows path equals the whole forward), the
checkpoint key (the default leaves it as it was), and a bad value refused in one line."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.model.encoder import (
    FeedForward,
    MixerSpec,
    ModelConfig,
    SwiGLU,
    build_model,
    swiglu_width,
)
from attnbench.runtime.tomlconfig import parse_settings
from tests.helpers.extrapolation import softmax_key

pytestmark = pytest.mark.usefixtures("one_thread")


def swiglu_by_hand(x, w_gate, w_up, w_down):
    """down(silu(x W_gate^T) * (x W_up^T)), with silu(a) = a / (1 + e^-a) written out."""
    a = x @ w_gate.T
    gated = a / (1 + torch.exp(-a)) * (x @ w_up.T)
    return gated @ w_down.T


def test_output_and_gradients_match_the_formula_in_float64():
    torch.manual_seed(0)
    ffn = SwiGLU(12, 24).double()
    x = torch.randn(3, 5, 12, dtype=torch.float64, requires_grad=True)
    weights = [ffn.gate.weight, ffn.up.weight, ffn.down.weight]
    copies = [w.detach().clone().requires_grad_() for w in weights]
    x2 = x.detach().clone().requires_grad_()
    out, ref = ffn(x), swiglu_by_hand(x2, *copies)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-12, atol=1e-12)
    for w, c in zip(weights, copies, strict=True):
        torch.testing.assert_close(w.grad, c.grad, rtol=1e-12, atol=1e-12)


def test_large_inputs_stay_finite_in_bfloat16():
    torch.manual_seed(1)
    ffn = SwiGLU(8, 16)
    x = torch.randn(4, 8) * 1e3
    want = ffn.double()(x.double())
    got = ffn.to(torch.bfloat16)(x.to(torch.bfloat16)).double()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2 * want.abs().max().item())


@pytest.mark.parametrize(("hidden", "width"), [(256, 176), (512, 344), (3, 8), (24, 16)])
def test_width_is_two_thirds_rounded_up_to_eight(hidden, width):
    assert swiglu_width(hidden) == width


@pytest.mark.parametrize(("d_model", "mult"), [(128, 2), (128, 4), (96, 3), (256, 4)])
def test_about_the_parameters_of_the_gelu_ffn(d_model, mult):
    gelu = sum(p.numel() for p in FeedForward(d_model, mult * d_model).parameters())
    gated = sum(p.numel() for p in SwiGLU(d_model, swiglu_width(mult * d_model)).parameters())
    assert abs(gated - gelu) / gelu < 0.05


@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
def test_the_model_builds_with_it_and_the_masked_rows_path_agrees(ffn):
    torch.manual_seed(2)
    cfg = ModelConfig(d_model=32, layers=2, heads=4, ffn_mult=2, ffn=ffn, train_len=16)
    model = build_model(cfg, MixerSpec("softmax")).double()
    kind = SwiGLU if ffn == "swiglu" else FeedForward
    assert all(isinstance(block.ffn, kind) for block in model.blocks)
    tokens = torch.randint(0, 256, (2, 13))
    rows = torch.rand(2, 13) < 0.4
    rows[0, 0] = True
    torch.testing.assert_close(model.hidden_at(tokens, rows), model(tokens)[rows])
    model.logits(model.hidden_at(tokens, rows)).sum().backward()
    assert all(p.grad is not None for p in model.blocks[0].ffn.parameters())


def model_key(cfg) -> dict:
    return softmax_key(cfg)["model"]


def test_gelu_leaves_the_checkpoint_key_as_it_was_and_swiglu_enters_it():
    gelu = load_preset("cpu", parse_settings(["model.ffn=gelu"]))
    assert "ffn" not in model_key(gelu) and "ffn" not in model_key(load_preset("paper"))
    assert ModelConfig(**model_key(gelu)).ffn == "gelu"  # keys from before the option load
    assert model_key(load_preset("cpu"))["ffn"] == "swiglu"  # the cpu preset's since 2026-11-28


def test_a_bad_ffn_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    result = CliRunner().invoke(
        app, ["run", "extrapolate", "--set", "model.ffn=relu", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert "gelu, swiglu" in result.output and "Traceback" not in result.output
