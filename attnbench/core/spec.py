"""The declarative records the registry is made of.

A :class:`Mechanism` says what an attention mechanism is (name, family, sources, parameters,
capabilities, complexity, extra inputs) and which paths (:class:`PathSpec`: a function and what
it needs) compute it. Every path function has the same calling convention::

    fn(q, k, v, *, causal: bool, <the parameters and extra inputs it declares>) -> o

with ``q`` of shape ``[B, H, T, D]``, ``k`` of shape ``[B, Hkv, T, D]``, ``v`` of shape
``[B, Hkv, T, Dv]`` and ``o`` of shape ``[B, H, T, Dv]`` (SDPA's layout). Calling the
:class:`PathSpec` passes the function only the keyword arguments its signature names, so a path
declares the parameters it uses and no others. :meth:`Mechanism.not_supported_reasons` is the
one capability check (direction, dtype, backward, the machine a path needs), every reason given.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from attnbench.core.capabilities import Requirement
from attnbench.core.errors import AttnbenchError, unknown
from attnbench.core.sources import Source

PathKind = Literal["reference", "efficient", "fused"]
PATH_KINDS: tuple[str, ...] = ("reference", "efficient", "fused")
ALL_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


@dataclass(frozen=True)
class Param:
    """One parameter of a mechanism.

    ``valid`` decides whether a value is accepted and ``accepted`` says in words what is, for the
    error message (``"an integer >= 1"``). ``parse`` turns command-line text into a value; by
    default the type of ``default`` is used.
    """

    name: str
    default: Any
    help: str
    accepted: str = ""
    valid: Callable[[Any], bool] | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] = ()
    #: Value -> command-line text (the inverse of ``parse``); default ``str``.
    show: Callable[[Any], str] | None = None

    def text(self, value: Any) -> str:
        """The value as a user would type it after ``--param NAME=``."""
        return self.show(value) if self.show is not None else str(value)

    def coerce(self, value: Any, owner: str) -> Any:
        """Parse (if text) and validate one value; raise AttnbenchError naming the parameter."""
        accepted = self.accepted or (
            f"one of {', '.join(map(str, self.choices))}"
            if self.choices
            else type(self.default).__name__
        )
        bad = AttnbenchError(f"{owner}: invalid {self.name}={value!r}; accepted: {accepted}")
        if isinstance(value, str) and not isinstance(self.default, str):
            try:
                value = self._parse_text(value)
            except (ValueError, TypeError):
                raise bad from None
        elif isinstance(self.default, bool):
            if not isinstance(value, bool):
                raise bad
        elif isinstance(self.default, int) and not isinstance(self.default, bool):
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise bad
        elif isinstance(self.default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad
            value = float(value)
        if self.choices and value not in self.choices:
            raise bad
        if self.valid is not None and not self.valid(value):
            raise bad
        return value

    def _parse_text(self, text: str) -> Any:
        if self.parse is not None:
            return self.parse(text)
        if isinstance(self.default, bool):
            return parse_bool(text)
        if isinstance(self.default, int):
            return int(text)
        if isinstance(self.default, float):
            return float(text)
        raise TypeError(f"no parser for {self.name}")


def positive_int(name: str, default: int, help: str) -> Param:
    """An integer parameter that must be >= 1 (window sizes, strides, chunk sizes)."""
    return Param(name, default, help, accepted="an integer >= 1", valid=lambda x: x >= 1)


# --------------------------------------------------------------------------------------------
# Shapes and extra inputs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The shape of one call: q is [batch, heads, seq_len, head_dim], k is [batch, kv_heads,
    seq_len, head_dim], v is [batch, kv_heads, seq_len, value_dim]."""

    batch: int
    heads: int
    seq_len: int
    head_dim: int
    kv_heads: int | None = None  # None: same as heads
    value_dim: int | None = None  # None: same as head_dim
    #: Decoding (:mod:`attnbench.core.decode`): this many new queries against a cache (or a
    #: state) of ``seq_len`` tokens. None: every query, self-attention over ``seq_len`` tokens.
    query_len: int | None = None
    #: A packed batch (:mod:`attnbench.core.varlen`): the lengths of its sequences. None: every
    #: sequence is ``seq_len`` long.
    varlen: tuple[int, ...] | None = None

    @property
    def hkv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def dv(self) -> int:
        return self.head_dim if self.value_dim is None else self.value_dim

    def tag(self) -> str:
        """A test id that spells the shape out: ``B2-H3-T97-D32``."""
        extra = f"-KV{self.kv_heads}" if self.kv_heads is not None else ""
        extra += f"-DV{self.value_dim}" if self.value_dim is not None else ""
        extra += f"-Q{self.query_len}" if self.query_len is not None else ""
        extra += f"-L{'+'.join(map(str, self.varlen))}" if self.varlen is not None else ""
        return f"B{self.batch}-H{self.heads}-T{self.seq_len}-D{self.head_dim}{extra}"


