"""FlexAttention paths: a mechanism's ``visible`` rule as the ``mask_mod`` of a cached BlockMask,
plus an optional ``score_mod`` (the log-n scale of Attention-E, LongNet's log-multiplicity bias).

FlexAttention (torch >= 2.5, Dong et al. 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels") turns a mask rule into a block-sparse fused kernel: blocks the rule
leaves empty are skipped, so a sliding window of w keys costs O(n w), not O(n^2).

Every call runs ``flex_attention`` under ``torch.compile``; the BlockMask is built once per
(rule, params, n, causal, device) with ``_compile=True`` (never an n x n tensor) and reused.

* CUDA: Triton kernels, forward and backward.
* CPU: Inductor's C++ template (it needs a C++ compiler), forward only: torch has no CPU backward
  for FlexAttention, so asking for gradients on the CPU raises AttnbenchError. The template skips
  the blocks the mask leaves empty (local, window 64, n = 8192: 48 ms against 1.5 s for dense
  flex, one AVX-512 EPYC thread). Each new (length, rule, causal) compiles for about 3-4 s and
  builds its BlockMask for about 4 s (the first call of a process about 17 s more): a benchmark
  of it belongs in a suite made for it, not in the default sweep.

A rule used here is traced by dynamo (even eager flex traces its mask_mod): it must be a pure
tensor expression of (i, j) that does not branch on tensor values or call ``.item()``. Lookup
tables it needs (BigBird's random blocks) must already be on i's device; :func:`warm_rule` calls
the rule once eagerly first, so a rule can build and cache them there.

Must equal: the mechanism's dense reference (softmax over scores with the pattern's masked pairs at
-inf, and the same score modification). Layout: q ``[B, H, T, D]``, k ``[B, Hkv, T, D]``,
v ``[B, Hkv, T, Dv]`` -> ``[B, H, T, Dv]``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core import capabilities
from attnbench.core.capabilities import FLEX, Requirement
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import PathSpec, Shape
from attnbench.kernels.inductor import (  # noqa: F401  (the limits, re-exported)
    ACCUMULATED_RECOMPILE_LIMIT,
    RECOMPILE_LIMIT,
    call_signature,
    raise_dynamo_limits,
    reset_dynamo,
)

#: ``visible(i, j, n, causal, params) -> bool tensor`` (see ``Mechanism.visible``).
VisibleRule = Callable[..., Tensor]
#: FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx) -> score``.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
#: Builds the score_mod for one call: ``(n, causal, params) -> ScoreMod``.
ScoreModBuilder = Callable[[int, bool, Mapping[str, Any]], ScoreMod]

#: dtypes the compiled kernels take (neither the Triton templates nor the CPU's C++ template
#: have float64).
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: How many BlockMasks / score_mods are kept (oldest dropped first).
CACHE_SIZE = 64

_block_masks: OrderedDict[Hashable, Any] = OrderedDict()
_score_mods: OrderedDict[Hashable, ScoreMod] = OrderedDict()
_compiled: dict[str, Callable[..., Tensor]] = {}
#: The call signatures the compiled kernel has met since it was built: each one is a dynamo
#: cache entry (a specialisation), and dynamo refuses more than RECOMPILE_LIMIT of them.
_signatures: set[Hashable] = set()


def _freeze(value: Any) -> Hashable:
    """A hashable stand-in for a parameter value (lists and dicts become tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Tensor):
        raise AttnbenchError("FlexAttention paths take no tensor parameters (got a tensor)")
    return value


def _remember(cache: OrderedDict, key: Hashable, make: Callable[[], Any]) -> Any:
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = make()
    cache[key] = value
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    return value


def mask_mod_for(
    visible: VisibleRule | None, n: int, causal: bool, params: Mapping[str, Any]
) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None:
    """The ``mask_mod(b, h, q_idx, kv_idx)`` of a rule at length n; None for dense bidirectional.

    Causality is ANDed in even when the rule already has it (idempotent, and a rule that forgot
    it cannot leak the future).
    """
    if visible is None and not causal:
        return None

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        seen = kv_idx <= q_idx if causal else None
        if visible is not None:
            rule = visible(q_idx, kv_idx, n, causal, params)
            seen = rule if seen is None else seen & rule
        return seen

    return mask_mod


