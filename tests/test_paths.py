"""Every faster path against its mechanism's dense reference: outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from attnbench.core.inputs import make_inputs
from attnbench.core.testing import compare_paths
from tests.conftest import path_cases


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
