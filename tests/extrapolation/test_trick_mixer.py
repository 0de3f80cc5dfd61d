"""The evaluation-time tricks' mixer on tiny models: at n <= L each trick is the trained model,
logn equals the registry's softmax-logn, ReRoPE clips the relative positions, the SDPA path equals
the dense one, the entropy probe alone takes the dense path, YaRN's frequencies by the paper's
ramp, and rows refused for a renamed or conflicting trick."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation.evaluate import evaluate, make_eval_stream
from attnbench.extrapolation.model.encoder import MLMEncoder
from attnbench.extrapolation.model.tricks import TrickMixer, parse_tricks
from attnbench.layers import make_layer
from tests.helpers.extrapolation import tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def _swap(model, tricks):
    cfg = model.cfg
    other = MLMEncoder(cfg, lambda c, i: TrickMixer(c.d_model, c.heads, tricks))
    other.load_state_dict(model.state_dict())
    return other.eval()


def test_tricks_reduce_to_the_trained_model():
    model = tiny_encoder().eval()
    x = torch.randint(0, 256, (2, 40))
    short = x[:, :16]
    with torch.no_grad():
        for name in ("logn", "temperature", "yarn", "ntk", "pi", "ntk+logn"):
            t = parse_tricks(name, 16)
            # At n <= L every one of these is the identity; beyond L they change the output.
            assert torch.allclose(_swap(model, t)(short), model(short), atol=1e-5), name
            assert not torch.allclose(_swap(model, t)(x), model(x), atol=1e-4), name
        plain = parse_tricks("rerope", 16, rerope_window=40)  # window >= n: plain RoPE
        assert torch.allclose(_swap(model, plain)(x), model(x), atol=1e-5)
        wide = parse_tricks("local", 16, local_window=40)
        assert torch.allclose(_swap(model, wide)(x), model(x), atol=1e-5)


def test_logn_trick_equals_the_registry_mechanism():
    """max(1, log n / log L) in TrickMixer == softmax-logn(base=L, clip=True) via make_layer."""
    model = tiny_encoder().eval()
    cfg = model.cfg
    from attnbench.layers import Rotary

    ref = MLMEncoder(
        cfg,
        lambda c, i: make_layer(
            "softmax-logn", c.d_model, c.heads, params={"base": 16.0, "clip": True},
            rope=Rotary(c.head_dim), max_len=16,
        ),
    )  # fmt: skip
    ref.load_state_dict(model.state_dict())
    x = torch.randint(0, 256, (2, 100))
    with torch.no_grad():
        got = _swap(model, parse_tricks("logn", 16))(x)
        assert torch.allclose(got, ref.eval()(x), atol=1e-5)


def test_rerope_clips_relative_positions():
    """Beyond the window, ReRoPE scores equal those of a key moved to distance w."""
    t = parse_tricks("rerope", 16, rerope_window=4)
    mixer = TrickMixer(32, 2, t)
    q, k = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    s = mixer.scores(q, k)  # (1, 2, 12, 12)
    plain = TrickMixer(32, 2, parse_tricks("rerope", 16, rerope_window=100)).scores(q, k)
    # Query 10 with key 2 (r = 8 >= 4): the score RoPE gives at r = 4, i.e. query 6 with key 2
    # when all queries are the same vector.
    qq = q[:, :, 10:11].expand(1, 2, 12, 16)
    same = TrickMixer(32, 2, parse_tricks("rerope", 16, rerope_window=100)).scores(qq, k)
    assert torch.allclose(s[..., 10, 2], same[..., 6, 2], atol=1e-5)
    assert torch.allclose(s[..., 10, 8], plain[..., 10, 8], atol=1e-6)  # inside the window


SDPA_TRICKS = ["logn", "temperature", "yarn", "local", "ntk", "pi", "ntk+logn", "pi+local"]


@pytest.mark.parametrize("name", SDPA_TRICKS)
def test_trick_sdpa_path_matches_dense(name):
    t = parse_tricks(name, 16)
    mixer = TrickMixer(32, 2, t)
    x = torch.randn(2, 100, 32, dtype=torch.float64)
    mixer = mixer.double()
    with torch.no_grad():
        fast = mixer(x)
        mixer.force_dense = True
        dense = mixer(x)
    assert torch.allclose(fast, dense, atol=1e-10, rtol=1e-9)


def test_trick_rows_take_the_dense_path_only_for_the_entropy_windows(monkeypatch):
    """The entropy probe hands TrickMixer its hook only while active: the probed windows go
    through the dense path (which exposes the probabilities), the rest through SDPA. Accuracy,
    loss and entropy equal an evaluation forced dense everywhere (float64)."""
    heldout = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
    stream = make_eval_stream(heldout.to(torch.uint8), (("t", 0, 4096),), (64,), 512, 64, 0.15, 3)
    model = _swap(tiny_encoder(), parse_tricks("logn", 16)).double()
    shapes = []
    dense = TrickMixer.dense
    monkeypatch.setattr(
        TrickMixer, "dense", lambda self, q, k, v: shapes.append(q.shape[0]) or dense(self, q, k, v)
    )
    fast = evaluate(model, stream, 64, batch_tokens=128, entropy_tokens=128)
    # 2 probed windows (128 tokens at n = 64) in batches of 2, through 2 layers: 2 dense calls
    assert shapes == [2, 2]
    for layer in model.blocks:
        assert layer.mixer.probs_hook is None
    shapes.clear()
    for layer in model.blocks:
        layer.mixer.force_dense = True
    slow = evaluate(model, stream, 64, batch_tokens=128, entropy_tokens=128)
    assert len(shapes) == 2 * 4  # every one of the 8 windows, 4 batches x 2 layers
    assert (fast.correct, fast.masked) == (slow.correct, slow.masked) and fast.masked > 0
    assert fast.loss_sum == pytest.approx(slow.loss_sum, rel=1e-12)
    assert fast.entropy == pytest.approx(slow.entropy, rel=1e-12) and None not in fast.entropy


def test_yarn_interpolates_frequencies_by_parts():
    """YaRN's frequencies, written out per pair from Peng et al. 2023 (eq. of the ramp), for
    L = 64, head dim 64, n = 256: pairs with fewer than alpha turns over L are divided by s,
    pairs with more than beta kept, the rest in between."""
    from attnbench.extrapolation.model.tricks import YARN_ALPHA, YARN_BETA, yarn_freq_scale

    L, D, base, s = 64, 64, 10000.0, 4.0
    got = yarn_freq_scale(D, base, L, s)
    for i in range(D // 2):
        theta = base ** (-2 * i / D)
        turns = L / (2 * math.pi / theta)
        if turns < YARN_ALPHA:
            want = 1 / s
        elif turns > YARN_BETA:
            want = 1.0
        else:
            g = (turns - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)
            want = (1 - g) / s + g
        assert got[i].item() == pytest.approx(want, rel=1e-12), i
    changed = (got < 1).sum().item()
    assert changed == D // 2  # at L = 64 no pair makes beta = 32 turns: every pair moves
    assert torch.equal(yarn_freq_scale(D, base, L, 1.0), torch.ones(D // 2, dtype=torch.float64))


def test_renamed_and_conflicting_tricks_are_refused():
    with pytest.raises(AttnbenchError, match="now called 'temperature'"):
        parse_tricks("yarn-temp", 64)
    with pytest.raises(AttnbenchError, match="rotary frequencies twice"):
        parse_tricks("yarn+ntk", 64)
    with pytest.raises(AttnbenchError, match="already holds the temperature"):
        parse_tricks("yarn+temperature", 64)
    assert parse_tricks("rerope+logn", 64).names == ("rerope", "logn")