def warm_rule(
    visible: VisibleRule, n: int, causal: bool, params: Mapping[str, Any], device: torch.device
) -> None:
    """Call the rule once eagerly, on ``device``, before anything traces it.

    torch.compile (and eager flex, which still traces the mask_mod through dynamo) cannot run
    everything a rule may do on its first call, e.g. draw BigBird's random blocks with a seeded
    ``torch.Generator``. A rule that keeps such lookup tables in a cache keyed by
    (n, params, device) builds them here; inside the traced region it then only reads them.
    """
    at = torch.zeros(1, 1, dtype=torch.int64, device=device)  # (1, 1) query 0, key 0
    visible(at, at, n, causal, params)


def block_mask_for(
    visible: VisibleRule | None,
    n: int,
    causal: bool,
    params: Mapping[str, Any],
    device: torch.device,
) -> Any:
    """The BlockMask of a rule (None for dense bidirectional), built once and cached per
    (rule, params, n, causal, device)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (visible, _freeze(params), n, causal, str(device))

    def make() -> Any:
        mask_mod = mask_mod_for(visible, n, causal, params)
        if mask_mod is None:
            return None
        if visible is not None:
            warm_rule(visible, n, causal, params, device)
        # Under compile the mask is evaluated block by block: no n x n tensor. Where Inductor
        # cannot compile for this CPU (no C++ compiler or vector ISA; then no flex call runs
        # here either) it is built eagerly, through the dense mask: only to count blocks.
        compiled = device.type == "cuda" or capabilities.flex("cpu", backward=False) is None
        return create_block_mask(mask_mod, None, None, n, n, device=device, _compile=compiled)

    return _remember(_block_masks, key, make)


def score_mod_for(
    builder: ScoreModBuilder | None, n: int, causal: bool, params: Mapping[str, Any]
) -> ScoreMod | None:
    """The score_mod for this call, cached so that the compiled kernel sees the same function
    object each time (a new closure per call would recompile)."""
    if builder is None:
        return None
    key = (builder, _freeze(params), n, causal)
    return _remember(_score_mods, key, lambda: builder(n, causal, params))


def _kernel(device: torch.device) -> Callable[..., Tensor]:
    """``flex_attention`` under ``torch.compile``, one compiled function per device type: on
    CUDA Triton kernels, on the CPU Inductor's C++ template. Eager flex is never returned: it
    builds the whole score matrix."""
    from torch.nn.attention.flex_attention import flex_attention

    kind = device.type
    if kind not in _compiled:
        # Every new length (and score_mod closure) recompiles; past dynamo's per-function limit
        # (8 by default) dynamo would quietly run flex eagerly, the unfused O(n^2) kernel, in the
        # middle of a sweep: the limits are raised, and a hit is an error.
        raise_dynamo_limits()
        _compiled[kind] = torch.compile(flex_attention, dynamic=False)
    return _compiled[kind]


def reset_compiled() -> None:
    """Forget the compiled kernel and every dynamo cache entry (the BlockMasks and score_mods
    stay): the next call compiles afresh. Inductor's on-disk cache makes that a cache hit for a
    signature compiled before."""
    reset_dynamo()  # every compiled function's, the other compiled paths' too
    _compiled.clear()
    _signatures.clear()


def note_signature(signature: Hashable) -> bool:
    """Count one call signature of the compiled kernel; a new one past half of RECOMPILE_LIMIT
    first resets the compile cache (returns True then). A long sweep or test session meets far
    more (length, dtype, direction, score_mod) combinations than dynamo keeps for one function;
    starting afresh now and then keeps it under the limit, where dynamo would otherwise refuse
    the call (``fail_on_recompile_limit_hit``) or, in older torch, silently run flex eagerly."""
    if signature in _signatures:
        return False
    reset = len(_signatures) >= RECOMPILE_LIMIT // 2
    if reset:
        reset_compiled()
    _signatures.add(signature)
    return reset


def _signature(q: Tensor, k: Tensor, v: Tensor, *extra: Hashable) -> tuple:
    """What dynamo specialises the compiled call on: shapes, strides, dtypes, grad, the rest."""
    return call_signature(q, k, v, *extra)


def check_call(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise AttnbenchError (one line) when FlexAttention cannot run this call here."""
    if q.dtype not in DTYPES:
        ok = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise AttnbenchError(f"FlexAttention does not take {q.dtype}; accepted: {ok}")
    if q.device.type == "cuda":
        return
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if needs_grad:
        raise AttnbenchError(
            "FlexAttention has no backward on CPU (forward only); use a CUDA device or no_grad"
        )