@dataclass(frozen=True)
class ExtraInput:
    """A tensor a mechanism needs besides q, k, v (a learned position bias, decays, projections).

    ``role="parameter"``: a learned weight (a layer holds it as an ``nn.Parameter``);
    ``role="input"``: an activation computed from x, like q (a layer must compute it itself).
    ``shape`` maps the call's :class:`Shape` and resolved params to the tensor's shape; ``when``
    says whether the input is used with these params at all (factorised vs full bias).
    ``init`` gives a layer's starting value, ``init(dims, max_len)``, where it is not random
    (SSMax's scale starts at 1/log(max_len)); None: N(0, init_std^2). Test inputs always draw
    N(0, init_std^2).
    """

    name: str
    doc: str
    shape: Callable[[Shape, Mapping[str, Any]], tuple[int, ...]]
    role: Literal["parameter", "input"] = "parameter"
    init_std: float = 1.0
    when: Callable[[Mapping[str, Any]], bool] = lambda params: True
    init: Callable[[tuple[int, ...], int], torch.Tensor] | None = None


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathSpec:
    """One way to compute a mechanism.

    kind ``reference``: the dense, obviously right oracle that builds the n x n matrix;
    ``efficient``: a faster path in plain PyTorch that runs anywhere; ``fused``: a fused kernel
    (SDPA backend, FlexAttention, Triton) that may need a GPU.

    Call the path itself, not ``fn``: ``path(q, k, v, causal=..., **params, **extras)`` passes
    ``fn`` only the keyword arguments its signature declares (all of them when it takes
    ``**kwargs``), so a path names the parameters it uses and no others.
    """

    name: str
    kind: PathKind
    fn: Callable[..., torch.Tensor]
    memory: str
    requires: tuple[Requirement, ...] = ()
    note: str = ""
    #: False: forward only (the kernel has no backward); asked for a backward, the path is
    #: not supported, with that reason.
    backward: bool = True
    #: An approximate path (a quantised kernel) is judged by its own bound: its output's
    #: largest error against the float64 oracle, relative to the oracle's largest magnitude.
    #: None: an exact path, judged by flash-attention's rule (:mod:`attnbench.core.testing`).
    tolerance: float | None = None
    #: A block-sparse kernel's executed forward FLOPs, whole blocks counted
    #: (``executed_flops(shape, causal, params, device) -> int``): FlexAttention computes every
    #: pair of a block the mask touches. None: the path's work is the mechanism's count.
    executed_flops: Callable[[Shape, bool, Mapping[str, Any], torch.device], int] | None = None
    #: Runs under ``torch.compile``: on the CPU its peak memory is not measured (compiled code
    #: refuses the dispatch mode that counts CPU storage; see :mod:`attnbench.measure.memory`).
    compiled: bool = False
    #: The path's own entry for a packed batch (:mod:`attnbench.core.varlen`):
    #: ``varlen(q, k, v, *, causal, offsets, <what it declares>)`` with q, k, v ``[1, H, T, D]``
    #: holding the sequences end to end and ``offsets`` their starts and the end (int64).
    #: None: a packed batch runs as a loop over its sequences (an honest slow path, so labelled).
    varlen: Callable[..., torch.Tensor] | None = None

    def __call__(self, *args: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.fn(*args, **self.arguments(kwargs))

    def arguments(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments among ``kwargs`` that ``fn`` declares."""
        accepted = declared_keywords(self.fn)
        if accepted is None:
            return dict(kwargs)
        return {key: value for key, value in kwargs.items() if key in accepted}

    def not_supported_reasons(
        self, device: torch.device | str | None = "cpu", backward: bool = False
    ) -> list[str]:
        """Every reason this path cannot run on ``device`` (None: any device); [] when it can."""
        if device is None:
            return []
        device = torch.device(device)
        found = [r for r in (req.check(device, backward) for req in self.requires) if r]
        if backward and not self.backward:
            found.append(f"{self.name} is forward only (no backward)")
        return found

    def unavailable(self, device: torch.device | str = "cpu", backward: bool = False) -> str | None:
        """Why this path cannot run on ``device`` (None when it can), every reason in one line."""
        return "; ".join(self.not_supported_reasons(device, backward)) or None


def declared_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword names ``fn`` declares, or None when it takes ``**kwargs`` (wants them all)."""
    try:
        return _KEYWORDS[fn]
    except KeyError:
        pass
    except TypeError:  # unhashable callable
        return _declared(fn)
    _KEYWORDS[fn] = names = _declared(fn)
    return names


def _declared(fn: Callable[..., Any]) -> frozenset[str] | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params)


_KEYWORDS: dict[Callable[..., Any], frozenset[str] | None] = {}


# --------------------------------------------------------------------------------------------
# Mechanisms
# --------------------------------------------------------------------------------------------


def dense_pattern(n: int, causal: bool, params: Mapping[str, Any]) -> torch.Tensor:
    """Every query sees every key (its own and earlier ones when causal)."""
    full = torch.ones(n, n, dtype=torch.bool)
    return full.tril() if causal else full


def dense_pair_count(n: int, causal: bool, params: Mapping[str, Any]) -> int:
    return n * (n + 1) // 2 if causal else n * n


@dataclass(frozen=True)
class Mechanism:
    """A declarative record of one attention mechanism. See the module docstring for the calling
    convention of its paths; :mod:`attnbench.api` validates inputs and dispatches to a path."""

    name: str
    family: str
    description: str
    #: The works that define it (:mod:`attnbench.core.sources`), the primary one first.
    sources: tuple[Source, ...]
    paths: tuple[PathSpec, ...]
    params: tuple[Param, ...] = ()
    extra_inputs: tuple[ExtraInput, ...] = ()
    causal: bool = True
    bidirectional: bool = True
    backward: bool = True
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    time: str = "O(n^2 d)"
    memory: str = "O(n^2)"
    #: Cross-parameter checks; returns an error message or None.
    check_params: Callable[[Mapping[str, Any]], str | None] | None = None
    #: Checks on the actual tensors beyond the common ones; returns an error message or None.
    check_inputs: (
        Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Mapping[str, Any]], str | None] | None
    ) = None
    #: Shape this mechanism really uses for a requested benchmark shape (e.g. MQA: kv_heads=1).
    adapt_shape: Callable[[Shape, Mapping[str, Any]], Shape] | None = None
    #: The literal rule of a sparse pattern, elementwise: ``visible(i, j, n, causal, params)``
    #: -> bool tensor, for broadcastable integer index tensors i (queries) and j (keys). It gives
    #: :meth:`pattern_matrix` for small n, and serves as a FlexAttention ``mask_mod`` on the GPU.
    #: None: every pair (dense; causal keeps j <= i).
    visible: Callable[..., torch.Tensor] | None = None
    #: Exact number of attended pairs for length n, computed without building the n x n matrix.
    pair_count: Callable[[int, bool, Mapping[str, Any]], int] = dense_pair_count
    #: Forward FLOPs of one call; None means 2 * B * H * pairs * (D + Dv) (QK^T and PV).
    flops: Callable[[Shape, bool, Mapping[str, Any]], int] | None = None
    #: A layer factory for mechanisms that are whole layers or need their own projections;
    #: None means the generic :class:`attnbench.layers.AttentionMixer`.
    layer: Callable[..., torch.nn.Module] | None = None
    #: Whether the layer replaces attention + FFN (GAU, FLASH): models stack it without an FFN.
    whole_block: bool = False
    #: Whether the mechanism lets K/V have fewer heads than Q (MQA/GQA).
    shares_kv: bool = False
    #: Its decode forms (:class:`attnbench.core.decode.DecodePath`, a kind of path): new
    #: queries against a KV cache or a recurrent state built by their own prefill.
    decode: tuple[PathSpec, ...] = ()
    #: Why it has no decode form (required when ``decode`` is empty; the speed suite's row).
    no_decode: str = ""
    notes: str = ""
    aliases: tuple[str, ...] = field(default=())

    @property
    def source(self) -> str:
        """The sources in short form: ``Zhai et al. 2021; Su 2021``."""
        return "; ".join(s.short for s in self.sources)

    # -- paths ---------------------------------------------------------------------------------
    @property
    def path_names(self) -> list[str]:
        return [p.name for p in self.paths]

    @property
    def reference(self) -> PathSpec:
        return next(p for p in self.paths if p.kind == "reference")

    @property
    def default_path(self) -> PathSpec:
        """The path used when none is asked for: the first efficient one, else the reference."""
        return next((p for p in self.paths if p.kind == "efficient"), self.reference)

    def path(self, name: str) -> PathSpec:
        for p in self.paths:
            if p.name == name:
                return p
        raise AttnbenchError(
            f"{self.name} has no path {name!r}; available: {', '.join(self.path_names)}"
        )

    def not_supported_reasons(
        self,
        path: str | PathSpec | None = None,
        *,
        device: torch.device | str | None = "cpu",
        dtype: torch.dtype | None = None,
        causal: bool | None = None,
        backward: bool = False,
    ) -> list[str]:
        """Every reason this mechanism's ``path`` (None: the default path) cannot run a call;
        ``[]`` when it can. What is None is not checked (a layer checks the direction when it is
        built and the device when it first runs). The one capability check: the API, layers,
        ``check``, ``list`` and the speed sweep all ask it."""
        chosen = path if isinstance(path, PathSpec) else self.select(path)
        reasons = []
        if dtype is not None and dtype not in self.dtypes:
            accepted = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            reasons.append(
                f"{self.name} does not support {str(dtype).removeprefix('torch.')} "
                f"(accepted: {accepted})"
            )
        if causal is True and not self.causal:
            reasons.append(f"{self.name} has no causal form")
        if causal is False and not self.bidirectional:
            reasons.append(f"{self.name} is causal only")
        if backward and not self.backward:
            reasons.append(f"{self.name} has no backward (forward only)")
        return reasons + chosen.not_supported_reasons(device, backward)

    def decode_path(self, name: str) -> PathSpec:
        """The decode form called ``name``; an error lists the ones there are, or why none."""
        for p in self.decode:
            if p.name == name:
                return p
        if not self.decode:
            raise AttnbenchError(f"{self.name} has no decode form: {self.no_decode}")
        names = ", ".join(p.name for p in self.decode)
        raise AttnbenchError(f"{self.name} has no decode form {name!r}; available: {names}")

    def select(self, name: str | None) -> PathSpec:
        """The path called ``name``; None is the default path."""
        return self.default_path if name is None else self.path(name)

    def require(
        self,
        path: str | PathSpec | None = None,
        *,
        device: torch.device | str | None = "cpu",
        dtype: torch.dtype | None = None,
        causal: bool | None = None,
        backward: bool = False,
    ) -> PathSpec:
        """The path to run, or an error that gives every reason it cannot and what can."""
        chosen = path if isinstance(path, PathSpec) else self.select(path)
        reasons = self.not_supported_reasons(
            chosen, device=device, dtype=dtype, causal=causal, backward=backward
        )
        if not reasons:
            return chosen
        message = f"{self.name}:{chosen.name} cannot run here: {'; '.join(reasons)}"
        if chosen.not_supported_reasons(device, backward):
            ok = [p.name for p in self.paths if not p.not_supported_reasons(device, backward)]
            message += f"; paths that can: {', '.join(ok) or 'none'}"
        raise AttnbenchError(message)

    def select_path(
        self, name: str | None, device: torch.device | str = "cpu", backward: bool = False
    ) -> PathSpec:
        """The path to run on ``device``, or an error that says why it cannot and what can."""
        return self.require(name, device=device, backward=backward)

    # -- params --------------------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def resolve(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults updated with ``overrides`` (values or command-line text), all validated."""
        overrides = dict(overrides or {})
        out = {}
        by_name = {p.name: p for p in self.params}
        for key in overrides:
            if key not in by_name:
                known = self.param_names
                if not known:
                    raise AttnbenchError(f"{self.name} takes no parameters (got {key!r})")
                raise unknown(f"parameter of {self.name}", key, known)
        for p in self.params:
            out[p.name] = (
                p.coerce(overrides[p.name], self.name) if p.name in overrides else p.default
            )
        if self.check_params is not None:
            problem = self.check_params(out)
            if problem:
                raise AttnbenchError(f"{self.name}: {problem}")
        return out

    # -- shapes, inputs, counts ----------------------------------------------------------------
    def shape_for(self, shape: Shape, params: Mapping[str, Any]) -> Shape:
        return self.adapt_shape(shape, params) if self.adapt_shape else shape

    def extras_for(self, params: Mapping[str, Any]) -> tuple[ExtraInput, ...]:
        return tuple(e for e in self.extra_inputs if e.when(params))

    def pattern_matrix(
        self, n: int, causal: bool, params: Mapping[str, Any] | None = None
    ) -> torch.Tensor:
        """Boolean [n, n], True where query i attends key j (builds n x n: small n only)."""
        params = self.resolve(params)
        if self.visible is not None:
            idx = torch.arange(n)
            return self.visible(idx[:, None], idx[None, :], n, causal, params)
        return dense_pattern(n, causal, params)

    def count_pairs(self, n: int, causal: bool, params: Mapping[str, Any] | None = None) -> int:
        return self.pair_count(n, causal, self.resolve(params))

    def forward_flops(self, shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
        """Forward FLOPs, counted exactly for the pattern (a multiply-add counts as 2)."""
        if self.flops is not None:
            return int(self.flops(shape, causal, params))
        pairs = self.pair_count(shape.seq_len, causal, params)
        return 2 * shape.batch * shape.heads * pairs * (shape.head_dim + shape.dv)

    def complexity_summary(self) -> str:
        return f"time {self.time}, memory {self.memory}"
