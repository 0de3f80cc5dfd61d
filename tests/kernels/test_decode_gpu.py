"""The Triton decode kernels on a CUDA GPU at the decoding suite's shape (batch 1, 32 query heads
of 128, 1 or 8 K/V heads, a cache of 16k + 1 tokens, one and four new tokens), fp16 and bf16,
against float64 by the project's rule (the naive baseline: the same formula in the input dtype,
float32 sums). The decode contract itself, at head dim 64, is tests/mechanisms/
test_inference_gpu.py's (every decode form that runs on CUDA). Run with ``pytest -m gpu``."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.core.testing import FACTOR_OUTPUT, judge
from attnbench.kernels import decode_ops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
N = 16385  # the cache, odd: a ragged last key tile


def _softmax_rows(q, keys, values, start, dtype):
    """softmax(q K^T / sqrt(d)) V of the new rows at start .. in ``dtype`` (float32 sums for
    half inputs, as the ``plain`` form), each K/V head repeated for its query heads."""
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    g = q.shape[1] // keys.shape[1]
    k, v = (x.to(work).repeat_interleave(g, dim=1) for x in (keys, values))
    s = q.to(work) @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    rows = torch.arange(start, start + q.shape[2], device=q.device)[:, None]
    cols = torch.arange(keys.shape[2], device=q.device)[None, :]
    s = s.masked_fill(cols > rows, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_heads", [1, 8])
@pytest.mark.parametrize("tq", [1, 4])
def test_split_softmax_at_the_decode_shape(dtype, kv_heads, tq):
    gen = torch.Generator(device="cuda").manual_seed(tq + kv_heads)
    q = torch.randn(1, 32, tq, 128, device="cuda", generator=gen).to(dtype)
    keys, values = (
        torch.randn(1, kv_heads, N, 128, device="cuda", generator=gen).to(dtype) for _ in "kv"
    )
    start = N - tq
    o = decode_ops.split_softmax(q, keys, values, start=start, scale=128**-0.5)
    oracle = _softmax_rows(q, keys, values, start, torch.float64)
    baseline = _softmax_rows(q, keys, values, start, dtype)
    verdict = judge("output", o, baseline, oracle, FACTOR_OUTPUT, N * 128)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize(
    ("finish", "dtype"),
    [("normalize", torch.float16), ("normalize", torch.bfloat16), ("none", torch.bfloat16)],
    ids=["normalize-float16", "normalize-bfloat16", "none-bfloat16"],
)
@pytest.mark.parametrize("tq", [1, 4])
def test_recurrent_step_at_the_decode_shape(finish, dtype, tq):
    """D = Dv = 128 (the step's widest tiles), 32 heads, a state of 4096 elu + 1 tokens (the
    bare sum in bfloat16 only: in float16 it nears 65504 here)."""
    gen = torch.Generator(device="cuda").manual_seed(tq)
    n = 4096
    q, k = (torch.randn(1, 32, n + tq, 128, device="cuda", generator=gen).to(dtype) for _ in "qk")
    v = torch.randn(1, 32, n + tq, 128, device="cuda", generator=gen).to(dtype)
    fq, fk = (torch.nn.functional.elu(x.double()) + 1 for x in (q, k))
    vv = torch.cat((v.double(), torch.ones_like(v[..., :1], dtype=torch.float64)), -1)
    width = 128 + (finish != "none")
    state = (fk[:, :, :n].transpose(-1, -2) @ vv[:, :, :n, :width]).float().contiguous()
    o, _ = decode_ops.recurrent_step(state, q[:, :, n:], k[:, :, n:], v[:, :, n:],
                                     feature_map="elu+1", finish=finish, eps=1e-6)  # fmt: skip
    scores = (fq[:, :, n:] @ fk.transpose(-1, -2)).tril(n)  # (1, 32, tq, n + tq)
    oracle = scores @ vv[..., :width]
    if finish == "normalize":
        oracle = oracle[..., :128] / (oracle[..., 128:] + 1e-6)
    baseline = oracle.float().to(dtype)  # the oracle rounded to the dtype: the least error
    verdict = judge("output", o, baseline, oracle, FACTOR_OUTPUT, (n + tq) * 128)
    assert verdict.ok, str(verdict)
