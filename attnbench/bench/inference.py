"""The inference shapes of a speed sweep, made ready to time: a decode case (new queries against
a cache or a state its own prefill built) and a packed-batch case (sequences end to end, or the
same sequences padded to the longest), each a :class:`~attnbench.bench.member.Member` that the
group's interleaved rounds time like any other; and their rows' extra columns.

Decode cases of one group share what they can (:func:`decode_inputs`): the inputs of one shape
and dtype, and the cache a prefill builds (every cache form prefills with
:meth:`KVCache.prefill`, so softmax, its variants and the sparse patterns read one cache); a
step writes the same new keys into it whatever the form, so sharing changes nothing measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from attnbench import api
from attnbench.bench.member import Member
from attnbench.bench.plan import Case
from attnbench.core.decode import split_tokens
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.varlen import (
    lengths_text,
    offsets,
    packed_shape,
    padded_shape,
    path_keywords,
    run_packed,
)
from attnbench.measure.bandwidth import CopyAnchor
from attnbench.measure.memory import peak_memory
from attnbench.measure.timing import Clock, Stats, TimingPolicy, block_calls, stats, warm_up

QKV = ("q", "k", "v")


def _validate(case: Case, inputs: Mapping[str, torch.Tensor]) -> None:
    """The checks every call of the mechanism gets (K/V heads, shapes, its own checks)."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    api.check_tensors(case.mech, q, k, v)
    if case.mech.check_inputs is not None:
        problem = case.mech.check_inputs(q, k, v, case.params)
        if problem:
            raise AttnbenchError(f"{case.mech.name}: {problem}")


def decode_inputs(case: Case, cache: dict[tuple, Any]) -> tuple[dict, dict, dict, tuple]:
    """(the prompt's tensors, the new tokens', the learned parameters, their cache key) for a
    decode case, made once per shape, dtype and extra inputs in the group."""
    s = case.shape
    whole = replace(s, seq_len=s.seq_len + s.query_len, query_len=None)
    extras = tuple((e.name, tuple(e.shape(whole, case.params)), e.init_std)
                   for e in case.mech.extras_for(case.params))  # fmt: skip
    key = ("decode", whole, case.dtype, extras)
    if key not in cache:
        inputs = make_inputs(case.mech, whole, case.params, dtype=case.dtype,
                             device=case.device, seed=0)  # fmt: skip
        _validate(case, inputs)
        cache[key] = split_tokens(case.mech, case.params, inputs, s.seq_len)
    return (*cache[key], key)


def set_up_decode(
    case: Case, cache: dict[tuple, Any], clock: Clock, timing: TimingPolicy
) -> Member:
    """A decode case ready to time: its prefill run once (untimed), its call one step of
    ``query_len`` new tokens from that state, warmed up, its step's peak memory measured, and
    the state's bytes kept for its row."""
    prefix, new, shared, key = decode_inputs(case, cache)
    path, n = case.path, case.shape.seq_len
    kwargs = {**case.params, **shared}
    state_key = (key, path.prefill)  # one prefill function, one state: shared in the group
    with torch.no_grad():
        if state_key not in cache:
            extra = {k: t for k, t in prefix.items() if k not in QKV}
            cache[state_key] = path.start(prefix["q"], prefix["k"], prefix["v"],
                                          capacity=n + case.shape.query_len,
                                          **kwargs, **extra)  # fmt: skip
    state = cache[state_key]
    step = path.step
    call_kwargs = path_keywords(step, {**kwargs, **{k: t for k, t in new.items() if k not in QKV}})
    q, k, v = new["q"], new["k"], new["v"]

    def call() -> torch.Tensor:
        with torch.no_grad():
            return step(state, q, k, v, **call_kwargs)[0]

    warm = warm_up(call, clock, timing)
    member = Member(case, call, warm)
    member.mem = peak_memory(call, case.device)
    member.block = block_calls(warm.per_call_s, timing)
    member.values = {"state_bytes": state.nbytes()}
    return member


