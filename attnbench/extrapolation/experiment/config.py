"""Configuration of the extrapolation experiment: presets (TOML shipped in
``attnbench/data/suites/extrapolate/``, read by :mod:`attnbench.runtime.tomlconfig` and
:mod:`attnbench.runtime.schema` like the speed suites, so every error names the file and line),
overrides, and the variants (rows) of the table.

A preset file (:class:`PresetFile`) has the sections ``[model]`` (:class:`ModelConfig`),
``[train]`` (:class:`TrainConfig`), ``[eval]`` (:class:`EvalConfig`), ``[run]``
(:class:`RunConfig`) and optional ``[variants.NAME]`` tables (:class:`MixerSpec`: ``mechanism``,
``path``, ``params``) that name trained variants. Every field can be set from the command line
with ``--set SECTION.FIELD=VALUE`` (the common ones have their own options), merged over the
file before it is checked.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench import registry
from attnbench.core.errors import AttnbenchError, unknown
from attnbench.core.spec import Mechanism
from attnbench.extrapolation.evaluation.longrange import COPY_LENGTH, DISTANCES
from attnbench.extrapolation.model.encoder import (
    VOCAB,
    Mixer,
    MixerSpec,
    ModelConfig,
    variant_position_problem,
)
from attnbench.extrapolation.model.position_encodings import ON_SCORES
from attnbench.extrapolation.model.tricks import Tricks, parse_tricks, settings_problem
from attnbench.extrapolation.training.options import TrainConfig
from attnbench.measure import machine
from attnbench.runtime import tomlconfig
from attnbench.runtime.schema import (
    Checked,
    Invalid,
    Rule,
    above,
    at_least,
    finite,
    inside,
    read_section,
    setting,
    within,
)
from attnbench.runtime.tomlconfig import Setting, SuiteText

DEFAULT_EVAL_TIME = (
    "logn", "temperature", "yarn", "yarn-dim", "local", "chunk", "ntk", "pi", "rerope",
    "rerope+logn", "leaky+logn", "hwfa",
)  # fmt: skip


@dataclass(frozen=True)
class EvalConfig(Checked):
    """How to evaluate (not part of the checkpoint key: ``--eval-only`` may change all of it);
    a preset's ``[eval]``."""

    lengths: tuple[int, ...] = setting(
        (64, 128, 256, 512, 1024), "evaluation lengths n", valid=at_least(1), non_empty=True
    )
    tokens: int = setting(
        65536,
        "the held-out span evaluated at every n (tokens // chunk pieces)",
        valid=at_least(1),
    )
    chunk: int = setting(
        1024, "contiguous tokens per piece of the span: see :meth:`piece`", valid=at_least(1)
    )
    seed: int = setting(1234, "fixes the masked positions of the span (same for every variant)")
    batch_tokens: int = setting(4096, "tokens per evaluation batch", valid=at_least(1))
    entropy_tokens: int = setting(
        2048,
        "attention entropy on the first tokens of the span (>= 1 window)",
        valid=at_least(0),
    )
    local_window: int = setting(
        0, 'eval-time "local": keys within +-local_window; 0 means L/2', valid=at_least(0)
    )
    rerope_window: int = setting(
        0,
        'eval-time "rerope" and "leaky": relative positions clipped (compressed) beyond +-w; '
        "0 means L/2; a row's rerope@W / leaky@W sets its own w",
        valid=at_least(0),
    )
    yarn_alpha: float = setting(
        1.0,
        'eval-time "yarn" (the paper\'s ramp): pairs making fewer than alpha turns over L are '
        "interpolated fully",
        valid=finite(at_least(0)),
    )
    yarn_beta: float = setting(
        32.0,
        'eval-time "yarn" (the paper\'s ramp): pairs making more than beta turns over L are kept',
        valid=finite(above(0)),
    )
    yarn_beta_fast: float = setting(
        32.0,
        'eval-time "yarn-dim" (the code\'s ramp): pairs below the one making beta_fast turns '
        "over L are kept",
        valid=finite(above(0)),
    )
    yarn_beta_slow: float = setting(
        1.0,
        'eval-time "yarn-dim" (the code\'s ramp): pairs from the one making beta_slow turns '
        "over L on are interpolated fully",
        valid=finite(above(0)),
    )
    leaky_k: float = setting(
        0.0,
        'eval-time "leaky": distances beyond +-rerope_window compressed by 1/k; 0 chooses k per '
        "n so that the farthest key maps to L - 1",
        valid=finite(Rule(lambda k: k == 0 or k >= 1, "0 or >= 1")),
    )
    mask_prob: float = setting(
        0.0,
        "masking probability of the evaluation span; 0: the training's (train.mask_prob). The "
        "published experiment evaluates at 0.15 whatever the training masked",
        valid=Rule(lambda p: 0 <= p < 1, "0 (the training's) or a number in (0, 1)"),
    )
    positions_as_trained: bool = setting(
        True,
        "a run with train.random_positions = P: evaluate each window of n < P tokens at sorted "
        "distinct positions drawn from 0..P-1, as training did and as the reference code of "
        "Ruoss et al. 2023 does at test time (n >= P: 0..n-1); false: 0..n-1 always. Rows whose "
        "layers take no explicit positions (the eval-time rows) read 0..n-1",
    )
    long_range: bool = setting(
        False,
        "also evaluate every row on the long-range span (a verbatim copy of each window's own "
        "earlier bytes at distance d; attnbench.extrapolation.evaluation.longrange): longrange.csv "
        "/ .md",
    )
    copy_length: int = setting(
        COPY_LENGTH, "long-range span: bytes copied per window (at most n - d)", valid=at_least(1)
    )
    copy_distances: tuple[int, ...] = setting(
        DISTANCES,
        "long-range span: distances d (each length n scores those with d + 16 <= n)",
        valid=at_least(1),
        non_empty=True,
    )

    def __post_init__(self) -> None:
        """The trick settings that bound each other (YaRN's ramps: beta above alpha)."""
        super().__post_init__()
        problem = settings_problem(
            self.yarn_alpha, self.yarn_beta, self.yarn_beta_fast, self.yarn_beta_slow,
            self.leaky_k,
        )  # fmt: skip
        if problem is not None:
            raise Invalid(*problem)

    def piece(self) -> int:
        """Tokens per piece of the evaluation span: ``chunk`` (at most ``tokens``), raised to
        the longest length when that is longer. Adding or dropping lengths up to it never moves
        the pieces, so it never changes the other lengths' numbers."""
        return max(max(self.lengths), min(self.chunk, self.tokens))


