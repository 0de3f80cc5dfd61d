"""BigBird's block-sparse pattern (Zaheer et al. 2020), on blocks of ``block`` positions.

Query i in block qb = i // block sees key j in block kb = j // block when any of:

* window: |qb - kb| <= (window_blocks - 1) / 2 (3 blocks: the own block and its two neighbours);
* global: kb or qb is one of the first or last ``global_blocks`` blocks (global tokens see
  everything and are seen by everything, the paper's ITC form);
* random: kb is one of ``random_blocks`` blocks drawn for row qb.

Random blocks are drawn per query block (global rows excluded), without replacement, from the
blocks that are neither in the window nor global (when causal: only earlier blocks), so they add
new keys; a row with fewer candidates gets all of them. The draw is reproducible: it depends only
on (seed, n, block, the other parameters, causal), through ``torch.Generator().manual_seed(seed)``.
It is kept as a small ``[n_blocks, random_blocks]`` table (-1 = none), which ``visible`` indexes,
so the rule stays a pure tensor expression (usable as a FlexAttention mask_mod). Drawing costs
O(n_blocks^2) random numbers, once per (n, parameters), cached.

Causal: j <= i as well. BigBird is an encoder pattern; this causal form is the literal one (the
global key blocks at the end only help the last rows). Every query sees itself.

Efficient path: four disjoint parts merged by log-sum-exp: the window (a blocked band), the global
key columns, the random blocks (gathered per query block), and the global query rows against all
keys. Each part's ``keep`` rule excludes what an earlier part holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnbench.core import sources
from attnbench.core.spec import Param, positive_int
from attnbench.variants.sparse.common import masked_reference
from attnbench.variants.sparse.decode import NO_DECODE_BIGBIRD
from attnbench.variants.sparse.engine import Band, Blocks, Full, Indexed, Part, ceil_div
from attnbench.variants.sparse.executor import attend
from attnbench.variants.sparse.record import sparse_mechanism

KEYS = ("block", "window_blocks", "global_blocks", "random_blocks", "seed")


def _floor(x: Tensor, b: int) -> Tensor:
    return torch.div(x, b, rounding_mode="floor")


def _draw(
    n: int, causal: bool, block: int, window_blocks: int, global_blocks: int, random_blocks: int,
    seed: int,
) -> Tensor:  # fmt: skip
    nb, half, g = ceil_div(n, block), (window_blocks - 1) // 2, global_blocks
    count = min(random_blocks, nb)
    if count == 0:
        return torch.empty(nb, 0, dtype=torch.int64)
    qb = torch.arange(nb)[:, None]
    kb = torch.arange(nb)[None, :]
    candidate = ((qb - kb).abs() > half) & (kb >= g) & (kb < nb - g)  # (nb, nb)
    candidate &= (qb >= g) & (qb < nb - g)  # global rows already see everything
    if causal:
        candidate &= kb < qb
    noise = torch.rand(nb, nb, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    noise = torch.where(candidate, noise, 2.0)  # non-candidates sort last
    value, chosen = noise.topk(count, dim=1, largest=False)  # (nb, count)
    chosen = torch.where(value <= 1.0, chosen, -1)
    return chosen.sort(dim=1).values


#: Drawn tables, per (n, causal, params, device); a plain dict, not lru_cache, so that a traced
#: rule (FlexAttention's mask_mod under dynamo) reads a table already on its device instead of
#: tracing the seeded draw (see attnbench.kernels.flex.warm_rule).
_TABLES: dict[tuple, Tensor] = {}
TABLE_CACHE = 64


def random_table(
    n: int, causal: bool, params: Mapping[str, Any], device: torch.device | str = "cpu"
) -> Tensor:
    """The random key blocks of each query block, long ``[n_blocks, random_blocks']`` (-1 =
    none) on ``device``, reproducible from ``seed`` (drawn on the CPU, once per key)."""
    device = torch.device(device)
    key = (n, causal, *(int(params[name]) for name in KEYS), device)
    table = _TABLES.get(key)
    if table is None:
        table = _draw(n, causal, *key[2:-1]).to(device)
        if len(_TABLES) >= TABLE_CACHE:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = table
    return table


def _parts_of_rule(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]):
    """(window, global key, global query, random) pair conditions, elementwise."""
    b, g = params["block"], params["global_blocks"]
    nb, half = ceil_div(n, b), (params["window_blocks"] - 1) // 2
    qb, kb = _floor(i, b), _floor(j, b)
    window = (qb - kb).abs() <= half
    global_key = (kb < g) | (kb >= nb - g)
    global_query = (qb < g) | (qb >= nb - g)
    table = random_table(n, causal, params, i.device)  # (nb, random), on i's device
    row = qb.clamp(0, nb - 1)
    random = torch.zeros((), dtype=torch.bool, device=i.device)
    for t in range(table.shape[1]):
        random = random | (table[:, t][row] == kb)
    return window, global_key, global_query, random


def visible(i: Tensor, j: Tensor, n: int, causal: bool, params: Mapping[str, Any]) -> Tensor:
    """window | global key | global query | random block (and j <= i when causal)."""
    window, global_key, global_query, random = _parts_of_rule(i, j, n, causal, params)
    ok = window | global_key | global_query | random
    return ok & (j <= i) if causal else ok


def pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    """Exact, at block granularity: O(n_blocks * (window + globals + random))."""
    b, g = params["block"], params["global_blocks"]
    nb, half = ceil_div(n, b), (params["window_blocks"] - 1) // 2
    qb = torch.arange(nb)[:, None]
    length = lambda blk: (n - blk * b).clamp(0, b)  # noqa: E731
    window = qb + torch.arange(-half, half + 1)[None, :]
    glob = torch.cat([torch.arange(g), torch.arange(nb - g, nb)]).expand(nb, -1)
    kb = torch.cat([window, glob, random_table(n, causal, params)], dim=1)
    kb = torch.where((kb >= 0) & (kb < nb), kb, -1).sort(dim=1).values  # (nb, slots)
    fresh = torch.ones_like(kb, dtype=torch.bool)
    fresh[:, 1:] = kb[:, 1:] != kb[:, :-1]
    fresh &= kb >= 0
    lq, lk = length(qb), length(kb.clamp_min(0))
    if causal:
        pairs = torch.where(kb < qb, lq * lk, torch.where(kb == qb, lq * (lq + 1) // 2, 0))
    else:
        pairs = lq * lk
    regular = (qb >= g) & (qb < nb - g)  # (nb, 1)
    total = int((pairs * fresh * regular).sum())
    i = torch.arange(n)
    qi = i // b
    in_global = (qi < g) | (qi >= nb - g)
    return total + int(((i + 1) if causal else torch.full_like(i, n))[in_global].sum())


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, **params: Any) -> Tensor:
    """Dense scores with the pattern applied as -inf. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    return masked_reference(visible, q, k, v, causal, params)


