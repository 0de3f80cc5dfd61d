"""Fused kernels behind the ``fused`` paths: SDPA backends, FlexAttention, Triton.

Nothing here imports Triton at import time: :mod:`sdpa` and :mod:`flex` need only torch (flex
imports FlexAttention inside its functions), and :mod:`triton_ops`, the front of the Triton
kernels, imports the kernel modules (:mod:`triton_gau`, :mod:`triton_retention`, which import
triton) only when a kernel is launched. So ``import attnbench``, ``attnbench list`` and every CPU
path work without Triton installed.

No AFT kernel (Zhai et al. 2021), on purpose: AFT-full is sigmoid(Q) * (exp(w) @ (exp(K) * V)) /
(exp(w) @ exp(K)). Both products share the left factor, so they are one GEMM of exp(w) [T, T]
against [exp(K) * V | exp(K)] [T, 2d], and since w is shared across the batch the batch folds into
the GEMM's N dimension: a single large dense matmul that cuBLAS already runs at the device's matmul
rate. A fused kernel would issue the same FLOPs and could at best save the elementwise exp(w) pass
(T^2 work against the GEMM's 4 T^2 B d); w is itself a T^2 parameter, so it saves no asymptotic
memory either. AFT-simple is O(T d) reductions and AFT-conv a depthwise convolution: no quadratic
step to fuse.
"""