def flex_attention_for(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    params: Mapping[str, Any],
    visible: VisibleRule | None = None,
    score_mod: ScoreModBuilder | None = None,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """FlexAttention with the BlockMask of ``visible`` (and causality) and the score_mod built by
    ``score_mod(n, causal, params)``. q ``[B, H, T, D]``, k ``[B, Hkv, T, D]``,
    v ``[B, Hkv, T, Dv]`` -> ``[B, H, T, Dv]``. ``scale`` None means 1/sqrt(D), applied to
    q.k before the score_mod. Rows that see no key give zeros (as the references do).
    """
    check_call(q, k, v)
    if q.device.type != "cuda":  # the CPU kernel refuses inputs that require grad, even unused
        q, k, v = q.detach(), k.detach(), v.detach()
    n = q.shape[-2]
    block_mask = block_mask_for(visible, n, causal, params, q.device)
    mod = score_mod_for(score_mod, n, causal, params)
    note_signature(_signature(q, k, v, visible, score_mod, _freeze(params), causal, scale,
                              enable_gqa))  # fmt: skip
    kernel = _kernel(q.device)
    try:
        return kernel(
            q, k, v, score_mod=mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa
        )
    except Exception:
        # A failed compiled call (e.g. under a dispatch mode, which the CPU kernel refuses) can
        # leave dynamo refusing every later flex call of the process ("Attempted to call function
        # marked as skipped"): start its caches afresh, then report the failure itself.
        reset_compiled()
        raise


def flex_path(
    visible: VisibleRule | None = None,
    score_mod: ScoreModBuilder | None = None,
    *,
    enable_gqa: bool = False,
    name: str = "flex",
) -> Callable[..., Tensor]:
    """A path function ``fn(q, k, v, *, causal, **params)`` running FlexAttention for a
    mechanism whose pattern is ``visible(i, j, n, causal, params)`` (None: dense) and whose scores
    are modified by the score_mod that ``score_mod(n, causal, params)`` builds (None: plain
    scaled scores). q, k, v: ``[B, H, T, D]`` -> ``[B, H, T, Dv]``.
    """

    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, **params: Any) -> Tensor:
        return flex_attention_for(
            q,
            k,
            v,
            causal=causal,
            params=params,
            visible=visible,
            score_mod=score_mod,
            enable_gqa=enable_gqa,
        )

    fn.__name__ = fn.__qualname__ = name.replace("-", "_")
    return fn


def computed_pairs(
    visible: VisibleRule | None,
    n: int,
    causal: bool,
    params: Mapping[str, Any],
    device: torch.device | str,
) -> int:
    """(query, key) pairs the flex kernel computes at length n: every pair of each block that
    the BlockMask keeps (partial and full blocks alike; a kernel computes a whole block and
    masks inside it), the padding of a ragged last block included. Reads the cached BlockMask
    (the one the path itself runs with), so after a call it costs nothing."""
    device = torch.device(device)
    block_mask = block_mask_for(visible, n, causal, params, device)
    if block_mask is None:  # dense bidirectional: every block
        from torch.nn.attention.flex_attention import _DEFAULT_SPARSE_BLOCK_SIZE as size

        per_side = -(-n // size)
        return per_side * per_side * size * size
    blocks = int(block_mask.kv_num_blocks.sum())
    if block_mask.full_kv_num_blocks is not None:
        blocks += int(block_mask.full_kv_num_blocks.sum())
    q_block, kv_block = block_mask.BLOCK_SIZE
    return blocks * q_block * kv_block


def flex_fused(
    visible: VisibleRule | None = None,
    score_mod: ScoreModBuilder | None = None,
    *,
    enable_gqa: bool = False,
    name: str = "flex",
    note: str = "",
    requires: tuple[Requirement, ...] = (FLEX,),
) -> PathSpec:
    """The registry entry of a FlexAttention path: ``PathSpec(name, "fused", flex_path(...))``,
    compiled on CUDA (forward and backward) and on the CPU (forward only, with a C++ compiler).
    The one-line wiring for a sparse mechanism: ``flex_fused(visible)``; with a score
    modification: ``flex_fused(visible, builder)``.
    """

    def executed(
        shape: Shape, causal: bool, params: Mapping[str, Any], device: torch.device
    ) -> int:
        pairs = computed_pairs(visible, shape.seq_len, causal, params, device)
        return 2 * shape.batch * shape.heads * pairs * (shape.head_dim + shape.dv)

    return PathSpec(
        name,
        "fused",
        flex_path(visible, score_mod, enable_gqa=enable_gqa, name=name),
        memory="O(n) + BlockMask O((n/128)^2) (compiled flex kernel)",
        requires=requires,
        note=note or "FlexAttention, cached BlockMask, compiled",
        executed_flops=executed,
        compiled=True,
    )
