"""The extrapolation and entropy suites on tiny configs: end to end through the CLI, resume,
eval-only, the evaluation windows and masks, the length guard, bad input (the evaluation-time
tricks' mixer: test_trick_mixer.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench import registry
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis.entropy import EntropyOptions
from attnbench.extrapolation.experiment.config import load_preset, resolve_variants
from attnbench.extrapolation.experiment.entropy import run_entropy
from attnbench.extrapolation.experiment.run import RunOptions, run_extrapolate
from attnbench.extrapolation.model.encoder import (
    MixerSpec,
    is_whole_block,
)
from attnbench.extrapolation.training.loop import Interrupted
from attnbench.runtime.progress import Silent
from attnbench.variants import softmax
from tests.helpers.extrapolation import TINY, make_corpus, run_options, tiny_cfg, tiny_encoder

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")


def invoke(*args):
    return runner.invoke(app, ["run", *args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny end-to-end run (O, E, gqa with kv_heads=1, eight eval-time rows) via the CLI."""
    root = tmp_path_factory.mktemp("extrap")
    corpus = make_corpus(root / "corpus.txt")
    out = root / "out"
    res = invoke(
        "extrapolate", *TINY, "--corpus", str(corpus), "--out", str(out),
        "--impl", "gqa", "--param", "kv_heads=1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return root, corpus, out, res


def test_end_to_end_outputs(trained):
    _, corpus, out, res = trained
    df = pd.read_csv(out / "extrapolate.csv")
    trained_rows = ["O", "E", "gqa(kv_heads=1)"]
    eval_rows = [f"O+{t}" for t in load_preset("cpu").run.eval_time]
    order = ["O", *eval_rows, "E", "gqa(kv_heads=1)", "count-baseline", "count-eval-masks",
             "count-backoff"]  # fmt: skip
    assert list(dict.fromkeys(df["variant"])) == order
    assert len(df) == (len(trained_rows) + len(eval_rows) + 3) * 3  # three count rows
    assert (df["status"] == "ok").all()
    assert set(df["kind"]) == {"trained", "eval-time", "baseline"}
    assert (df[df["kind"] == "eval-time"]["applied_to"] == "O").all()
    models = df[df["kind"] != "baseline"]
    for col in ("accuracy", "loss", "masked_tokens", "entropy_l0", "train_time_s"):
        assert models[col].notna().all(), col
    floor = df[df["kind"] == "baseline"]
    assert floor["accuracy"].between(0, 100).all() and floor["seed"].isna().all()
    # Same text and masks for every row: the masked-token count per length is one number.
    assert (df.groupby("eval_len")["masked_tokens"].nunique() == 1).all()
    assert (df["eval_tokens"] == 6 * 64).all()  # one span of 6 x 64 tokens at every length
    assert models["entropy_l0"].between(0, 64 * 1.0001).all()
    side = json.loads((out / "extrapolate.json").read_text())
    assert side["corpus"]["sha256"] and side["corpus"]["bytes"] == corpus.stat().st_size
    assert {"torch", "python", "attnbench"} <= set(side["versions"])
    assert "sha" in side["git"] and side["config"]["model"]["d_model"] == 32
    assert "0.15 in evaluation" in side["evaluation"]["masking"]  # the preset trains at 0.4
    table = (out / "table.md").read_text()
    assert "Su 2021: Attention-E" in table and "| O+chunk | eval-time |" in table
    assert "| count-baseline | baseline |" in table and "95 % t-interval" in table
    assert "bootstrap interval" in table
    pieces = pd.read_csv(out / "pieces.csv")
    sums = pieces.groupby(["variant", "seed", "eval_len"])[["masked", "correct"]].sum()
    models = df[df["kind"] != "baseline"].set_index(["variant", "seed", "eval_len"])
    joined = sums.join(models[["masked_tokens", "accuracy"]])
    assert (joined["masked"] == joined["masked_tokens"]).all()
    assert ((100 * joined["correct"] / joined["masked"] - joined["accuracy"]).abs() < 1e-4).all()
    assert "Su 2021: Attention-O" in res.output
    png = (out / "accuracy_vs_length.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # At n = L the chunk floor is the O model itself.
    o16 = df[(df["variant"] == "O") & (df["eval_len"] == 16)].iloc[0]
    c16 = df[(df["variant"] == "O+chunk") & (df["eval_len"] == 16)].iloc[0]
    assert o16["accuracy"] == c16["accuracy"]
    assert o16["loss"] == pytest.approx(c16["loss"], rel=1e-5)


def test_eval_only_reuses_checkpoints(trained):
    _, corpus, out, _ = trained
    before = pd.read_csv(out / "extrapolate.csv")
    res = invoke(
        "extrapolate", *TINY, "--corpus", str(corpus), "--out", str(out), "--eval-only",
        "--eval-lengths", "16,32", "--eval-time", "chunk,ntk+logn",
        "--impl", "gqa", "--param", "kv_heads=1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    after = pd.read_csv(out / "extrapolate.csv")
    assert set(after["variant"]) == {
        "O", "O+chunk", "O+ntk+logn", "E", "gqa(kv_heads=1)", "count-baseline", "count-eval-masks",
        "count-backoff",
    }  # fmt: skip
    assert set(after["eval_len"]) == {16, 32}
    key = ["variant", "seed", "eval_len"]
    merged = after.merge(before, on=key, suffixes=("", "_before"))
    assert len(merged) == len(after)
    assert (merged["accuracy"] == merged["accuracy_before"]).all()
    models = merged[merged["kind"] != "baseline"]
    assert (models["train_time_s"] == models["train_time_s_before"]).all()


def test_a_table_of_o_alone_has_no_empty_difference_tables(trained, tmp_path):
    _, corpus, out, _ = trained
    alone = tmp_path / "alone"
    res = invoke(
        "extrapolate", *TINY, "--corpus", str(corpus), "--out", str(alone), "--eval-only",
        "--checkpoints", str(out / "checkpoints"), "--variants", "O", "--eval-time", "none",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    table = (alone / "table.md").read_text()
    assert "| O | trained |" in table
    assert "Difference to O" not in table and "bootstrap interval" not in table


def test_existing_checkpoints_need_a_flag(trained):
    _, corpus, out, _ = trained
    res = invoke("extrapolate", *TINY, "--corpus", str(corpus), "--out", str(out))
    assert res.exit_code == 2
    assert "--resume" in res.output and "Traceback" not in res.output


def test_resume_with_other_config_is_refused_and_keeps_the_checkpoint(trained):
    _, corpus, out, _ = trained
    ckpt = out / "checkpoints" / "O-seed0.pt"
    before = ckpt.read_bytes()
    args = [*TINY, "--steps", "13"]
    res = invoke("extrapolate", *args, "--corpus", str(corpus), "--out", str(out), "--resume")
    assert res.exit_code == 2
    assert "another config" in res.output and "steps 12 -> 13" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert ckpt.read_bytes() == before


def test_entropy_suite(trained, tmp_path):
    _, corpus, out, _ = trained
    cfg = load_preset("cpu").override(
        {
            "d_model": 32,
            "layers": 1,
            "heads": 2,
            "train_len": 16,
            "batch": 8,
            "steps": 12,
            "warmup": 2,
            "corpus": str(corpus),
        }
    )
    opts = EntropyOptions(
        out=tmp_path, checkpoints=out / "checkpoints", max_n=256, queries=64, trials=2
    )
    res = run_entropy(cfg, opts)
    df = pd.read_csv(tmp_path / "entropy.csv")
    assert set(df["source"]) == {"random", "random-scale", "model"}
    assert sorted(df["n"].unique()) == [16, 32, 64, 128, 256]
    regime = res.fit["seed_regime"]  # the sweep, fitted where the n -> infinity expression holds
    assert 12.0 < regime["bound"] < 14.0 and regime["lambda_d_range"] == [8.0, 12.0]
    assert 0.1 < regime["theory_c"] < 0.2 and abs(regime["c"] - regime["theory_c"]) < 0.03
    sweep = df[df["source"] == "random-scale"]
    assert (sweep["in_fit"] == (sweep["lambda_d"] <= regime["bound"])).all()
    assert sweep["lambda_d"].max() == 64.0  # the points outside the fit stay in the CSV
    assert f"beyond lambda*d ~ {regime['bound']:.1f} at n = 256" in res.text
    assert 0.04 < res.fit["theory_c"] < 0.2  # flatter at the lambda*d of O and E, n <= 256
    assert [m["layer"] for m in res.fit["models"]] == [0]
    assert "Su 2021's own expression" in res.text and "regime" in res.text
    rnd = df[df["source"] == "random"].set_index(["variant", "n"])["entropy"]
    # O's entropy grows almost like log n; E (smaller scale below 512) sits above O.
    slopes = {(s["source"], s["variant"]): s["slope_dH_dlogn"] for s in res.slopes}
    assert 0.85 < slopes[("random", "O")] <= 1.0
    assert all(rnd[("E", n)] > rnd[("O", n)] for n in (16, 256))
    assert 0.0 < res.fit["c"] < 1.0
    assert (tmp_path / "entropy.png").stat().st_size > 10_000
    assert "c =" in res.text


def test_entropy_cli_without_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default checkpoints folder does not exist here
    res = invoke(
        "entropy", "--out", str(tmp_path), "--max-n", "64", "--queries", "16", "--trials", "1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    flat = res.output.replace("\n", "")  # rich wraps long lines (a long tmp path) anywhere
    assert "trained-model part" in flat and "skipped" in flat
    assert "no fit, 1 point(s) inside the expression's domain" in flat  # n = 64: 8 only
    assert (tmp_path / "entropy.csv").exists()
    # a folder named explicitly must exist: a typo is an error, not a silent skip
    res = invoke("entropy", "--out", str(tmp_path), "--checkpoints", str(tmp_path / "none"))
    assert res.exit_code == 2 and "--checkpoints" in res.output and "no such folder" in res.output


# ---------------------------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------------------------


class Killed(Exception):
    """Stands for SIGKILL: training stops with no chance to save."""


def test_resume_equals_uninterrupted(tmp_path):
    corpus = make_corpus(tmp_path / "c.txt")
    cfg = tiny_cfg(corpus)
    full = run_extrapolate(cfg, run_options(tmp_path / "full"))

    # Ctrl-C at step 7: the step finishes, a checkpoint is written, Interrupted is raised.
    def ctrl_c(label, seed, step):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted) as info:
        run_extrapolate(cfg, run_options(tmp_path / "cut", on_step=ctrl_c))
    assert info.value.step == 7
    ckpt = torch.load(tmp_path / "cut/checkpoints/E-seed0.pt", weights_only=True)
    assert ckpt["step"] == 7 and not ckpt["done"]
    resumed = run_extrapolate(cfg, run_options(tmp_path / "cut", resume=True))

    # A kill after step 9: only the periodic checkpoint of step 5 survives.
    def kill(label, seed, step):
        if step == 9:
            raise Killed

    with pytest.raises(Killed):
        run_extrapolate(cfg, run_options(tmp_path / "kill", on_step=kill))
    ckpt = torch.load(tmp_path / "kill/checkpoints/E-seed0.pt", weights_only=True)
    assert ckpt["step"] == 5
    killed = run_extrapolate(cfg, run_options(tmp_path / "kill", resume=True))

    def numbers(result):
        return [(r["eval_len"], r["accuracy"], r["loss"]) for r in result.rows]

    assert numbers(resumed) == numbers(full)
    assert numbers(killed) == numbers(full)
    a = torch.load(tmp_path / "full/checkpoints/E-seed0.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut/checkpoints/E-seed0.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------
# Variants and bad input
# ---------------------------------------------------------------------------------------------


def test_whole_block_and_causal_only_mechanisms(monkeypatch):
    whole = dataclasses.replace(softmax.MECHANISM, name="fake-whole", aliases=())
    object.__setattr__(whole, "whole_block", True)
    causal = dataclasses.replace(
        softmax.MECHANISM, name="fake-causal", aliases=(), bidirectional=False
    )
    index = dict(registry._BY_NAME, **{"fake-whole": whole, "fake-causal": causal})
    monkeypatch.setattr(registry, "_BY_NAME", index)
    monkeypatch.setattr(registry, "MECHANISMS", (*registry.MECHANISMS, whole, causal))
    assert is_whole_block(MixerSpec("fake-whole"))
    model = tiny_encoder(MixerSpec("fake-whole"))
    assert all(b.ffn is None for b in model.blocks) and len(model.blocks) == 2 * 2
    cfg = load_preset("cpu")
    variants, notes = resolve_variants(cfg, ["all"])
    names = [v.label for v in variants]
    assert "fake-whole" in names and "fake-causal" not in names
    assert any("fake-causal" in n and "causal only" in n for n in notes)
    res = invoke("extrapolate", "--impl", "fake-causal", "--steps", "1")
    assert res.exit_code == 2 and "causal only" in res.output


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    (root / "empty.txt").write_text("")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 40)
    make_corpus(root / "short.txt", words=300)
    (root / "emptydir").mkdir()
    return root


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--corpus", "{root}/missing.txt"], "does not exist"),
        (["--corpus", "{root}/empty.txt"], "is empty"),
        (["--corpus", "{root}/binary.bin"], "looks binary"),
        (["--corpus", "{root}/emptydir"], "no .txt files"),
        (["--corpus", "{root}/short.txt"], "corpus too short"),
        (["--eval-lengths", "0,64"], "--eval-lengths 0,64: eval.lengths = [0, 64]"),
        (["--eval-lengths", "-16"], "eval.lengths = [-16] is not accepted"),
        (["--preset", "nosuch"], "unknown preset"),
        (["--variants", "O,Q"], "unknown variant"),
        (["--impl", "nosuch"], "unknown mechanism"),
        (["--impl", "gqa", "--param", "kv_heads=0"], "kv_heads"),
        (["--set", "train.nosuch=1"], "--set train.nosuch=1: unknown key"),
        (["--heads", "3"], "not divisible"),
        (["--device", "tpu"], "run.device = 'tpu' is not accepted"),
        (["--eval-only"], "no checkpoint for O seed 0"),
        (["--eval-only", "--resume"], "exclude each other"),
        (["--eval-time", "logn,warp"], "unknown evaluation-time trick"),
        (["--eval-time", "chunk+logn"], "chunk stands alone"),
        (["--eval-time", "rerope@48+logn,local@8"], "only rerope and leaky take a window"),
        (["--eval-time", "rerope@0"], "the window W of rerope@W must be an integer >= 1"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_bad_input_exits_2(corpora, tmp_path, args, expect):
    args = [a.format(root=corpora) for a in args]
    res = invoke("extrapolate", *TINY, "--out", str(tmp_path), *args)
    assert res.exit_code == 2, res.output
    assert expect in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "checkpoints").exists()


def test_short_corpus_message_counts_tokens(corpora, tmp_path):
    res = invoke("extrapolate", *TINY, "--corpus", f"{corpora}/short.txt", "--out", str(tmp_path))
    # 384 evaluated tokens are needed; the file is ~1.8 kB, so ~180 are held out.
    assert "needs 384 held-out tokens" in res.output and "has 1" in res.output


def test_presets_load_from_the_one_shipped_folder():
    from attnbench.runtime.tomlconfig import PRESETS_DIR

    shipped = sorted(p.name for p in PRESETS_DIR.glob("*.toml"))
    assert shipped == ["cpu-positions.toml", "cpu.toml", "paper.toml"]
    cpu, paper = load_preset("cpu"), load_preset("paper")
    model, train = cpu.model, cpu.train
    assert (model.d_model, model.layers, model.heads, model.ffn_mult, model.train_len) == (
        128,
        2,
        8,
        2,
        64,
    )
    assert (model.ffn, paper.model.ffn) == ("swiglu", "gelu")
    assert (train.batch, train.steps, train.lr, train.mask_prob) == (32, 9600, 1e-3, 0.4)
    assert cpu.eval_mask_prob == 0.15  # Su 2021's rate at evaluation, whatever the training's
    assert (paper.model.d_model, paper.model.layers, paper.model.heads) == (384, 6, 6)
    assert cpu.eval.lengths == (64, 128, 256, 512, 1024) and cpu.run.variants == ("O", "E")
    assert len(cpu.run.eval_time) >= 6


def test_a_mechanism_failing_at_some_length_gets_an_error_row(monkeypatch, tmp_path):
    """A mechanism that cannot run at a length yields status=error rows with the reason, never a
    dropped row or a NaN passed off as a result."""

    def short_only(q, k, v, *, causal):
        if q.shape[-2] > 32:
            raise RuntimeError("this path stops at 32 positions")
        return softmax.sdpa(q, k, v, causal=causal)

    path = dataclasses.replace(softmax.MECHANISM.paths[1], fn=short_only)
    mech = dataclasses.replace(
        softmax.MECHANISM, name="fake-short", aliases=(), paths=(softmax.MECHANISM.paths[0], path)
    )
    monkeypatch.setattr(registry, "_BY_NAME", dict(registry._BY_NAME, **{"fake-short": mech}))
    corpus = make_corpus(tmp_path / "c.txt")
    cfg = tiny_cfg(corpus).override({"variants": "fake-short", "steps": 3})
    result = run_extrapolate(cfg, run_options(tmp_path / "out"))
    rows = {r["eval_len"]: r for r in result.rows if r["kind"] != "baseline"}
    assert rows[16]["status"] == "ok" and rows[64]["status"] == "error"
    assert "stops at 32" in rows[64]["reason"] and "accuracy" not in rows[64]
    df = pd.read_csv(tmp_path / "out" / "extrapolate.csv")
    df = df[df["kind"] != "baseline"]
    assert list(df["status"]) == ["ok", "error"] and pd.isna(df["accuracy"].iloc[1])
    assert "failed" in (tmp_path / "out" / "table.md").read_text()


def test_rich_progress_bar_renders():
    import io

    from rich.console import Console

    from attnbench.cli.progress import LineProgress, RichProgress

    buf = io.StringIO()
    bar = RichProgress(Console(file=buf, force_terminal=True, width=120))
    bar.start("O seed 0", 10, 0)
    bar.advance(10, loss=2.5, tokens_per_s=12345.0)
    bar.finish()
    assert "loss 2.500" in buf.getvalue() and "12,345 tok/s" in buf.getvalue()
    buf = io.StringIO()
    lines = LineProgress(lines=2, stream=buf)
    lines.start("E seed 1", 10, 0)
    for step in range(1, 11):
        lines.advance(step, loss=2.0, tokens_per_s=100.0)
    assert buf.getvalue().count("\n") == 2 and "step 10/10 loss 2.000" in buf.getvalue()


def test_help_has_an_example():
    for name in ("extrapolate", "entropy"):
        res = invoke(name, "--help")
        assert res.exit_code == 0 and "Example" in res.output, name


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("[train]\nsteps = 10\nstep = 3\n", 3, ["unknown key 'train.step'", "'train.steps'"]),
        ('[model]\n\nlayers = "two"\n', 3, ["model.layers"]),
        ("[modle]\nlayers = 2\n", 1, ["unknown section [modle]"]),
        ('[variants.X]\npath = "efficient"\n', 1, ["needs mechanism"]),
        # Issue 35: a table run.variants does not select is checked all the same.
        ('[variants.X]\nmechanism = "softmaxx"\n', 2, ["[variants.X] unknown mechanism"]),
        ('[variants.X]\nmechanism = "local"\nparams = { windw = 3 }\n', 2, ["'window'"]),
        ("[train]\nsteps = [1,\n", 2, ["malformed TOML"]),
    ],
)
def test_preset_errors_name_the_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(AttnbenchError) as info:
        load_preset(str(path))
    message = str(info.value)
    assert f"{path} line {line}" in message and "\n" not in message, message
    for word in words:
        assert word in message, message


def test_parallel_trainings_equal_sequential_ones(tmp_path):
    """Two trainings in two 1-thread worker processes, then their evaluations in two worker
    processes, give the checkpoints and rows that one 1-thread process doing it all one after
    the other gives."""
    corpus = make_corpus(tmp_path / "c.txt")
    cfg = tiny_cfg(corpus).override({"variants": "O,E", "eval_time": "logn,yarn"})
    said = []
    one_by_one = run_extrapolate(cfg, run_options(tmp_path / "seq"))
    both = cfg.override({"threads": 2, "parallel": 2})
    at_once = run_extrapolate(both, RunOptions(out=tmp_path / "par", progress=Silent,
                                               log=said.append, argv=["attnbench"]))  # fmt: skip
    assert any("2 at once, 1 thread each" in line for line in said), said
    for name in ("O-seed0.pt", "E-seed0.pt"):
        a = torch.load(tmp_path / "seq/checkpoints" / name, weights_only=True)["model"]
        b = torch.load(tmp_path / "par/checkpoints" / name, weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), name

    assert any("evaluating" in line and "2 at once" in line for line in said), said

    def scores(result):
        return [(r["variant"], r["kind"], r["seed"], r["eval_len"], r["accuracy"], r["loss"],
                 r["masked_tokens"]) for r in result.rows]  # fmt: skip

    # every row (trained, eval-time, baseline) in the same order with the same numbers
    assert len(scores(at_once)) == len(scores(one_by_one)) > 6
    assert scores(at_once) == scores(one_by_one)


def test_overwrite_retrains_even_one_at_a_time(tmp_path):
    """--overwrite with one process at a time (1 thread): the old, finished checkpoints are
    never picked up again; the new config is trained."""
    corpus = make_corpus(tmp_path / "c.txt")
    cfg = tiny_cfg(corpus)
    run_extrapolate(cfg, run_options(tmp_path / "out"))
    again = run_extrapolate(
        cfg.override({"steps": 13}), run_options(tmp_path / "out", overwrite=True)
    )
    ckpt = torch.load(tmp_path / "out/checkpoints/E-seed0.pt", weights_only=False)
    assert ckpt["step"] == 13
    assert {r["train_steps"] for r in again.rows if r["kind"] == "trained"} == {13}


def test_every_config_option_names_a_parameter_and_a_field():
    """The options that set one config field each are listed once, by parameter, with the field
    they set: each is a parameter of the command, each field exists (as --set would name it),
    and given on the command line it lands in that field."""
    import inspect
    from pathlib import Path

    from attnbench.cli.extrapolate import CONFIG_FIELDS, config_overrides, extrapolate

    parameters = inspect.signature(extrapolate).parameters
    assert set(CONFIG_FIELDS) <= set(parameters)
    cfg = load_preset("cpu")
    for field in CONFIG_FIELDS.values():
        section, name = field.split(".")
        assert hasattr(getattr(cfg, section), name), field
    given = dict.fromkeys(parameters) | {"steps": 7, "corpus": Path("c.txt"), "lr": 0.5}
    assert config_overrides(given) == {"train.steps": 7, "run.corpus": "c.txt", "train.lr": 0.5}
    cfg = cfg.override(config_overrides(given) | {"train.steps": "9"})  # --set wins
    assert (cfg.train.steps, cfg.train.lr, cfg.run.corpus) == (9, 0.5, "c.txt")


def test_fixed_choices_are_listed_in_help():
    res = invoke("extrapolate", "--help")
    assert res.exit_code == 0 and "local|ray" in res.output
