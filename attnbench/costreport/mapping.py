"""Which registry path computes an extrapolation row's attention: the mapping, as data.

Two tables, each entry a :class:`Route` (mechanism, path, parameters, a one-line reason):

- :data:`TRAINED`: a trained row by its mechanism. The route names the path the model runs
  when the row names none (``Mechanism.default_path``); a row that names a path is costed at
  that path. ``params=None`` means the row's own parameters (``local-32``: window 32).
- :data:`EVAL_TIME`: an evaluation-time trick on the trained O (``O+logn``, ``O+rerope+logn``)
  by its name in :data:`attnbench.extrapolation.model.tricks.TRICKS`. A row composes tricks with
  ``+``; a trick that only rescales the scores or changes the rotary frequencies (``rescale_only``)
  adds O(n d) work to whatever the others run, so a row is costed by its one trick that is not
  rescale-only (dense SDPA when all are). Two tricks with different paths: not joined. A ``^P``
  suffix (``logn^2``) or an ``@W`` suffix (``rerope@48``: the row's window) is a setting
  of its trick; an older name (``yarn-temp``) is read as today's. A trick that runs another
  path in the model's last layer (HWFA: local windows, then full attention) says so
  (``last_layer``): its time is the mean over the model's layers.

Parameter values of a route may name the row's settings: ``{train_len}`` (L),
``{local_window}`` and ``{rerope_window}`` (the evaluation windows, from the run's sidecar).

The cost is what the row's attention would cost computed well, which is not always how the
evaluation computed it: ``O+local`` was evaluated as a dense SDPA under an n x n mask (the same
numbers) and is costed at the ``local`` mechanism's banded path, which never builds n x n.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnbench import registry
from attnbench.bench.results import params_text
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.tricks import RENAMED, WINDOW_MARK

#: ``params=None`` in a route: the row's own parameters.
ROW_PARAMS = None


@dataclass(frozen=True)
class Route:
    """Where one kind of row's attention cost is measured.

    ``time_factor`` multiplies the measured time when the row does a known multiple of the
    path's work (ReRoPE). ``rescale_only``: an evaluation-time trick that only scales scores or
    rotates q and k differently, composable with any other trick at O(n d) cost.
    ``single_head_dim``: the mechanism's layer is one head whose q/k width is this parameter
    (GAU, FLASH ignore the model's heads), so its speed case is heads 1 x that head dim.
    ``last_layer``: the model's last layer runs this route instead (HWFA); the row's time per
    call is then the mean over the model's layers, its memory the larger of the two."""

    mechanism: str
    path: str
    reason: str
    params: Mapping[str, Any] | None = None
    time_factor: float = 1.0
    rescale_only: bool = False
    single_head_dim: str | None = None
    last_layer: Route | None = None

    @property
    def impl(self) -> str:
        return f"{self.mechanism}:{self.path}"


#: Dense softmax through SDPA: what O runs, and what every rescaling trick on O runs.
SDPA = ("softmax", "efficient")


def _rescale(reason: str) -> Route:
    return Route(*SDPA, reason, params={}, rescale_only=True)


def _own(mechanism: str, path: str, reason: str, **extra: Any) -> Route:
    """The mechanism's own path with the row's parameters."""
    return Route(mechanism, path, reason, params=ROW_PARAMS, **extra)


#: Keys within +-local_window through the local mechanism's banded path.
_LOCAL = Route(
    "local",
    "efficient",
    "keys within +-local_window: the local mechanism's banded path (no n x n); the "
    "evaluation masked a dense SDPA instead (same numbers, dense cost)",
    params={"window": "{local_window}"},
)

#: ReRoPE and Leaky ReRoPE: three n x n score products (rotated, remapped at +w, at -w) and one
#: PV product where the dense reference path does one and one.
_THREE_SCORES = (
    "three score products (rotated; remapped beyond +w; beyond -w) where the reference "
    "computes one, so time x 2 (matmul FLOPs 8 n^2 d against 4 n^2 d); memory: the "
    "reference's, a lower bound"
)

EVAL_TIME: dict[str, Route] = {
    "logn": _rescale("a per-row factor on the scores, folded into q: O's SDPA call + O(n d)"),
    "temperature": _rescale("a constant factor on the scores, folded into q: O's SDPA call"),
    "yarn": _rescale("other rotary frequencies and a factor on q: O's SDPA call"),
    "ntk": _rescale("another rotary base: O's SDPA call"),
    "pi": _rescale("rotary positions scaled by L/n: O's SDPA call"),
    "yarn-dim": _rescale("other rotary frequencies and a factor on q: O's SDPA call"),
    "local": _LOCAL,
    "chunk": Route(
        "longnet",
        "efficient",
        "independent L-token chunks are block-diagonal attention: LongNet with one segment of "
        "L and dilation 1 (dense inside blocks, no n x n)",
        params={"segments": "{train_len}:1"},
    ),
    "rerope": Route(
        "softmax",
        "reference",
        f"dense n x n scores, as ReRoPE's evaluation builds them; {_THREE_SCORES}",
        params={},
        time_factor=2.0,
    ),
    "leaky": Route(
        "softmax",
        "reference",
        f"dense n x n scores, as Leaky ReRoPE's evaluation builds them; {_THREE_SCORES}",
        params={},
        time_factor=2.0,
    ),
    "hwfa": Route(
        "local",
        "efficient",
        "keys within +-local_window in every layer but the last (the local mechanism's banded "
        "path), full attention x log_L n in the last (O's SDPA call): the mean over the layers",
        params={"window": "{local_window}"},
        last_layer=Route(*SDPA, "full attention, the log n factor folded into q", params={}),
    ),
}

_SPARSE = "its own block-sparse path: dense inside gathered blocks, no n x n"
_AFT = "its own path: the AFT sums without an n x n x d tensor"
_GAU = (
    "its own path; the layer is one head of q/k width s (the model stacks twice as many of "
    "these layers and no FFN: one call costed, as for every row)"
)

TRAINED: dict[str, Route] = {
    "softmax": Route(*SDPA, "dense softmax through SDPA: the path the model runs", params={}),
    "softmax-logn": Route(
        *SDPA, "log_512 n is a per-row factor folded into q: O's SDPA call + O(n d)", params={}
    ),
    "ssmax": _own("ssmax", "efficient", "s log n folded into q: an SDPA call, as O's"),
    "flash-tiled": _own("flash-tiled", "efficient", "its own tiled online-softmax path"),
    "mqa": _own("mqa", "efficient", "SDPA with one K/V head"),
    "gqa": _own("gqa", "efficient", "SDPA with kv_heads K/V heads"),
    "local": _own("local", "efficient", "its own banded path (no n x n)"),
    "atrous": _own("atrous", "efficient", _SPARSE),
    "sparse": _own("sparse", "efficient", _SPARSE),
    "strided": _own("strided", "efficient", _SPARSE),
    "fixed": _own("fixed", "efficient", _SPARSE),
    "bigbird": _own("bigbird", "efficient", _SPARSE),
    "longnet": _own("longnet", "efficient", _SPARSE),
    "aft-full": _own("aft-full", "efficient", _AFT),
    "aft-local": _own("aft-local", "efficient", _AFT),
    "aft-simple": _own("aft-simple", "efficient", _AFT),
    "aft-conv": _own("aft-conv", "efficient", _AFT),
    "gau": _own("gau", "efficient", _GAU, single_head_dim="s"),
    "flash": _own("flash", "efficient", _GAU, single_head_dim="s"),
    "mc-softmax": _own("mc-softmax", "efficient", "its own chunked path"),
    "linear": _own("linear", "chunkwise", "its own chunkwise path (the model's default)"),
}


class Unmapped(Exception):
    """A row the mapping cannot cost; the message says why (it goes to the not-joined list)."""


@dataclass(frozen=True)
class Row:
    """What the mapping reads of one extrapolation row (one variant of the table)."""

    variant: str
    kind: str
    applied_to: str = ""
    mechanism: str = ""
    path: str = ""
    params: str = ""  # the table's JSON text


@dataclass(frozen=True)
class Context:
    """The run's settings a route may name, and the model's attention shape."""

    train_len: int
    local_window: int
    rerope_window: int
    heads: int
    head_dim: int
    layers: int = 1


@dataclass(frozen=True)
class Cost:
    """A row's route, resolved: the speed case that prices it (its ``params`` as the speed
    CSV writes them), the factor on its time, the reason, and the shape the model's layer runs
    (to compare with the shape the speed case was measured at)."""

    mechanism: str
    path: str
    params: str
    time_factor: float
    reason: str
    heads: int
    head_dim: int
    #: What the model's last layer runs instead, of ``layers`` (HWFA); None: every layer alike.
    last_layer: Cost | None = None
    layers: int = 1

    @property
    def impl(self) -> str:
        return f"{self.mechanism}:{self.path}"

    def describe(self) -> str:
        """``local:efficient``, or ``local:efficient; last of 2 layers: softmax:efficient``."""
        if self.last_layer is None:
            return self.impl
        return f"{self.impl}; last of {self.layers} layers: {self.last_layer.impl}"


def cost_of(row: Row, context: Context) -> Cost:
    """The cost of ``row``'s attention; :class:`Unmapped` saying why when there is none."""
    if row.kind == "trained":
        return _trained(row, context)
    if row.kind == "eval-time":
        return _eval_time(row, context)
    raise Unmapped(f"kind {row.kind!r} has no attention to cost")


def _trained(row: Row, context: Context) -> Cost:
    route = TRAINED.get(row.mechanism)
    if route is None:
        raise Unmapped(f"no mapping entry for the trained mechanism {row.mechanism!r}")
    path = row.path if row.path and route.mechanism == row.mechanism else route.path
    given = _row_params(row) if route.params is ROW_PARAMS else route.params
    return _resolve(route, path, given, route.reason, context)


def _row_params(row: Row) -> dict[str, Any]:
    if not row.params:
        return {}
    try:
        params = json.loads(row.params)
    except ValueError:
        raise Unmapped(f"its params {row.params!r} are not JSON") from None
    if not isinstance(params, dict):
        raise Unmapped(f"its params {row.params!r} are not a table")
    return params


def tricks_of(row: Row) -> list[str]:
    """``O+rerope@48+logn`` applied to O -> ``["rerope", "logn"]``."""
    base = row.applied_to or "O"
    label = row.variant.removeprefix(f"{base}+")
    # A ``^P`` or ``@W`` suffix is a setting of its trick (``logn^2``: the power; ``rerope@48``:
    # the window, on which ReRoPE's cost does not depend), not another trick; an older table's
    # name is read as today's (``yarn-temp``: ``temperature``).
    names = [_bare(t) for t in label.split("+") if t.strip()]
    return [RENAMED.get(name, name) for name in names]


def _bare(trick: str) -> str:
    """``logn^2`` -> ``logn``, ``rerope@48`` -> ``rerope``: the trick without its setting."""
    return trick.strip().partition("^")[0].partition(WINDOW_MARK)[0]


def _eval_time(row: Row, context: Context) -> Cost:
    if row.mechanism and row.mechanism != SDPA[0]:
        raise Unmapped(
            f"evaluation-time tricks are mapped for a softmax base; its base runs {row.mechanism}"
        )
    tricks = tricks_of(row)
    missing = [t for t in tricks if t not in EVAL_TIME]
    if missing or not tricks:
        what = ", ".join(repr(t) for t in missing) or repr(row.variant)
        raise Unmapped(f"no mapping entry for the evaluation-time trick {what}")
    routes = {t: EVAL_TIME[t] for t in tricks}
    structural = [t for t in tricks if not routes[t].rescale_only]
    if len({_key(routes[t]) for t in structural}) > 1:
        named = ", ".join(f"{t} ({routes[t].impl})" for t in structural)
        raise Unmapped(f"its tricks are costed by different paths: {named}")
    name = structural[0] if structural else tricks[0]
    chosen, reason = routes[name], routes[name].reason
    others = [t for t in tricks if t != name and routes[t].rescale_only]
    if others:
        reason += f"; {', '.join(others)} on top: rescaling, O(n d)"
    return _resolve(chosen, chosen.path, chosen.params or {}, reason, context)


def _key(route: Route) -> tuple[str, str, str, float]:
    """What makes two routes the same cost."""
    return route.mechanism, route.path, json.dumps(route.params, sort_keys=True), route.time_factor


def _resolve(
    route: Route, path: str, given: Mapping[str, Any], reason: str, context: Context
) -> Cost:
    """The route's mechanism, path and parameters checked against the registry."""
    try:
        mech = registry.get(route.mechanism)
        mech.path(path)
        params = mech.resolve({k: _filled(v, context) for k, v in given.items()})
    except AttnbenchError as e:
        raise Unmapped(str(e)) from None
    heads, head_dim = context.heads, context.head_dim
    if route.single_head_dim is not None:
        heads, head_dim = 1, int(params[route.single_head_dim])
    last = route.last_layer
    return Cost(
        mechanism=mech.name,
        path=path,
        params=params_text(params),
        time_factor=route.time_factor,
        reason=reason,
        heads=heads,
        head_dim=head_dim,
        last_layer=None
        if last is None
        else _resolve(last, last.path, last.params or {}, last.reason, context),
        layers=context.layers,
    )


def _filled(value: Any, context: Context) -> Any:
    """A template value (``"{local_window}"``) with the row's settings filled in."""
    if not isinstance(value, str) or "{" not in value:
        return value
    return value.format(
        train_len=context.train_len,
        local_window=context.local_window,
        rerope_window=context.rerope_window,
    )


def mapping_lines() -> list[tuple[str, str, str, str, str]]:
    """The whole mapping as (row, mechanism:path, parameters, time factor, reason) lines, for
    the report: evaluation-time tricks first (``O+NAME``), then trained mechanisms."""
    lines = []
    for name, route in EVAL_TIME.items():
        lines.append((f"O+{name}", *_shown(route)))
    for name, route in TRAINED.items():
        lines.append((f"trained {name}", *_shown(route)))
    return lines


def _shown(route: Route) -> tuple[str, str, str, str]:
    if route.params is ROW_PARAMS:
        params = "the row's"
    else:
        params = ", ".join(f"{k}={v}" for k, v in route.params.items()) or "-"
    impl = route.impl
    if route.last_layer is not None:
        impl += f"; last layer: {route.last_layer.impl}"
    return impl, params, f"{route.time_factor:g}", route.reason