#: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``, ``mps``...
DEVICE = Rule(lambda d: d == "auto" or d.split(":")[0] in ("cpu", "cuda", "mps"), "")


@dataclass(frozen=True)
class RunConfig(Checked):
    """What to run; a preset's ``[run]``."""

    variants: tuple[str, ...] = setting(
        ("O", "E"),
        "trained variants (names: see VARIANTS / [variants], or registry names)",
        accepted="a non-empty list of variant names, e.g. O,E",
        non_empty=True,
    )
    eval_time: tuple[str, ...] = setting(
        DEFAULT_EVAL_TIME, "eval-time rows applied to the trained O"
    )
    seeds: int = setting(1, "number of training seeds", valid=within(1, 10_000))
    seed_start: int = setting(0, "first seed", valid=at_least(0))
    threads: int = setting(
        0, "torch CPU threads; 0: every core this process may use", valid=at_least(0)
    )
    #: Two 1-thread trainings out-train one 2-thread one by ~20 % on 2 cores: small matmuls do
    #: not split well.
    parallel: int = setting(
        0,
        "trainings at once on a CPU, each in its own process with threads / parallel threads; "
        "0: as many as there are cores; 1: one after the other",
        valid=at_least(0),
    )
    device: str = setting(
        "auto",
        '"auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:1"...',
        accepted="auto, cpu, cuda, cuda:N, mps",
        valid=DEVICE,
    )
    ckpt_every: int = setting(500, "steps between periodic checkpoints", valid=at_least(0))
    holdout: float = setting(
        0.1, "last share of the corpus kept for evaluation", valid=inside(0, 1)
    )
    heldout_every: int = setting(
        250,
        "steps between measurements of the held-out loss during training (0: none); on a fixed "
        "probe of heldout_windows held-out windows at the training length (the curves CSV)",
        valid=at_least(0),
    )
    heldout_windows: int = setting(256, "windows of the held-out probe", valid=at_least(0))
    corpus: str = setting("", 'a text file or folder; "" is the shipped Shakespeare')


#: Trained variants every preset knows. E is Su 2021's log_512 n; E-ln the natural log
#: (Chiang & Cholak 2022).
VARIANTS: dict[str, MixerSpec] = {
    "O": MixerSpec("softmax"),
    "E": MixerSpec("softmax-logn", params={"base": 512.0}),
    "E-ln": MixerSpec("softmax-logn", params={"base": "e"}),
}

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "eval": EvalConfig, "run": RunConfig}


