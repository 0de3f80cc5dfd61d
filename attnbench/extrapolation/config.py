"""Configuration of the extrapolation experiment: presets (TOML shipped in
``attnbench/data/suites/extrapolate/``, read by :mod:`attnbench.runtime.tomlconfig` like the
speed suites, so every error names the file and line), overrides, and the variants (rows) of the
table.

A preset file has the sections ``[model]`` (:class:`ModelConfig`), ``[train]``
(:class:`TrainConfig`), ``[eval]`` (:class:`EvalConfig`), ``[run]`` (:class:`RunConfig`) and
optional ``[variants.NAME]`` tables (``mechanism``, ``path``, ``params``) that name trained
variants. Every field can be overridden from the command line.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench import registry
from attnbench.core.errors import AttnbenchError, unknown
from attnbench.extrapolation.model import MixerSpec, ModelConfig
from attnbench.extrapolation.train import TrainConfig
from attnbench.extrapolation.tricks import Tricks, parse_tricks
from attnbench.runtime import tomlconfig

DEFAULT_EVAL_TIME = (
    "logn", "temperature", "yarn", "local", "chunk", "ntk", "pi", "rerope", "rerope+logn"
)  # fmt: skip


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate (not part of the checkpoint key: ``--eval-only`` may change all of it)."""

    lengths: tuple[int, ...] = (64, 128, 256, 512, 1024)  # evaluation lengths n
    tokens: int = 65536  # the held-out span evaluated at every n (tokens // chunk pieces)
    #: Contiguous tokens per piece of the span: see :meth:`piece`.
    chunk: int = 1024
    seed: int = 1234  # fixes the masked positions of the span (same for every variant)
    batch_tokens: int = 4096  # tokens per evaluation batch
    entropy_tokens: int = 2048  # attention entropy on the first tokens of the span (>= 1 window)
    local_window: int = 0  # eval-time "local": keys within +-local_window; 0 means L/2
    rerope_window: int = 0  # eval-time "rerope": relative positions clipped at +-w; 0 means L/2

    def piece(self) -> int:
        """Tokens per piece of the evaluation span: ``chunk`` (at most ``tokens``), raised to
        the longest length when that is longer. Adding or dropping lengths up to it never moves
        the pieces, so it never changes the other lengths' numbers."""
        return max(max(self.lengths), min(self.chunk, self.tokens))

    def check(self) -> None:
        bad = [n for n in self.lengths if n < 1]
        if not self.lengths or bad:
            raise AttnbenchError(
                f"invalid evaluation lengths {list(self.lengths)}; accepted: integers >= 1"
            )
        for name in ("tokens", "batch_tokens", "chunk"):
            if getattr(self, name) < 1:
                raise AttnbenchError(f"invalid eval {name}={getattr(self, name)}; accepted: >= 1")
        for name in ("entropy_tokens", "local_window", "rerope_window"):
            if getattr(self, name) < 0:
                raise AttnbenchError(f"invalid eval {name}={getattr(self, name)}; accepted: >= 0")