def set_up_packed(
    case: Case, cache: dict[tuple, Any], clock: Clock, timing: TimingPolicy
) -> Member:
    """A packed-batch case ready to time, forward only: the sequences end to end through the
    path's packed entry or its loop (``packing`` packed / packed-loop), or padded to the
    longest and run as a batch (``padded``)."""
    if case.direction != "fwd":
        raise AttnbenchError(
            "packed batches are timed forward only (the loop and the packed entries have no "
            "shared backward here); accepted: direction fwd"
        )
    padded = case.packing == "padded"
    shape = padded_shape(case.shape) if padded else packed_shape(case.shape)
    shape = replace(shape, varlen=None)
    key = ("packed", shape, case.dtype, case.mech.name, tuple(sorted(case.params.items())))
    if key not in cache:
        cache[key] = make_inputs(case.mech, shape, case.params, dtype=case.dtype,
                                 device=case.device, seed=0)  # fmt: skip
        _validate(case, cache[key])
    inputs = cache[key]
    lengths = case.shape.varlen or ()
    if padded:
        extras = {k: t for k, t in inputs.items() if k not in QKV}
        kwargs = case.path.arguments({"causal": case.causal, **case.params, **extras})
        fn = case.path.fn

        def call() -> torch.Tensor:
            with torch.no_grad():
                return fn(inputs["q"], inputs["k"], inputs["v"], **kwargs)
    else:
        offsets(lengths)  # checked once here, not in the timing

        def call() -> torch.Tensor:
            with torch.no_grad():
                return run_packed(case.mech, case.path, inputs, lengths, causal=case.causal,
                                  params=case.params)  # fmt: skip

    warm = warm_up(call, clock, timing)
    member = Member(case, call, warm)
    member.mem = peak_memory(call, case.device, compiled=case.path.compiled)
    member.block = block_calls(warm.per_call_s, timing)
    return member


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


def tokens_per_call(case: Case) -> int:
    """The tokens one call processes: the new ones when decoding (the batch's), every real
    token of a packed or padded batch (padding is not a token), else batch x n."""
    s = case.shape
    if s.query_len is not None:
        return s.batch * s.query_len
    if s.varlen is not None:
        return sum(s.varlen)
    return s.batch * s.seq_len


def case_columns(case: Case) -> dict[str, Any]:
    """The columns an inference case fills before it runs (empty for the others)."""
    s = case.shape
    return {
        "query_len": s.query_len,
        "varlen": lengths_text(s.varlen) if s.varlen is not None else None,
        "packing": case.packing,
    }


def add_bandwidth(
    row: dict[str, Any],
    case: Case,
    samples: list[float],
    t: Stats,
    copy: CopyAnchor,
    copy_samples: list[float],
) -> None:
    """A decode row's bytes moved (the cache or state read and written, as its form declares),
    bytes/s, the copy's bytes/s in the same rounds, and the memory roofline: the median over
    rounds of this case's bytes/s over the copy's in the same round."""
    itemsize = torch.empty((), dtype=case.dtype).element_size()
    read, written = case.path.traffic(case.shape, case.params, itemsize)
    moved = read + written
    row["bytes_moved"] = moved
    row["bytes_per_s"] = moved / t.median
    row["copy_bytes_per_s"] = copy.bytes / stats(copy_samples).median
    per_round = [(moved / x) / (copy.bytes / c) for x, c in zip(samples, copy_samples, strict=True)]
    row["bandwidth_fraction"] = stats(per_round).median


def padded_work(row: dict[str, Any], case: Case, t: Stats) -> None:
    """A padded row's executed FLOPs: the whole padded batch, padding included (its ``flops``
    are the useful ones, as the packed row's)."""
    if case.packing != "padded" or row.get("flops") is None:
        return
    shape = replace(padded_shape(case.shape), varlen=None)
    row["flops_executed"] = case.mech.forward_flops(shape, case.causal, case.params)
    row["flop_per_s_executed"] = row["flops_executed"] / t.median
