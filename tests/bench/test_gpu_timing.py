"""The GPU timing options (``[timing] l2`` and ``graph``) and the rows that record them: the
cold-L2 clock, the flush buffer's size and the CUDA graph capture checked with fakes on the CPU;
their refusal on the CPU (one line, exit 2); flash-attention's FLOP convention in the roofline.
One test needs a GPU: a cold L2 is not faster than a warm one where the working set fits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from attnbench.bench import member as member_module
from attnbench.bench.config import load_suite, override
from attnbench.bench.results import read_results
from attnbench.bench.run import run_speed
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.measure import gpu_timing
from attnbench.measure.timing import Clock, TimingPolicy
from tests.helpers.speed import tiny

runner = CliRunner()


class FakeEvent:
    """A CUDA event on a fake timeline: each record takes the next tick of ``log``."""

    def __init__(self, log: list, enable_timing: bool = True) -> None:
        self.log = log
        self.at = None

    def record(self) -> None:
        self.log.append("record")
        self.at = len(self.log)

    def synchronize(self) -> None:
        self.log.append("sync")

    def elapsed_time(self, end: FakeEvent) -> float:
        return float(end.at - self.at)  # milliseconds, as torch's


@pytest.fixture
def fake_cuda_events(monkeypatch):
    log: list = []
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=True: FakeEvent(log))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    return log


def test_cold_clock_flushes_before_every_call_outside_the_timed_interval(fake_cuda_events):
    log = fake_cuda_events
    clock = gpu_timing.ColdL2Clock("cuda", flush=lambda: log.append("flush"))
    per_call = clock.time_block(lambda: log.append("call"), calls=3)
    body = [step for step in log if step != "sync"]
    assert body == ["flush", "record", "call", "record"] * 3
    # Each interval spans the call alone (record, call, record: 2 ticks), never a flush.
    assert per_call == pytest.approx(2 / 1e3)


def test_warm_clock_times_the_block_with_no_flush(fake_cuda_events):
    log = fake_cuda_events
    per_call = Clock("cuda").time_block(lambda: log.append("call"), calls=3)
    assert "flush" not in log and log.count("call") == 3
    assert per_call == pytest.approx(4 / 3 / 1e3)  # record, 3 calls, record


def test_the_flush_buffer_is_at_least_twice_the_l2(monkeypatch):
    props = SimpleNamespace(L2_cache_size=200 * 2**20)  # a future GPU's 200 MiB
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    assert gpu_timing.flush_bytes(torch.device("cuda")) == 400 * 2**20
    props.L2_cache_size = 50 * 2**20  # an H100's: the 256 MiB floor (Triton's do_bench buffer)
    assert gpu_timing.flush_bytes(torch.device("cuda")) == gpu_timing.MIN_FLUSH_BYTES
    assert 2 * props.L2_cache_size <= gpu_timing.MIN_FLUSH_BYTES


def test_the_clock_a_policy_asks_for(monkeypatch):
    monkeypatch.setattr(gpu_timing, "L2Flush", lambda device: lambda: None)
    cold = gpu_timing.make_clock(torch.device("cuda"), TimingPolicy(l2="cold"))
    assert isinstance(cold, gpu_timing.ColdL2Clock)
    for policy in (TimingPolicy(l2="warm"), TimingPolicy()):
        clock = gpu_timing.make_clock(torch.device("cuda"), policy)
        assert not isinstance(clock, gpu_timing.ColdL2Clock) and clock.name == "cuda-events"
    assert gpu_timing.effective_l2(TimingPolicy(), torch.device("cuda")) == "warm"
    assert gpu_timing.effective_l2(TimingPolicy(l2="cold"), torch.device("cuda")) == "cold"
    assert gpu_timing.effective_l2(TimingPolicy(l2="cold"), torch.device("cpu")) is None


@pytest.mark.parametrize(
    ("setting", "words"),
    [("timing.l2=cold", "[timing] l2 = 'cold'"), ("timing.l2=warm", "[timing] l2 = 'warm'"),
     ("timing.graph=true", "[timing] graph = true")],
)  # fmt: skip
def test_gpu_options_are_refused_on_the_cpu_with_one_line(tmp_path, setting, words):
    suite = tmp_path / "s.toml"
    suite.write_text('[grid]\nmechanisms = ["softmax"]\ndevice = "cpu"\nlengths = [16]\n')
    cmd = ["run", "speed", "--suite", str(suite), "--set", setting, "--out", str(tmp_path / "o")]
    result = runner.invoke(app, cmd)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert words in lines[0] and "a CUDA device only" in lines[0]
    assert not (tmp_path / "o").exists()


def test_gpu_options_are_refused_by_the_library_too(tmp_path):
    with pytest.raises(AttnbenchError, match="graph = true"):
        run_speed(tiny(timing=TimingPolicy(graph=True)), tmp_path)
    with pytest.raises(AttnbenchError, match="l2 = 'cold'"):
        override(tiny(timing=TimingPolicy(l2="cold")))


def test_a_bad_l2_value_names_the_accepted_ones(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('[timing]\nl2 = "lukewarm"\n')
    with pytest.raises(AttnbenchError, match=r"line 2.*accepted: .*cold.*warm"):
        load_suite(str(suite))


def test_the_gpu_suite_records_its_timing_options():
    suite = load_suite("speed-gpu")
    assert suite.timing.l2 == "warm" and suite.timing.graph is False
    assert suite.settings()["timing"]["l2"] == "warm"


def test_rows_record_the_options_and_the_flash_attention_roofline(tmp_path):
    run = run_speed(tiny(mechanisms=("softmax",), lengths=(16,)), tmp_path)
    df = read_results(run.csv)
    assert (df["l2"] == "").all()  # the CPU: attnbench manages no cache there
    assert (~df["graph"].astype(bool)).all() and (df["graph_reason"] == "").all()
    # roofline_fa: flash-attention's FLOPs (fwd+bwd = 3.5 x fwd) over the same rounds' matmul.
    factor = df["direction"].map({"fwd": 1.0, "fwdbwd": 3.5 / 3})
    assert ((df["roofline_fa"] / df["roofline"] / factor - 1).abs() < 1e-4).all()


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


class FakeStream:
    def __init__(self, device=None) -> None: ...

    def wait_stream(self, other) -> None: ...


@pytest.fixture
def fake_graphs(monkeypatch):
    """torch.cuda's graph capture as context managers that call nothing on a device."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