@dataclass(frozen=True)
class RunConfig:
    """What to run."""

    variants: tuple[str, ...] = ("O", "E")  # trained variants (names: see VARIANTS / [variants])
    eval_time: tuple[str, ...] = DEFAULT_EVAL_TIME  # eval-time rows applied to the trained O
    seeds: int = 1  # number of training seeds
    seed_start: int = 0  # first seed
    threads: int = 0  # torch CPU threads; 0: every core this process may use
    #: Trainings at once on a CPU, each in its own process with threads / parallel threads;
    #: 0: as many as there are cores (two 1-thread trainings out-train one 2-thread one by
    #: ~20 % on 2 cores: small matmuls do not split well). 1: one after the other.
    parallel: int = 0
    device: str = "auto"  # "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:1"...
    ckpt_every: int = 500  # steps between periodic checkpoints
    holdout: float = 0.1  # last share of the corpus kept for evaluation
    #: Steps between measurements of the held-out loss during training (0: none); on a fixed
    #: probe of ``heldout_windows`` held-out windows at the training length (the curves CSV).
    heldout_every: int = 250
    heldout_windows: int = 256
    corpus: str = ""  # a text file or folder; "" is the shipped Shakespeare

    def check(self) -> None:
        if self.seeds < 1:
            raise AttnbenchError(f"invalid seeds={self.seeds}; accepted: >= 1")
        if self.seed_start < 0:
            raise AttnbenchError(f"invalid seed_start={self.seed_start}; accepted: >= 0")
        if self.threads < 0:
            raise AttnbenchError(f"invalid threads={self.threads}; accepted: >= 0 (0: all)")
        if self.parallel < 0:
            raise AttnbenchError(f"invalid parallel={self.parallel}; accepted: >= 0 (0: auto)")
        if self.ckpt_every < 0:
            raise AttnbenchError(f"invalid ckpt_every={self.ckpt_every}; accepted: >= 0")
        for name in ("heldout_every", "heldout_windows"):
            if getattr(self, name) < 0:
                raise AttnbenchError(f"invalid {name}={getattr(self, name)}; accepted: >= 0")
        if not 0.0 < self.holdout < 1.0:
            raise AttnbenchError(f"invalid holdout={self.holdout}; accepted: a fraction in (0, 1)")
        if not (self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps")):
            raise AttnbenchError(
                f"invalid device={self.device!r}; accepted: auto, cpu, cuda, cuda:N, mps"
            )
        if not self.variants:
            raise AttnbenchError("no trained variants; accepted: at least one, e.g. O,E")


#: Trained variants every preset knows. E is Su 2021's log_512 n; E-ln the natural log
#: (Chiang & Cholak 2022).
VARIANTS: dict[str, MixerSpec] = {
    "O": MixerSpec("softmax"),
    "E": MixerSpec("softmax-logn", params={"base": 512.0}),
    "E-ln": MixerSpec("softmax-logn", params={"base": "e"}),
}

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "eval": EvalConfig, "run": RunConfig}


@dataclass(frozen=True)
class ExtrapConfig:
    preset: str
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    variant_defs: Mapping[str, MixerSpec] = field(default_factory=lambda: dict(VARIANTS))
    description: str = ""

    def check(self) -> None:
        self.model.check()
        self.train.check()
        self.eval.check()
        self.run.check()

    def plain(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "description": self.description,
            **{name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS},
            "variant_defs": {k: v.plain() for k, v in self.variant_defs.items()},
        }

    def override(self, values: Mapping[str, Any]) -> ExtrapConfig:
        """Apply ``{"section.field": value}``; values may be command-line text."""
        sections: dict[str, dict[str, Any]] = {}
        for dotted, value in values.items():
            section, field_name = split_key(dotted)
            sections.setdefault(section, {})[field_name] = value
        new = self
        for section, fields in sections.items():
            current = getattr(new, section)
            coerced = {k: coerce(section, k, getattr(current, k), v) for k, v in fields.items()}
            new = dataclasses.replace(new, **{section: dataclasses.replace(current, **coerced)})
        return new


def field_names(section: str) -> list[str]:
    return [f.name for f in dataclasses.fields(SECTIONS[section])]


def all_keys() -> list[str]:
    return [f"{s}.{f}" for s in SECTIONS for f in field_names(s)]


def split_key(dotted: str) -> tuple[str, str]:
    """``"train.steps"`` or a bare field name that is unique (``"steps"``)."""
    if "." in dotted:
        section, name = dotted.split(".", 1)
        if section not in SECTIONS or name not in field_names(section):
            raise unknown("setting", dotted, all_keys())
        return section, name
    owners = [s for s in SECTIONS if dotted in field_names(s)]
    if len(owners) != 1:
        raise unknown("setting", dotted, all_keys())
    return owners[0], dotted


