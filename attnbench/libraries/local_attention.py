"""lucidrains' ``local-attention`` (github.com/lucidrains/local-attention) as a path of ``local``.

Its ``LocalAttention`` cuts the sequence into blocks of ``window_size`` and lets each query block
attend to itself and ``look_backward`` / ``look_forward`` neighbouring blocks: about 3 x window
keys a query, the n x n matrix never built. Mapped to ``local`` (query i sees key j when
|i - j| <= window; causal: 0 <= i - j <= window):

* ``window_size = window``, one block back and (bidirectional) one forward, and
  ``exact_windowsize=True``, which masks the pairs of those blocks farther apart than
  ``window``: exactly the band.
* ``autopad=True`` pads T to a multiple of the window; for a bidirectional call whose T is not a
  multiple, a key mask of all True (padded with False) keeps the padded keys out: without it a
  query near the end would also attend to the zero keys of the padding (causal calls never see
  them).
* no rotary embedding (``use_rotary_pos_emb=False``), scale 1/sqrt(d) (its default), no dropout.
* layout: it packs every leading dimension, so [B, H, T, D] goes in and comes out as it is.

Scores and softmax run in the input dtype (no float32 accumulation of its own beyond what the
matmul does); masked scores take the dtype's most negative value.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError


def local_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int) -> Tensor:
    """``local`` through ``local_attention.LocalAttention``: [B, H, T, D] -> [B, H, T, D]."""
    try:
        from local_attention import LocalAttention
    except ImportError as e:  # installed, but a dependency of it is missing or broken
        raise AttnbenchError(
            f"local:local-attention: the local-attention package does not import ({e}); "
            'reinstall it: pip install -U "attnbench[local]"'
        ) from None

    t = q.shape[-2]
    # A window of t or more keys sees every key, as a window of t does: the library pads T to a
    # multiple of the window, so a window far beyond T (window=10**12) would allocate that much.
    window = max(1, min(window, t))
    layer = LocalAttention(
        window_size=window,
        causal=causal,
        look_backward=1,
        look_forward=0 if causal else 1,
        exact_windowsize=True,
        autopad=True,
        use_rotary_pos_emb=False,
    )
    keys = None  # only a bidirectional call with padding needs the key mask (one more fill)
    if not causal and t % window:
        keys = torch.ones(1, t, dtype=torch.bool, device=q.device)
    return layer(q, k, v, mask=keys)
