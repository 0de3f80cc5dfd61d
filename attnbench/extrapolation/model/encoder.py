"""A small Transformer over bytes for masked-language modelling (a bidirectional encoder, the
default) or next-byte prediction (a causal decoder, ``model.objective = "clm"``).

The extrapolation experiment of Su 2021 (RoFormer small, MLM, trained at one length): token
embedding, no absolute positions (rotary embedding inside every attention layer), ``layers``
pre-norm blocks, a final LayerNorm and a 256-way byte classifier. Every attention mechanism comes
from :func:`attnbench.layers.make_layer`, so any bidirectional registry mechanism trains in the
same model with no edit. A mechanism whose record says ``whole_block=True`` (GAU, FLASH: the layer
replaces attention + FFN) is stacked without an FFN, twice as many of them (Su 2022: two GAU layers
match one attention + FFN block in parameters, the FLASH paper's convention).

Tokens ``[B, T]`` (byte ids 0..255, :data:`MASK_ID` for a masked position) -> hidden states
``[B, T, C]``; :meth:`MLMEncoder.logits` maps selected hidden states ``[N, C]`` to ``[N, 256]``.

The loss and the accuracy read the masked positions only, so training and evaluation call
:meth:`MLMEncoder.hidden_at`: the same numbers as ``forward(tokens)[mask]``, but the last block's
FFN and the final LayerNorm, which act on each position alone, run on the masked rows only (15 %
of them). In the ``cpu`` preset that is a third of the model's matmul work, and a training step
takes about 30 % less time. The last block's mixer still reads every position.

``model.position`` chooses the position encoding: rotary in every layer (``rope``, the default and
Su 2021's), or ALiBi, T5's relative bias, xPos (:mod:`.position_mixer`, for the softmax variants
O and E), or none at all (``nope``, any mechanism; causal only). A variant may set its own
(``[variants.NAME] position = "alibi"``, :attr:`MixerSpec.position`). With ``objective = "clm"``
every layer is causal and nothing is masked: position t predicts byte t + 1.

``positions`` (``forward``, ``hidden_at``): the rotary positions of each window, ``[B, T]`` or
``[T]``, handed to every block's mixer; None (every evaluation) is 0..T-1. Training with
randomized positions (Ruoss et al. 2023, ``TrainConfig.random_positions``) passes them, which
needs every mixer to take them (:meth:`MLMEncoder.takes_positions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnbench import registry
from attnbench.core.errors import AttnbenchError, unknown
from attnbench.core.spec import Mechanism
from attnbench.extrapolation.model.position_encodings import (
    CAUSAL_ONLY,
    ON_SCORES,
    POSITIONS,
    T5_BUCKETS,
    T5Bias,
)
from attnbench.extrapolation.model.position_mixer import SCORED, PositionMixer
from attnbench.layers import Rotary, make_layer, takes_positions
from attnbench.runtime.schema import Checked, Invalid, at_least, setting

#: Byte values are their own ids; one extra id stands for a masked position.
BYTES = 256
MASK_ID = BYTES
VOCAB = BYTES + 1


@dataclass(frozen=True)
class ModelConfig(Checked):
    """The shape of the encoder (what a checkpoint must agree with); a preset's ``[model]``."""

    d_model: int = setting(128, "width C of the residual stream", valid=at_least(1))
    layers: int = setting(2, "blocks", valid=at_least(1))
    heads: int = setting(2, "attention heads", valid=at_least(1))
    d_head: int = setting(
        0,
        "the dimension of each head's queries, keys and values; 0: d_model / heads (the "
        "attention's inner width heads x d_head may then differ from d_model, as T5's d_kv)",
        valid=at_least(0),
    )
    ffn_mult: int = setting(4, "FFN hidden width = ffn_mult * d_model (GELU)", valid=at_least(1))
    ffn: Literal["gelu", "swiglu"] = setting(
        "gelu",
        "the FFN: gelu (up, GELU, down) or swiglu (Shazeer 2020: down(silu(gate x) * up x), "
        "hidden width 2/3 of gelu's rounded up to a multiple of 8, about the same parameters)",
    )
    train_len: int = setting(
        64,
        "L: the length the model is trained at (the longest one, with train.window_lengths)",
        valid=at_least(1),
    )
    rope_base: float = setting(10000.0, "rotary base (rope and xpos)")
    position: Literal["rope", "alibi", "t5", "nope", "xpos"] = setting(
        "rope",
        "the position encoding of every variant that sets none: "
        + "; ".join(f"{k}: {v}" for k, v in POSITIONS.items()),
    )
    objective: Literal["mlm", "clm"] = setting(
        "mlm",
        "mlm: masked bytes, a bidirectional encoder (Su 2021); clm: next-byte prediction with "
        "the causal mask (train.mask_prob and eval.mask_prob are then unused)",
    )
    t5_buckets: int = setting(
        T5_BUCKETS, "position t5: buckets of the relative position (T5: 32)", valid=at_least(4)
    )
    t5_max_distance: int = setting(
        0,
        "position t5: distances up to it get their own log-spaced buckets, every farther one "
        "shares the last; 0: train_len (T5: 128 at length 512, so that the last bucket is trained)",
        valid=at_least(0),
    )

    @property
    def head_dim(self) -> int:
        """The dimension of each head: ``d_head``, or d_model / heads when it is 0."""
        return self.d_head or self.d_model // self.heads

    @property
    def causal(self) -> bool:
        """Whether every layer is causal (the ``clm`` objective)."""
        return self.objective == "clm"

    @property
    def t5_distance(self) -> int:
        """T5's max_distance: ``t5_max_distance``, or L when 0."""
        return self.t5_max_distance or self.train_len

    def __post_init__(self) -> None:
        """The fields that bound each other: an even head dim, from heads dividing d_model
        unless ``d_head`` sets it."""
        super().__post_init__()
        if not self.d_head and self.d_model % self.heads:
            raise Invalid(
                "heads",
                f"d_model = {self.d_model} is not divisible by heads = {self.heads}; "
                "accepted: heads dividing d_model, or model.d_head set",
            )
        if self.head_dim % 2:
            field_name, what = (
                ("d_head", f"d_head = {self.d_head}") if self.d_head
                else ("heads", f"head dim d_model/heads = {self.head_dim}")
            )  # fmt: skip
            raise Invalid(field_name, f"{what} is odd; rotary needs an even head dim")
        if (problem := position_problem(self.position, self.objective)) is not None:
            raise Invalid("position", problem)