@dataclass(frozen=True)
class PresetFile(Checked):
    """The keys of a preset file."""

    description: str = setting("", "one line saying what the preset is for")
    model: ModelConfig = setting(ModelConfig, "the encoder's shape")
    train: TrainConfig = setting(TrainConfig, "how to train")
    eval: EvalConfig = setting(EvalConfig, "how to evaluate")
    run: RunConfig = setting(RunConfig, "what to run")
    variants: dict[str, MixerSpec] = setting({}, "named trained variants: [variants.NAME]")


@dataclass(frozen=True)
class ExtrapConfig(Checked):
    preset: str
    model: ModelConfig = setting(ModelConfig)
    train: TrainConfig = setting(TrainConfig)
    eval: EvalConfig = setting(EvalConfig)
    run: RunConfig = setting(RunConfig)
    variant_defs: Mapping[str, MixerSpec] = setting(dict(VARIANTS))
    description: str = ""

    @property
    def eval_mask_prob(self) -> float:
        """The evaluation span's masking probability (``eval.mask_prob``, or the training's)."""
        return self.eval.mask_prob or self.train.mask_prob

    def plain(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "description": self.description,
            **{name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS},
            "variant_defs": {k: v.plain() for k, v in self.variant_defs.items()},
        }

    def override(self, values: Mapping[str, Any]) -> ExtrapConfig:
        """Apply ``{"section.field": value}`` (or a field name that is unique: ``"steps"``);
        text values are read as on the command line (``"16,64"`` for a list)."""
        return self.with_settings(
            [Setting(tuple(k.split(".")), v, f"{k}={v}") for k, v in values.items()]
        )

    def with_settings(self, settings: Sequence[Setting]) -> ExtrapConfig:
        """The config with ``settings`` applied and everything checked again, as a preset file
        with those settings would be (each error names the setting)."""
        data = {name: _table(getattr(self, name)) for name in SECTIONS}
        text = SuiteText.command_line(data).with_settings(qualified(settings))
        return _config(text, self.preset, self.description, self.variant_defs)