def test_a_capturable_call_is_timed_as_graph_replays(fake_graphs):
    calls = []
    replay, why = gpu_timing.capture(lambda: calls.append(1), torch.device("cuda"))
    assert why == "" and replay.__self__.__class__ is FakeGraph
    assert len(calls) == gpu_timing.CAPTURE_WARMUP_CALLS + 1  # side-stream warm-up, capture


def test_a_call_that_cannot_be_captured_is_timed_as_before_and_says_why(fake_graphs):
    def syncs():
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    call, why = gpu_timing.capture(syncs, torch.device("cuda"))
    assert call is syncs
    assert why == (
        "not captured in a CUDA graph: RuntimeError: operation not permitted when stream is "
        "capturing"
    )


def test_a_member_uses_the_graph_or_keeps_the_reason(monkeypatch):
    case = SimpleNamespace(device=torch.device("cuda"))
    warm = SimpleNamespace(per_call_s=1e-3, first_s=1.0)
    m = member_module.Member(case=case, call=lambda: None, warm=warm)
    monkeypatch.setattr(member_module, "capture", lambda call, device: (call, "no: a reason"))
    member_module.use_graph(m, Clock("cpu"), TimingPolicy(block_s=0.0))
    assert m.graph is False and m.graph_reason == "no: a reason"
    replay = FakeGraph().replay
    monkeypatch.setattr(member_module, "capture", lambda call, device: (replay, ""))
    member_module.use_graph(m, Clock("cpu"), TimingPolicy(block_s=0.0, warmup_calls=1))
    assert m.graph is True and m.call is replay and m.graph_reason == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cold_l2_is_not_faster_than_a_warm_one_where_the_working_set_fits():
    """A read of 16 MiB (inside an H100's 50 MiB L2): warm, the L2 holds it from the last
    call; cold, every call reads it from HBM. Medians of 15 samples of 20 calls each."""
    from attnbench.measure.timing import stats

    device = torch.device("cuda")
    x = torch.randn(4 * 2**20, device=device)  # 16 MiB of float32
    assert x.numel() * 4 * 2 < gpu_timing.l2_bytes(device) or gpu_timing.l2_bytes(device) == 0

    def call():
        return x.sum()

    warm, cold = Clock(device), gpu_timing.ColdL2Clock(device, gpu_timing.L2Flush(device))
    for clock in (warm, cold):
        clock.time_block(call, 5)
    warm_s = stats([warm.time_block(call, 20) for _ in range(15)]).median
    cold_s = stats([cold.time_block(call, 20) for _ in range(15)]).median
    assert cold_s >= warm_s, (cold_s, warm_s)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_suite_times_a_cold_l2_no_faster_than_a_warm_one(tmp_path):
    """The same attention case through the speed suite, l2 = warm then cold: q, k, v of B=1,
    H=4, n=512, D=64 in bf16 (768 KiB) stay in the L2 between warm calls."""
    times = {}
    for l2 in ("warm", "cold"):
        suite = tiny(device="cuda", dtypes=("bfloat16",), mechanisms=("softmax:sdpa-flash",),
                     path_kinds=("fused",), reference="", lengths=(512,), heads=4,
                     head_dims=(64,), directions=("fwd",), causal=(False,),
                     timing=TimingPolicy(warmup_calls=5, rounds=15, min_rounds=15, block_s=0.005,
                                         l2=l2))  # fmt: skip
        df = read_results(run_speed(suite, tmp_path / l2).csv)
        assert set(df["l2"]) == {l2} and (df["status"] == "ok").all(), df["reason"].tolist()
        times[l2] = float(df["time_median_ms"].iloc[0])
    assert times["cold"] >= times["warm"], times