def _random_keys(table: Tensor, block: int, b: int, n: int) -> Tensor:
    """The key positions of each query block's random blocks, ``[n_blocks, random * b]``."""
    u = torch.arange(b, device=table.device)
    keys = table[:, :, None] * block + u  # (nb, random, b)
    keys = torch.where((table[:, :, None] >= 0) & (keys < n), keys, -1)
    return keys.flatten(1)


def efficient(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, **params: Any) -> Tensor:
    """Window, global keys, random blocks, global rows; merged by log-sum-exp.
    q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    n, device = q.shape[-2], q.device
    block, g = params["block"], params["global_blocks"]
    nb, half = ceil_div(n, block), (params["window_blocks"] - 1) // 2
    b = min(block, n)

    def split(i: Tensor, j: Tensor):
        return _parts_of_rule(i, j, n, causal, params)

    def outside_window(i: Tensor, j: Tensor) -> Tensor:
        return ~split(i, j)[0]

    def new_random(i: Tensor, j: Tensor) -> Tensor:
        window, global_key, _, _ = split(i, j)
        return ~(window | global_key)

    def the_rest(i: Tensor, j: Tensor) -> Tensor:
        window, global_key, _, random = split(i, j)
        return ~(window | global_key | random)

    def in_window(i: Tensor, j: Tensor) -> Tensor:
        return split(i, j)[0]

    parts = [Part(Blocks(n, b), Band(n, b, half, 0 if causal else half), keep=in_window)]
    pos = torch.arange(n, device=device)
    global_pos = pos[(pos // block < g) | (pos // block >= nb - g)][None]  # (1, globals)
    if global_pos.numel():
        parts.append(Part(Full(n), Indexed(n, global_pos), keep=outside_window))
    table = random_table(n, causal, params, device)  # (nb, random)
    if (table >= 0).any():
        keys = _random_keys(table, block, b, n)  # (nb, random * b)
        parts.append(Part(Blocks(n, b), Indexed(n, keys), keep=new_random))
    if global_pos.numel():
        parts.append(Part(Indexed(n, global_pos), Full(n), keep=the_rest))
    rule = lambda i, j: visible(i, j, n, causal, params)  # noqa: E731
    return attend(q, k, v, parts, rule, key=("bigbird", causal, *sorted(params.items())))


def _nonneg(name: str, default: int, help: str) -> Param:
    return Param(name, default, help, accepted="an integer >= 0", valid=lambda x: x >= 0)


MECHANISM = sparse_mechanism(
    name="bigbird",
    description="BigBird: block window + global first/last blocks + random blocks per row",
    sources=(sources.ZAHEER_2020,),
    params=(
        positive_int("block", 64, "block length in positions"),
        Param(
            "window_blocks",
            3,
            "sliding window in blocks, centred on the query's block",
            accepted="an odd integer >= 1",
            valid=lambda x: x >= 1 and x % 2 == 1,
        ),
        _nonneg("global_blocks", 1, "global blocks at each end (first and last)"),
        _nonneg("random_blocks", 3, "random key blocks per query block"),
        _nonneg("seed", 0, "seed of the random blocks (the pattern is reproducible)"),
    ),
    visible=visible,
    pair_count=pair_count,
    reference=reference,
    efficient=efficient,
    efficient_memory="O(n * block * (window + 2 globals + random))",
    efficient_note="band + global columns + gathered random blocks + global rows, lse-merged",
    flex_note="FlexAttention, window ∪ global ∪ random blocks as a BlockMask",
    time="O(n b (w + 2g + r) d)",
    memory="O(n b (w + 2g + r))",
    no_decode=NO_DECODE_BIGBIRD,
)
