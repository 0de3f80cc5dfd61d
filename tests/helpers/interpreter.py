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


def interpret_bf16_dots_as_the_gpu() -> None:
    """Work around the bf16 tl.dot of Triton's interpreter (see :func:`interpreter_bf16_dot_ok`)
    in this process: bf16 operands of tl.dot are widened to float32 exactly (a bf16 value is the
    top half of a float32's bits) before the product, so the dot is what an NVIDIA GPU's bf16
    tensor-core dot computes, exact products summed in float32. Every other dtype and op runs as
    Triton interprets it. Only a file that calls this tests its kernels in bf16 on a CPU."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "widens_bf16", False):
        return
    original = builder.create_dot

    def widened(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        bits = x.data.view(np.uint16).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    create_dot.widens_bf16 = True
    builder.create_dot = create_dot
