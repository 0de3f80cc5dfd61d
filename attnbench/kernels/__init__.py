"""Fused kernels behind the ``fused`` paths: SDPA backends, FlexAttention, Triton.

Nothing here is imported by ``import attnbench`` or by the registry at import time beyond the
small, dependency-free modules (:mod:`sdpa`, :mod:`flex` import only torch). Triton is imported
inside the functions that launch a Triton kernel (:mod:`triton_gau`, :mod:`triton_retention`), so
``attnbench list`` and every CPU path work without Triton installed.
"""
