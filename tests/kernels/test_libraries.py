"""Library-backed paths (attnbench/libraries): the same operator as the mechanism's reference,
a clear reason when the package is missing or too old, and the package named in the listing
and in every result's sidecar."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from attnbench import registry
from attnbench.cli import app
from attnbench.core import capabilities
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import compare_paths
from attnbench.measure import machine

runner = CliRunner()
LOCAL = registry.get("local")


@pytest.fixture
def local_attention_installed():
    if LOCAL.path("local-attention").unavailable("cpu", True):
        pytest.skip("local-attention is not installed (pip install 'attnbench[local]')")


@pytest.mark.usefixtures("local_attention_installed")
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize(
    ("t", "window", "dtype"),
    [
        (97, 8, torch.float64),  # T not a multiple of the window: padded keys must stay out
        (130, 16, torch.float32),
        (5, 64, torch.float32),  # window longer than the sequence
        (1, 3, torch.float64),
        (257, 32, torch.bfloat16),
        (100, 7, torch.float16),
    ],
)
def test_local_attention_package_is_the_local_mechanism(causal, t, window, dtype):
    params = LOCAL.resolve({"window": window})
    x = make_inputs(LOCAL, Shape(2, 3, t, 16), params, seed=3, dtype=dtype, requires_grad=True)
    verdicts = compare_paths(LOCAL.path("local-attention"), LOCAL.reference, x,
                             {"causal": causal, **params})  # fmt: skip
    assert all(v.ok for v in verdicts), "; ".join(map(str, verdicts))


def test_missing_or_old_package_is_a_reason_not_an_error(monkeypatch):
    path = LOCAL.path("local-attention")
    monkeypatch.setattr(capabilities, "package_version", lambda dist: None)
    reason = path.unavailable("cpu")
    assert reason == 'needs local-attention >= 1.9 (pip install "attnbench[local]")'
    monkeypatch.setattr(capabilities, "package_version", lambda dist: "1.8.9")
    assert "found 1.8.9" in path.unavailable("cpu")
    monkeypatch.setattr(capabilities, "package_version", lambda dist: "1.10.0rc1")
    assert path.unavailable("cpu") is None  # 1.10 > 1.9, numerically


def test_listing_and_sidecar_name_the_package():
    done = runner.invoke(app, ["list", "--format", "json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    entries = data if isinstance(data, list) else data["mechanisms"]
    (local,) = [e for e in entries if e["name"] == "local"]
    (lib,) = [p for p in local["paths"] if p["name"] == "local-attention"]
    assert lib["package"] == "local-attention"
    assert lib["package_version"] == capabilities.package_version("local-attention")
    (fla,) = [p for p in local["paths"] if p["name"] == "fla-parallel"]
    assert fla["package"] == "fla-core"
    library_paths = {"local-attention", "fla-parallel", "xformers"}
    assert all("package" not in p for p in local["paths"] if p["name"] not in library_paths)
    libraries = machine.versions()["libraries"]
    for dist in ("local-attention", "fla-core", "sageattention"):
        assert libraries[dist] == capabilities.package_version(dist)


def test_release_comparison():
    assert not capabilities.older("1.9", "1.9.0") and not capabilities.older("1.9.0", "1.9")
    assert capabilities.older("1.8.9", "1.9") and not capabilities.older("1.10", "1.9")
    assert not capabilities.older("1.11.2", "1.9")


@pytest.mark.usefixtures("local_attention_installed")
def test_a_package_that_does_not_import_is_a_one_line_error(monkeypatch):
    import sys

    from attnbench.core.errors import AttnbenchError

    monkeypatch.setitem(sys.modules, "local_attention", None)  # installed but broken
    x = make_inputs(LOCAL, Shape(1, 1, 9, 4), LOCAL.resolve({}), seed=0)
    with pytest.raises(AttnbenchError, match="does not import"):
        LOCAL.path("local-attention")(**x, causal=True, window=4)


def test_check_shows_the_install_command_of_a_missing_package(monkeypatch):
    """A reason holds ``attnbench[extra]``: shown as written, not taken for rich markup."""
    from attnbench.cli.common import out

    monkeypatch.setattr(capabilities, "package_version", lambda dist: None)
    monkeypatch.setattr(out, "width", 300)  # one line a row: the reason is not wrapped
    done = runner.invoke(app, ["check", "local", "--n", "17"])
    assert done.exit_code == 0, done.output
    assert 'pip install "attnbench[xformers]"' in done.output, done.output
