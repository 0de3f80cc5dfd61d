"""Every faster path against its mechanism's dense reference: outputs and gradients; and every
path function reads each keyword it declares (a path is passed only what its signature names)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable

import pytest
import torch

from attnbench import registry
from attnbench.core.inputs import make_inputs
from attnbench.core.testing import compare_paths
from tests.helpers.cases import path_cases


@pytest.mark.parametrize(("mech", "path", "causal", "shape", "dtype"), path_cases())
def test_path_matches_reference(mech, path, causal, shape, dtype):
    params = mech.defaults
    inputs = make_inputs(mech, shape, params, dtype=dtype, seed=shape.seq_len)
    kwargs = {"causal": causal, **params}
    verdicts = compare_paths(path, mech.reference, inputs, kwargs, backward=mech.backward)
    failed = [str(v) for v in verdicts if not v.ok]
    assert not failed, "; ".join(failed)
    # The reference itself must not produce NaN anywhere (rows with no key give zeros).
    with torch.no_grad():
        assert torch.isfinite(mech.reference(**inputs, **kwargs)).all()


# ------------------------------------------------------------------------------------------------
# Signatures that say what a path uses
# ------------------------------------------------------------------------------------------------

#: Path functions (``module.qualname``) allowed to declare a keyword their body never reads, each
#: with the reason. Keep it short: a path declares the parameters it reads and no others
#: (``PathSpec`` passes a function only those; ``**kwargs`` receives every one).
#: Path functions allowed to declare a keyword they never read, with the reason (none today).
UNREAD_ALLOWED: dict[str, str] = {}


def _name(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def unread_keywords(fn: Callable) -> list[str]:
    """The parameters of path function ``fn`` after q, k, v (``causal``, the mechanism's
    parameters, its extra inputs, ``**kwargs``) that no expression in its body reads."""
    fn = inspect.unwrap(fn)  # through decorators such as float32_sums, to the function written
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, ast.FunctionDef), f"{_name(fn)}: write a path function as a def"
    read = {
        n.id
        for stmt in node.body  # the body only: not the signature's annotations and defaults
        for n in ast.walk(stmt)  # nested functions (closures) included
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    declared = list(inspect.signature(fn).parameters)[3:]  # q, k, v come first, positionally
    return [name for name in declared if name not in read]


def registered_paths() -> list:
    return [
        pytest.param(p.fn, id=f"{m.name}:{p.name}") for m in registry.MECHANISMS for p in m.paths
    ]


def test_unread_keywords_finds_unread_parameters_and_kwargs():
    def demo(q, k, v, *, causal: bool, window: int, chunk: int, **rest):
        def inner():
            return chunk  # read by a closure: counts

        return q if causal else inner()

    assert unread_keywords(demo) == ["window", "rest"]


@pytest.mark.parametrize("fn", registered_paths())
def test_path_reads_every_keyword_it_declares(fn):
    if _name(fn) in UNREAD_ALLOWED:
        pytest.skip(UNREAD_ALLOWED[_name(fn)])
    unread = unread_keywords(fn)
    assert not unread, (
        f"{_name(fn)} declares {', '.join(unread)} but never reads them: remove them from its "
        "signature (PathSpec passes a path only the keywords it declares)"
    )


def test_unread_allowed_is_current():
    """Every allow-listed function is still registered and still declares an unread keyword."""
    found = {_name(p.fn): p.fn for m in registry.MECHANISMS for p in m.paths}
    for name in UNREAD_ALLOWED:
        assert name in found, f"{name} is no longer a registered path: drop it from UNREAD_ALLOWED"
        assert unread_keywords(found[name]), f"{name} reads all it declares: drop it from the list"