def _table(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def field_names(section: str) -> list[str]:
    return [f.name for f in dataclasses.fields(SECTIONS[section])]


def all_keys() -> list[str]:
    return [f"{s}.{f}" for s in SECTIONS for f in field_names(s)]


def qualified(settings: Sequence[Setting]) -> list[Setting]:
    """Settings with a bare field name (``steps``) given its section (``train.steps``) when only
    one section has that field; an unknown bare name is an error naming the setting."""
    out = []
    for s in settings:
        if len(s.key) == 1 and s.key[0] not in ("description", *SECTIONS):
            owners = [section for section in SECTIONS if s.key[0] in field_names(section)]
            if len(owners) != 1:
                raise AttnbenchError(f"{s.label}: {unknown('key', s.key[0], all_keys())}")
            s = dataclasses.replace(s, key=(owners[0], s.key[0]))
        out.append(s)
    return out


def _config(
    text: SuiteText, preset: str, description: str, variants: Mapping[str, MixerSpec]
) -> ExtrapConfig:
    file = read_section(text, text.data, PresetFile)
    _check_variant_defs(text, file.variants, file.model.objective, file.model.position)
    _refuse_what_the_objective_cannot_do(text, file)
    _refuse_what_this_machine_cannot_run(text, file)
    return ExtrapConfig(
        preset=preset,
        model=file.model,
        train=file.train,
        eval=file.eval,
        run=file.run,
        variant_defs={**variants, **file.variants},
        description=file.description or description,
    )


def _check_variant_defs(
    text: SuiteText, variants: Mapping[str, MixerSpec], objective: str = "mlm",
    position: str = "rope",
) -> None:  # fmt: skip
    """Every ``[variants.NAME]`` table of the file names a mechanism that can be trained, with
    parameters it accepts, whether or not ``run.variants`` selects it: a preset with a broken
    table is a broken file (before, one left unselected went by unnoticed until someone selected
    it, maybe hours into a run)."""
    for name, spec in variants.items():
        try:
            resolve_spec(spec, name, objective=objective, model_position=position)
        except AttnbenchError as e:
            raise text.error(("variants", name, "mechanism"), f"[variants.{name}] {e}") from None


#: What only the masked-language model has: (section, field, its off value, why).
MLM_ONLY = (
    ("train", "copy_share", 0.0, "it plants copies for the long-range span, scored on masks"),
    ("train", "final_mask_prob", 0.0, "a closing masking phase has no masks to change"),
    ("eval", "long_range", False, "the long-range span scores masked bytes of copies"),
)


def _refuse_what_the_objective_cannot_do(text: SuiteText, file: PresetFile) -> None:
    """The settings that mean something for the masked-language model only, refused with
    ``model.objective = clm`` (naming the setting)."""
    if file.model.objective != "clm":
        return
    for section, name, off, why in MLM_ONLY:
        value = getattr(getattr(file, section), name)
        if value != off:
            raise text.error(
                (section, name),
                f"{section}.{name} = {value} is not accepted with model.objective = clm: {why}; "
                f"accepted with clm: {section}.{name} = {off}",
            )


#: The sizes a training step's memory grows with, and the cpu preset's value of each: the size
#: furthest above its value is the one a refusal names.
TRAINING_SIZES = {"model.d_model": 128, "model.layers": 2, "model.ffn_mult": 2,
                  "model.train_len": 64, "train.batch": 32}  # fmt: skip


def training_bytes(s: Mapping[str, int]) -> float:
    """A lower bound of a training step's memory, in float32, for every mechanism: the weights
    (the embedding and the classifier; in every block at least two d_model x d_model
    projections) with their gradients and AdamW's two moments (16 bytes a weight), and per block
    at least two activations of every token of the batch kept for the backward pass."""
    d, layers = s["model.d_model"], s["model.layers"]
    weights = 2 * VOCAB * d + layers * 2 * d * d
    activations = 2 * layers * s["train.batch"] * s["model.train_len"] * d
    return 16.0 * weights + 4.0 * activations


def _refuse_what_this_machine_cannot_run(text: SuiteText, file: PresetFile) -> None:
    """Sizes this machine cannot train at all, refused before anything is allocated (the
    allocator's traceback otherwise, maybe after the corpus is read), and more threads than its
    cores: one line naming the size asked, what it needs and what this machine has."""
    threads = file.run.threads
    if refused := machine.threads_refused(threads):
        raise text.error(("run", "threads"), f"run.threads = {threads}: {refused}")
    sizes = {key: getattr(getattr(file, key.split(".")[0]), key.split(".")[1])
             for key in TRAINING_SIZES}  # fmt: skip
    # This machine's RAM, also for a GPU run: CUDA is not started to read the GPU's (torchrun's
    # ranks read the preset before each picks its device), and the estimate is a lower bound
    # several times below a step's real need: what it refuses no GPU of this machine trains.
    memory = machine.available_memory_bytes()
    found = machine.too_big(
        sizes, training_bytes, "a training step holds at least its weights, their gradients, "
        "AdamW's moments and per block activations of batch x train_len tokens",
        TRAINING_SIZES, memory, sep=" = ",
    )  # fmt: skip
    if found is not None:
        raise text.error(tuple(found[0].split(".")), found[1])


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    return tomlconfig.names_in(tomlconfig.PRESETS_DIR)


def find_preset(name_or_path: str) -> Path:
    """A preset name (``cpu``) or a path to a TOML file."""
    return tomlconfig.find_config(name_or_path, tomlconfig.PRESETS_DIR, "preset")


def load_preset(name_or_path: str, settings: Sequence[Setting] = ()) -> ExtrapConfig:
    """A preset file as an :class:`ExtrapConfig`, with ``settings`` (the command line's) merged
    over it before it is checked; every error names the file and the line, or the setting."""
    text = tomlconfig.load(find_preset(name_or_path), "preset")
    text = text.with_settings(qualified(settings))
    return _config(text, text.path.stem, "", VARIANTS)


# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainedVariant:
    """A row trained from scratch: its label and its mixer, resolved once (the registry's record
    and the spec with its parameters resolved: :class:`Mixer`)."""

    label: str
    mixer: Mixer

    @property
    def spec(self) -> MixerSpec:
        """The mixer by name (the checkpoint key's, the rows')."""
        return self.mixer.spec

    @property
    def file_stem(self) -> str:
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", self.label)


@dataclass(frozen=True)
class EvalTimeVariant:
    """A row evaluated on a trained model (``base``) without retraining."""

    label: str
    base: str
    tricks: Tricks


def resolve_spec(
    spec: MixerSpec, label: str, mech: Mechanism | None = None, *, objective: str = "mlm",
    model_position: str = "rope",
) -> Mixer:  # fmt: skip
    """Resolve a spec against the registry, once (``mech``: already found): known, of the
    objective's kind (bidirectional for mlm, causal for clm), trainable, a known path, its
    parameters resolved, its own position encoding (if any) one the mechanism and the objective
    can take, and no path with an encoding added to the scores (``model_position``: the
    encoding of a spec that sets none)."""
    mech = mech or registry.get(spec.mechanism)
    if spec.path is not None:
        mech.path(spec.path)
    if objective == "clm" and not mech.causal:
        causal = [m.name for m in registry.MECHANISMS if m.causal]
        raise AttnbenchError(
            f"variant {label}: {mech.name} has no causal form and model.objective = clm trains "
            f"a causal model; causal mechanisms: {', '.join(causal)}"
        )
    if objective != "clm" and not mech.bidirectional:
        bidir = [m.name for m in registry.MECHANISMS if m.bidirectional]
        raise AttnbenchError(
            f"variant {label}: {mech.name} is causal only and the extrapolation model is a "
            f"bidirectional encoder; bidirectional mechanisms: {', '.join(bidir)}"
        )
    if not mech.backward:
        raise AttnbenchError(f"variant {label}: {mech.name} has no backward pass; cannot train it")
    if (problem := variant_position_problem(spec.position, mech.name, objective)) is not None:
        raise AttnbenchError(f"variant {label}: {problem}")
    if spec.path is not None and (position := spec.position or model_position) in ON_SCORES:
        raise AttnbenchError(
            f"variant {label}: path {spec.path} computes {mech.name} without position "
            f"{position}'s bias; with {position} attnbench's own mixer computes the attention "
            "(the written-out scores, or SDPA with the bias as a float mask); accepted: no "
            "path, or position rope or nope"
        )
    params = {k: _plain(v) for k, v in mech.resolve(dict(spec.params)).items()}
    return Mixer(MixerSpec(mech.name, spec.path, params, spec.position), mech)


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
    objective, position = cfg.model.objective, cfg.model.position
    for name in cfg.run.variants:
        mech = None
        if name in cfg.variant_defs:
            spec = cfg.variant_defs[name]
        else:
            mech_name, _, path = name.partition(":")
            try:
                mech = registry.get(mech_name)
            except AttnbenchError:
                raise unknown("variant", name, known_variant_names(cfg)) from None
            spec = MixerSpec(mech_name, path or None)
        out.setdefault(
            name,
            TrainedVariant(
                name, resolve_spec(spec, name, mech, objective=objective, model_position=position)
            ),
        )
    impl_params = dict(impl_params or {})
    expanded: list[str] = []
    for text in impls or []:
        if text == "all":
            taken = {v.spec.mechanism for v in out.values()}
            for mech in registry.MECHANISMS:
                if mech.name in taken or mech.name in ("softmax", "softmax-logn"):
                    continue
                if objective == "clm" and not mech.causal:
                    notes.append(f"skipped {mech.name}: no causal form (the model is causal)")
                elif objective != "clm" and not mech.bidirectional:
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
        mech, path = registry.resolve(text)
        path_name = path.name if path else None
        params = {k: v for k, v in impl_params.items()}
        label = mech.name + (f":{path_name}" if path_name else "")
        if params:
            label += "(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")"
        mixer = resolve_spec(MixerSpec(mech.name, path_name, params), label, mech,
                             objective=objective, model_position=position)  # fmt: skip
        out.setdefault(label, TrainedVariant(label, mixer))
    return list(out.values()), notes


