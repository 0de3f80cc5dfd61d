"""A small bidirectional Transformer encoder for byte-level masked-language modelling.

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
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism
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
    heads: int = setting(2, "attention heads; head dim = d_model / heads", valid=at_least(1))
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
    rope_base: float = setting(10000.0, "rotary base")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def __post_init__(self) -> None:
        """The fields that bound each other: heads divide d_model into an even head dim."""
        super().__post_init__()
        if self.d_model % self.heads:
            raise Invalid(
                "heads",
                f"d_model = {self.d_model} is not divisible by heads = {self.heads}; "
                "accepted: heads dividing d_model",
            )
        if self.head_dim % 2:
            raise Invalid(
                "heads",
                f"head dim d_model/heads = {self.head_dim} is odd; rotary needs an even head dim",
            )


@dataclass(frozen=True)
class MixerSpec:
    """Which mechanism mixes tokens in every block: registry name, path, parameters."""

    mechanism: str
    path: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def plain(self) -> dict[str, Any]:
        return asdict(self) | {"params": dict(self.params)}


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


def registry_mixer(mixer: Mixer | MixerSpec) -> MixerFactory:
    """Mixers built by :func:`make_layer` from a registry mechanism, with rotary embedding."""
    mixer = resolved(mixer)
    mech, spec = mixer.mechanism, mixer.spec
    if not mech.bidirectional:
        raise AttnbenchError(
            f"{mech.name} is causal only; the extrapolation model is a bidirectional encoder"
        )

    def build(cfg: ModelConfig, index: int) -> nn.Module:
        rope = Rotary(cfg.head_dim, base=cfg.rope_base)
        return make_layer(
            mech,
            cfg.d_model,
            cfg.heads,
            causal=False,
            path=spec.path,
            params=dict(spec.params),
            rope=rope,
            max_len=cfg.train_len,
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
    """The encoder with ``mixer``'s mechanism in every block (initialised, not trained); a
    :class:`Mixer` is used as resolved, a spec is resolved once here."""
    mixer = resolved(mixer)
    blocks = 2 * cfg.layers if mixer.whole_block else cfg.layers
    model = MLMEncoder(cfg, registry_mixer(mixer), with_ffn=not mixer.whole_block, blocks=blocks)
    init_weights(model)
    return model
