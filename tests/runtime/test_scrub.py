"""attnbench.runtime.scrub: a machine's absolute prefixes in a log become relative paths,
nothing else moves; a folder's text files rewritten, a sidecar still JSON, binaries untouched."""

from __future__ import annotations

import json

import pytest

from attnbench.runtime.scrub import scrub_folder, scrub_text


@pytest.mark.parametrize(
    ("made", "kept"),
    [
        ("--suite /work/main/suites/ci.toml", "--suite suites/ci.toml"),
        ("--out /work/main", "--out ."),
        ("runs in /work/aa-tree/runs/study/aa-quiet", "runs in runs/study/aa-quiet"),
        ("/work/main/.venv/bin/attnbench run speed", "attnbench run speed"),
        (
            'File "/opt/x/lib/python3.12/site-packages/torch/nn.py"',
            'File "site-packages/torch/nn.py"',
        ),  # fmt: skip
        ("ratio 1.3 at n=1024 (results/speed/cpu)", "ratio 1.3 at n=1024 (results/speed/cpu)"),
    ],
)
def test_machine_prefixes_become_relative(made, kept):
    assert scrub_text(made) == kept


def test_a_checkout_anywhere_is_named_relatively(tmp_path):
    root = tmp_path / "checkout"
    text = f"error in {root}/attnbench/cli/app.py, run from {root}"
    assert scrub_text(text, root) == "error in attnbench/cli/app.py, run from ."


def test_a_folder_is_rewritten_in_place(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.log").write_text("read /work/main/suites/ci.toml\n")
    (tmp_path / "run" / "results.json").write_text(json.dumps({"suite": "/work/main/suites/x"}))
    (tmp_path / "run" / "figure.png").write_bytes(b"\x89PNG /work/main/x")
    (tmp_path / "same.md").write_text("nothing to rewrite\n")
    changed = scrub_folder(tmp_path)
    assert sorted(p.name for p in changed) == ["results.json", "run.log"]
    assert (tmp_path / "run" / "run.log").read_text() == "read suites/ci.toml\n"
    assert json.loads((tmp_path / "run" / "results.json").read_text()) == {"suite": "suites/x"}
    assert (tmp_path / "run" / "figure.png").read_bytes() == b"\x89PNG /work/main/x"