def coerce(section: str, name: str, current: Any, value: Any) -> Any:
    """Turn TOML or command-line values into the field's type; one-line errors."""
    bad = AttnbenchError(
        f"invalid {section}.{name}={value!r}; accepted: {type(current).__name__}"
        + (" (comma-separated)" if isinstance(current, tuple) else "")
    )
    try:
        if isinstance(current, tuple):
            items = value.split(",") if isinstance(value, str) else list(value)
            items = [i.strip() if isinstance(i, str) else i for i in items]
            items = [i for i in items if i != ""]
            if [str(i).lower() for i in items] == ["none"]:
                return ()
            kind = type(current[0]) if current else str
            if kind is int:
                return tuple(_to_int(i) for i in items)
            return tuple(str(i) for i in items)
        if isinstance(current, bool):
            if isinstance(value, bool):
                return value
            return str(value).lower() in ("1", "true", "yes", "on")
        if isinstance(current, int):
            return _to_int(value)
        if isinstance(current, float):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (ValueError, TypeError):
        raise bad from None


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError
        return int(value)
    return int(str(value).strip())


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    return tomlconfig.names_in(tomlconfig.PRESETS_DIR)


def find_preset(name_or_path: str) -> Path:
    """A preset name (``cpu``) or a path to a TOML file."""
    return tomlconfig.find_config(name_or_path, tomlconfig.PRESETS_DIR, "preset")


def load_preset(name_or_path: str) -> ExtrapConfig:
    """A preset file as an :class:`ExtrapConfig`; every error names the file and the line."""
    text = tomlconfig.load(find_preset(name_or_path), "preset")
    data = dict(text.data)
    description = data.pop("description", "")
    if not isinstance(description, str):
        raise text.error(("description",), "description must be a string")
    cfg = ExtrapConfig(preset=text.path.stem, description=description)
    defs = dict(VARIANTS)
    variants = data.pop("variants", {})
    if not isinstance(variants, dict):
        raise text.error(("variants",), "variants must be tables: [variants.NAME]")
    for vname, table in variants.items():
        defs[vname] = variant_from_table(vname, table, text)
    for section, table in data.items():
        if section not in SECTIONS or not isinstance(table, dict):
            raise text.error(
                (section,),
                f"unknown section [{section}]; accepted: "
                + ", ".join(f"[{s}]" for s in (*SECTIONS, "variants.NAME")),
            )
        for key, value in table.items():
            try:
                cfg = cfg.override({f"{section}.{key}": value})
            except AttnbenchError as e:
                raise text.error((section, key), str(e)) from None
    return dataclasses.replace(cfg, variant_defs=defs)


def variant_from_table(name: str, table: Any, text: tomlconfig.SuiteText) -> MixerSpec:
    where = ("variants", name)
    if not isinstance(table, dict) or "mechanism" not in table:
        raise text.error(where, f'[variants.{name}] needs mechanism = "NAME"')
    extra = set(table) - {"mechanism", "path", "params"}
    if extra:
        raise text.error(
            (*where, sorted(extra)[0]),
            f"[variants.{name}] has unknown keys {sorted(extra)}; "
            "accepted: mechanism, path, params",
        )
    return MixerSpec(table["mechanism"], table.get("path"), dict(table.get("params", {})))


# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainedVariant:
    """A row trained from scratch: its label and its mixer, parameters resolved."""

    label: str
    spec: MixerSpec

    @property
    def file_stem(self) -> str:
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", self.label)


@dataclass(frozen=True)
class EvalTimeVariant:
    """A row evaluated on a trained model (``base``) without retraining."""

    label: str
    base: str
    tricks: Tricks


