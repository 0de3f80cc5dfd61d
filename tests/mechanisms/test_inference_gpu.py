"""The inference shapes on a CUDA GPU: every decode form that runs there (SDPA on the cache,
FLA's fused recurrent kernels, and the plain-torch forms on CUDA tensors) against its
mechanism's causal reference, fp16 and bf16, by the project's rule; FLA's packed entries
(``cu_seqlens``) against the reference on each sequence alone; and a decoding sweep's memory
roofline. Run with ``pytest -m gpu`` (the default run deselects the marker)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnbench import registry
from attnbench.bench.results import read_results
from attnbench.bench.run import run_speed
from attnbench.core.decode import decode_outputs
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import FACTOR_OUTPUT, judge
from attnbench.core.varlen import run_packed
from tests.helpers.decode_cases import SMALL, settings
from tests.helpers.speed import tiny

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]


def gpu_forms() -> list:
    return [
        pytest.param(m, p, params, id=f"{m.name}:{p.name}-{i}")
        for m in registry.MECHANISMS
        for p in m.decode
        if not p.unavailable("cuda")
        for i, params in enumerate(settings(m))
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("mech", "form", "params"), gpu_forms())
@pytest.mark.parametrize(("n", "steps"), [(1021, [1]), (300, [4, 1, 3]), (0, [1] * 5 + [64])])
def test_decode_on_the_gpu_equals_the_causal_reference(mech, form, params, n, steps, dtype):
    resolved = mech.resolve(params)
    total = n + sum(steps)
    shape = mech.shape_for(Shape(2, 8, total, 64), resolved)
    inputs = make_inputs(mech, shape, resolved, dtype=dtype, device="cuda", seed=total)
    with torch.no_grad():
        try:
            decoded, _ = decode_outputs(mech, form, inputs, resolved, n, steps)
        except Exception as e:  # a refusal the form states (FLA's float16 normaliser)
            if "float16" in str(e) and dtype == torch.float16:
                pytest.skip(str(e))
            raise
        oracle = mech.reference(**{k: t.double() for k, t in inputs.items()}, causal=True,
                                **resolved)[:, :, n:]  # fmt: skip
        baseline = mech.reference(**inputs, causal=True, **resolved)[:, :, n:]
    verdict = judge("output", decoded, baseline, oracle, FACTOR_OUTPUT, total * shape.head_dim)
    assert verdict.ok, str(verdict)


def fla_packed_paths() -> list:
    return [
        pytest.param(m, p, id=f"{m.name}:{p.name}")
        for m in registry.MECHANISMS
        for p in m.paths
        if p.varlen is not None and not p.unavailable("cuda")
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("mech", "path"), fla_packed_paths())
def test_packed_entries_on_the_gpu_equal_each_sequence_alone(mech, path, dtype):
    lengths = (300, 17, 1024, 65)
    params = mech.resolve({k: v for k, v in SMALL.get(mech.name, {}).items()
                           if k in mech.param_names})  # fmt: skip
    shape = mech.shape_for(Shape(1, 8, sum(lengths), 64), params)
    inputs = make_inputs(mech, shape, params, dtype=dtype, device="cuda", seed=3)
    loop = replace(mech.reference, varlen=None)
    with torch.no_grad():
        if dtype == torch.float16 and mech.name == "linear" and params["normalize"]:
            pytest.skip("FLA's normalised linear attention refuses float16")
        packed = run_packed(mech, path, inputs, lengths, causal=True, params=params)
        oracle = run_packed(mech, loop, {k: t.double() for k, t in inputs.items()}, lengths,
                            causal=True, params=params)  # fmt: skip
        baseline = run_packed(mech, loop, inputs, lengths, causal=True, params=params)
    verdict = judge("output", packed, baseline, oracle, FACTOR_OUTPUT, max(lengths) * 64)
    assert verdict.ok, str(verdict)


def test_a_gpu_decode_sweep_has_its_memory_roofline(tmp_path):
    suite = tiny(
        device="cuda",
        mechanisms=("softmax", "retention"),
        dtypes=("bfloat16",),
        query_lengths=(1,),
        lengths=(4096, 16384),
        heads=32,
        head_dims=(128,),
        reference="softmax:sdpa",
        copy_mib=512,
    )
    run_speed(suite, tmp_path)
    df = read_results(tmp_path / "results.csv")
    ok = df[df["status"] == "ok"]
    assert (ok["bandwidth_fraction"] > 0).all() and (ok["copy_bytes_per_s"] > 1e11).all()
    sdpa = ok[(ok["path"] == "sdpa") & (ok["seq_len"] == 16384)]
    assert len(sdpa) == 1