def variant_position_problem(position: str | None, mechanism: str, objective: str) -> str | None:
    """Why a variant's own ``position`` cannot be trained (None: it can, or it sets none): an
    unknown name, a causal-only encoding with the mlm objective, or a bias on a mechanism
    without softmax scores to add it to."""
    if position is None:
        return None
    if position not in POSITIONS:
        return str(unknown("position", position, list(POSITIONS)))
    if (problem := position_problem(position, objective)) is not None:
        return problem
    if position in ON_SCORES and mechanism not in SCORED:
        return (
            f"position {position} is added to the scores of softmax attention and {mechanism} "
            f"has none; accepted: the mechanisms {', '.join(SCORED)}, or position rope or nope"
        )
    return None


def position_problem(position: str, objective: str) -> str | None:
    """Why ``position`` cannot be trained with ``objective`` (None: it can)."""
    if position in CAUSAL_ONLY and objective != "clm":
        why = (
            "without positions a bidirectional encoder cannot tell one order of its input from "
            "another"
            if position == "nope"
            else "its decay zeta^((i - j)/512) grows without bound for keys after the query"
        )
        return (
            f"model.position = {position} needs model.objective = clm: {why}; accepted with "
            "mlm: rope, alibi, t5"
        )
    return None


@dataclass(frozen=True)
class MixerSpec:
    """Which mechanism mixes tokens in every block: registry name, path, parameters, and the
    variant's own position encoding (None: the model's ``position``)."""

    mechanism: str
    path: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    position: str | None = None

    def plain(self) -> dict[str, Any]:
        """As plain data; ``position`` only when the variant sets one (the checkpoint keys of
        variants from before the field stay as they were)."""
        out = asdict(self) | {"params": dict(self.params)}
        if self.position is None:
            del out["position"]
        return out