def resolve_eval_time(cfg: ExtrapConfig, trained: list[TrainedVariant]) -> tuple[list, list[str]]:
    """Eval-time rows (applied to the trained O model); a note when O is not trained."""
    ev = cfg.eval
    local, rerope = ev.local_window or None, ev.rerope_window or None
    settings = {
        "yarn_alpha": ev.yarn_alpha,
        "yarn_beta": ev.yarn_beta,
        "yarn_beta_fast": ev.yarn_beta_fast,
        "yarn_beta_slow": ev.yarn_beta_slow,
        "leaky_k": ev.leaky_k,
    }
    rows = []
    for text in cfg.run.eval_time:
        tricks = parse_tricks(text, cfg.model.train_len, local, rerope, **settings)
        rows.append(EvalTimeVariant("O+" + tricks.label, "O", tricks))
    base = next((v for v in trained if v.label == "O"), None)
    if rows and base is None:
        return [], ["eval-time rows skipped: they apply to the trained O model; add O to variants"]
    if rows and base.spec.mechanism != "softmax":
        raise AttnbenchError("eval-time rows need variant O to be the softmax mechanism")
    if rows and (position := base.spec.position or cfg.model.position) != "rope":
        return [], [
            f"eval-time rows skipped: they change the rotary embedding of a trained RoPE model, "
            f"and O here has position {position}"
        ]
    return rows, []


def spec_json(spec: MixerSpec) -> str:
    return json.dumps(dict(spec.params), sort_keys=True)