def resolve_spec(spec: MixerSpec, label: str) -> MixerSpec:
    """Validate a spec against the registry: known, bidirectional, trainable, params resolved."""
    mech = registry.get(spec.mechanism)
    if spec.path is not None:
        mech.path(spec.path)
    if not mech.bidirectional:
        bidir = [m.name for m in registry.MECHANISMS if m.bidirectional]
        raise AttnbenchError(
            f"variant {label}: {mech.name} is causal only and the extrapolation model is a "
            f"bidirectional encoder; bidirectional mechanisms: {', '.join(bidir)}"
        )
    if not mech.backward:
        raise AttnbenchError(f"variant {label}: {mech.name} has no backward pass; cannot train it")
    params = {k: _plain(v) for k, v in mech.resolve(dict(spec.params)).items()}
    return MixerSpec(mech.name, spec.path, params)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def known_variant_names(cfg: ExtrapConfig) -> list[str]:
    return list(cfg.variant_defs) + [m.name for m in registry.MECHANISMS if m.bidirectional]


def resolve_variants(
    cfg: ExtrapConfig, impls: list[str] | None = None, impl_params: Mapping[str, str] | None = None
) -> tuple[list[TrainedVariant], list[str]]:
    """The trained rows: ``cfg.run.variants`` (preset names or registry names), then every
    ``--impl NAME[:PATH]`` with ``impl_params``; ``all`` adds every bidirectional mechanism not
    yet in the table. Returns (variants, notes about what was skipped)."""
    notes: list[str] = []
    out: dict[str, TrainedVariant] = {}
    for name in cfg.run.variants:
        if name in cfg.variant_defs:
            spec = cfg.variant_defs[name]
        else:
            mech_name, _, path = name.partition(":")
            try:
                registry.get(mech_name)
            except AttnbenchError:
                raise unknown("variant", name, known_variant_names(cfg)) from None
            spec = MixerSpec(mech_name, path or None)
        out.setdefault(name, TrainedVariant(name, resolve_spec(spec, name)))
    impl_params = dict(impl_params or {})
    expanded: list[str] = []
    for text in impls or []:
        if text == "all":
            taken = {v.spec.mechanism for v in out.values()}
            for mech in registry.MECHANISMS:
                if mech.name in taken or mech.name in ("softmax", "softmax-logn"):
                    continue
                if not mech.bidirectional:
                    notes.append(f"skipped {mech.name}: causal only (the model is bidirectional)")
                elif not mech.backward:
                    notes.append(f"skipped {mech.name}: no backward pass")
                else:
                    expanded.append(mech.name)
        else:
            expanded.append(text)
    if impl_params and not expanded:
        raise AttnbenchError("--param applies to --impl mechanisms; no --impl was given")
    for text in expanded:
        mech_name, _, path = text.partition(":")
        mech = registry.get(mech_name.strip())
        params = {k: v for k, v in impl_params.items()}
        label = mech.name + (f":{path}" if path else "")
        if params:
            label += "(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")"
        spec = resolve_spec(MixerSpec(mech.name, path or None, params), label)
        out.setdefault(label, TrainedVariant(label, spec))
    return list(out.values()), notes


def resolve_eval_time(cfg: ExtrapConfig, trained: list[TrainedVariant]) -> tuple[list, list[str]]:
    """Eval-time rows (applied to the trained O model); a note when O is not trained."""
    local, rerope = cfg.eval.local_window or None, cfg.eval.rerope_window or None
    rows = []
    for text in cfg.run.eval_time:
        tricks = parse_tricks(text, cfg.model.train_len, local, rerope)
        rows.append(EvalTimeVariant("O+" + tricks.label, "O", tricks))
    base = next((v for v in trained if v.label == "O"), None)
    if rows and base is None:
        return [], ["eval-time rows skipped: they apply to the trained O model; add O to variants"]
    if rows and base.spec.mechanism != "softmax":
        raise AttnbenchError("eval-time rows need variant O to be the softmax mechanism")
    return rows, []


def spec_json(spec: MixerSpec) -> str:
    return json.dumps(dict(spec.params), sort_keys=True)
