"""What the Triton interpreter tests share (tests/kernels/interpreted_*.py): a probe of the
interpreter's bf16 products, the dtypes as test parameters, inputs and the check of a fast path
against its reference. Importing it imports no Triton (the probe imports it when called, in a
process started with ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import pytest
import torch

from attnbench.core.testing import compare_paths
from tests.helpers.dense_refs import make_qkv


def interpreter_bf16_dot_ok() -> bool:
    """Triton 3.9's interpreter multiplies the raw 16-bit patterns in tl.dot on bf16 operands
    (a 16x16 product comes out ~1e10 off); probe it instead of assuming either way."""
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(X, Y):
        o = tl.arange(0, 16)
        x = tl.load(X + o[:, None] * 16 + o[None, :])
        tl.store(Y + o[:, None] * 16 + o[None, :], tl.dot(x, x))

    x = torch.randn(16, 16).bfloat16()
    y = torch.empty(16, 16)
    _dot[(1,)](x, y)
    return bool(torch.allclose(y, x.float() @ x.float(), rtol=1e-2, atol=1e-2))


def dtype_param(dtype: torch.dtype):
    return pytest.param(dtype, id=str(dtype).removeprefix("torch."))


DTYPES = [dtype_param(torch.float32), dtype_param(torch.float16), dtype_param(torch.bfloat16)]


def make(b, h, t, d, dv, dtype, seed=0):
    return make_qkv(b, h, t, d, dv, dtype, seed=seed)


def check(fast, reference, inputs, kwargs=None):
    verdicts = compare_paths(fast, reference, inputs, kwargs or {})
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))