@dataclass(frozen=True)
class Mixer:
    """A :class:`MixerSpec` resolved against the registry once: the mechanism's record, carried
    from the variant to the model so that nothing resolves the name again. It crosses to a worker
    process as its spec (a record holds functions that do not pickle), resolved there once."""

    spec: MixerSpec
    mechanism: Mechanism

    @classmethod
    def of(cls, spec: MixerSpec) -> Mixer:
        return cls(spec, registry.get(spec.mechanism))

    @property
    def whole_block(self) -> bool:
        """Whether the mechanism's layer replaces attention + FFN (GAU, FLASH)."""
        return bool(getattr(self.mechanism, "whole_block", False))

    def __reduce__(self):
        return (Mixer.of, (self.spec,))


def resolved(mixer: Mixer | MixerSpec) -> Mixer:
    """``mixer`` as a :class:`Mixer` (a spec is resolved here, once)."""
    return mixer if isinstance(mixer, Mixer) else Mixer.of(mixer)


#: A factory for one block's token mixer: (config, block index) -> module [B, T, C] -> [B, T, C].
MixerFactory = Callable[[ModelConfig, int], nn.Module]


def position_of(cfg: ModelConfig, mixer: Mixer | MixerSpec) -> str:
    """The position encoding of a variant: its own, or the model's."""
    spec = mixer.spec if isinstance(mixer, Mixer) else mixer
    return spec.position or cfg.position


def registry_mixer(mixer: Mixer | MixerSpec, position: str = "rope") -> MixerFactory:
    """Mixers of a registry mechanism with the position encoding ``position``: built by
    :func:`make_layer` with rotary embedding (``rope``) or none (``nope``), or a
    :class:`PositionMixer` (ALiBi, T5, xPos; T5's table shared by every layer); causal under
    the ``clm`` objective."""
    mixer = resolved(mixer)
    mech, spec = mixer.mechanism, mixer.spec
    shared: dict[str, T5Bias] = {}

    def build(cfg: ModelConfig, index: int) -> nn.Module:
        if cfg.causal and not mech.causal:
            raise AttnbenchError(f"{mech.name} has no causal form; model.objective = clm needs one")
        if not cfg.causal and not mech.bidirectional:
            raise AttnbenchError(
                f"{mech.name} is causal only; the mlm objective's model is a bidirectional encoder"
            )
        if position in ON_SCORES:
            if position == "t5" and "t5" not in shared:
                shared["t5"] = T5Bias(cfg.heads, cfg.t5_buckets, cfg.t5_distance, not cfg.causal)
            return PositionMixer(
                cfg.d_model, cfg.heads, mechanism=mech.name, params=mech.resolve(dict(spec.params)),
                position=position, causal=cfg.causal, rope_base=cfg.rope_base,
                t5=shared.get("t5"), head_dim=cfg.head_dim,
            )  # fmt: skip
        rope = Rotary(cfg.head_dim, base=cfg.rope_base) if position == "rope" else None
        if cfg.d_head and mech.layer is not None:
            raise AttnbenchError(
                f"model.d_head = {cfg.d_head}: {mech.name} builds its own layer, whose head "
                "size follows d_model and heads; accepted with it: model.d_head = 0"
            )
        return make_layer(
            mech,
            cfg.d_model,
            cfg.heads,
            causal=cfg.causal,
            path=spec.path,
            params=dict(spec.params),
            rope=rope,
            max_len=cfg.train_len,
            head_dim=cfg.d_head or None,
        )

    return build


def is_whole_block(mixer: Mixer | MixerSpec) -> bool:
    """Whether the mechanism's layer replaces attention + FFN (GAU, FLASH)."""
    return resolved(mixer).whole_block


class FeedForward(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))  # (B, T, C)


