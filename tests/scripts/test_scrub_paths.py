"""scripts/scrub_paths.py: the machine's absolute prefixes become relative paths, nothing else
moves."""

from __future__ import annotations

import pytest

from scripts.scrub_paths import scrub_text


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
