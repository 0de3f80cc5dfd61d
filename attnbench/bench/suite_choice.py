"""Which suite ``attnbench run speed`` runs when no ``--suite`` is given: the GPU's own when the
run is on CUDA, the CPU's otherwise.

The CPU suite (``speed``: float32, B=1 H=4 D=32, n <= 2048) pins ``device = "cpu"``; run on a
GPU machine as the default, it measured nothing of the GPU (every fused path was "needs a CUDA
device (asked for cpu)"), and its float32 toy shapes leave every SDPA fused backend and library
kernel unable to run. So the device decides: ``--device auto`` (or none) with CUDA visible, or
``--device cuda``, runs ``speed-gpu``; anything else runs ``speed``.
"""

from __future__ import annotations

#: The default suites, by where they run (files in attnbench/data/suites/).
CPU_SUITE = "speed"
GPU_SUITE = "speed-gpu"


def default_suite(device: str | None, cuda_visible: bool) -> str:
    """The suite for ``--device`` ``device`` (None: not given, which means ``auto``) on a
    machine where CUDA is (or is not) visible to torch."""
    if device is None or device == "auto":
        return GPU_SUITE if cuda_visible else CPU_SUITE
    return GPU_SUITE if device.startswith("cuda") else CPU_SUITE


def chosen_note(suite: str, gpu_name: str) -> str | None:
    """The line that says a GPU run chose its suite by itself (None for the CPU suite, whose
    choice is what it always was)."""
    if suite != GPU_SUITE:
        return None
    return (
        f"no --suite: CUDA is visible ({gpu_name}), so the default GPU suite {GPU_SUITE} runs "
        "(bf16, head dims 64 and 128, n = 1k..16k; about 3 minutes from cold compile caches); "
        f"--suite {CPU_SUITE} runs the CPU one"
    )