def swiglu_width(hidden: int) -> int:
    """The SwiGLU hidden width with about the parameters of a GELU FFN of width ``hidden``:
    three matrices instead of two, so 2/3 of it, rounded up to a multiple of 8."""
    return -(-2 * hidden // 24) * 8


class SwiGLU(nn.Module):
    """The gated FFN of Shazeer 2020, "GLU Variants Improve Transformer"
    (https://arxiv.org/abs/2002.05202): ``down(silu(gate(x)) * up(x))``, without biases as in
    the paper."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))  # (B, T, C)


def make_ffn(cfg: ModelConfig) -> nn.Module:
    """The block's FFN as ``cfg.ffn`` says (hidden ``ffn_mult * d_model`` for GELU)."""
    hidden = cfg.ffn_mult * cfg.d_model
    if cfg.ffn == "swiglu":
        return SwiGLU(cfg.d_model, swiglu_width(hidden))
    return FeedForward(cfg.d_model, hidden)


class Block(nn.Module):
    """Pre-norm block: x + mixer(norm(x)), then x + ffn(norm(x)) unless the mixer is whole."""

    def __init__(self, cfg: ModelConfig, mixer: nn.Module, with_ffn: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.mixer = mixer
        self.norm2 = nn.LayerNorm(cfg.d_model) if with_ffn else None
        self.ffn = make_ffn(cfg) if with_ffn else None

    def mix(self, x: Tensor, positions: Tensor | None) -> Tensor:
        """The mixer on norm1(x) [B, T, C]; ``positions`` passed on only when given, so a mixer
        that takes none (an eval-time trick's, a whole-block layer's) is called as always."""
        if positions is None:
            return self.mixer(self.norm1(x))
        return self.mixer(self.norm1(x), positions=positions)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        x = x + self.mix(x, positions)  # (B, T, C)
        if self.ffn is not None:
            x = x + self.ffn(self.norm2(x))  # (B, T, C)
        return x

    def forward_at(self, x: Tensor, rows: Tensor, positions: Tensor | None = None) -> Tensor:
        """``forward(x)[rows]`` ([N, C]; ``rows`` [B, T] bool): the mixer reads every position,
        the FFN (pointwise) runs on the N selected rows only."""
        x = (x + self.mix(x, positions))[rows]  # (N, C)
        if self.ffn is not None:
            x = x + self.ffn(self.norm2(x))  # (N, C)
        return x


class MLMEncoder(nn.Module):
    """Byte-level bidirectional encoder; see the module docstring. ``blocks`` defaults to
    ``cfg.layers``."""

    def __init__(
        self,
        cfg: ModelConfig,
        mixer: MixerFactory,
        *,
        with_ffn: bool = True,
        blocks: int | None = None,
    ):
        super().__init__()
        self.cfg = cfg  # checked when it was made (ModelConfig is a Checked dataclass)
        self.embed = nn.Embedding(VOCAB, cfg.d_model)
        count = cfg.layers if blocks is None else blocks
        self.blocks = nn.ModuleList(Block(cfg, mixer(cfg, i), with_ffn) for i in range(count))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, BYTES)

    def forward(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """tokens [B, T] (long) -> hidden states [B, T, C]; ``positions`` [B, T] or [T]: the
        rotary positions (None: 0..T-1)."""
        x = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            x = block(x, positions)
        return self.norm(x)

    def hidden_at(self, tokens: Tensor, rows: Tensor, positions: Tensor | None = None) -> Tensor:
        """``forward(tokens, positions)[rows]`` -> [N, C] (``rows`` [B, T] bool, N of them set),
        computing the last block's FFN and the final norm on those rows only (see the module
        docstring)."""
        x = self.embed(tokens)  # (B, T, C)
        *early, last = self.blocks
        for block in early:
            x = block(x, positions)
        return self.norm(last.forward_at(x, rows, positions))  # (N, C)

    def takes_positions(self) -> bool:
        """Whether every block's mixer applies rotary embedding at explicit positions (see
        :func:`attnbench.layers.takes_positions`)."""
        return all(takes_positions(block.mixer) for block in self.blocks)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [..., C] -> byte logits [..., 256] (only for the positions that need them)."""
        return self.head(hidden)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def init_weights(model: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style: N(0, std) for every Linear and Embedding weight, zero biases. Parameters a
    mechanism keeps outside Linear layers (learned biases, gates) keep their own init."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def build_model(cfg: ModelConfig, mixer: Mixer | MixerSpec) -> MLMEncoder:
    """The model with ``mixer``'s mechanism in every block, at the variant's position encoding
    (initialised, not trained); a :class:`Mixer` is used as resolved, a spec is resolved once
    here."""
    mixer = resolved(mixer)
    position = position_of(cfg, mixer)
    if (problem := position_problem(position, cfg.objective)) is not None:
        raise AttnbenchError(problem)
    blocks = 2 * cfg.layers if mixer.whole_block else cfg.layers
    factory = registry_mixer(mixer, position)
    model = MLMEncoder(cfg, factory, with_ffn=not mixer.whole_block, blocks=blocks)
    init_weights(model)
    return model
