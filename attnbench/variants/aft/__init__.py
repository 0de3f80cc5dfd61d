"""The Attention Free Transformer family (Zhai et al. 2021): aft-full, aft-local,
aft-simple, aft-conv. One module per mechanism; ``dense`` is the shared oracle, ``softmax_sums``
the exactly stabilised partial sums the efficient paths build on, ``layer`` the token mixer."""

from attnbench.variants.aft import conv, full, local, simple

FULL = full.MECHANISM
LOCAL = local.MECHANISM
SIMPLE = simple.MECHANISM
CONV = conv.MECHANISM

__all__ = ["CONV", "FULL", "LOCAL", "SIMPLE"]
