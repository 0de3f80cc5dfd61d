"""What a path needs from the machine, and whether this machine has it: the one capability check.

A path declares :class:`Requirement` objects (:data:`CUDA`, :data:`TRITON`, :data:`FLEX`, a
library package); each wraps a check written against a device *type* (``"cpu"``, ``"cuda"``) that
returns None when met, else the reason. :meth:`attnbench.core.spec.Mechanism.not_supported_reasons`
asks them for the API, the layers, ``check`` and the speed sweep; ``attnbench list`` asks the same
checks by name (:func:`reasons`) from the cached registry description
(:mod:`attnbench.cli.catalogue`), in a fraction of a second: torch is imported only when the
answer depends on it (a GPU device node exists, or torch is already loaded, as in the Python API
and the tests).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Device nodes a GPU torch could use (NVIDIA's driver, AMD's ROCm, WSL's). On Linux, none of
#: them present means torch.cuda.is_available() is False, without asking torch.
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def cuda_available() -> bool:
    """torch.cuda.is_available(), importing torch only when the answer could be True."""
    if "torch" not in sys.modules and sys.platform == "linux":
        if not any(os.path.exists(node) for node in GPU_NODES):
            return False
    import torch

    return torch.cuda.is_available()


def torch_version() -> str:
    """The installed torch's version, read from its metadata (no import)."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _has_module_file(dotted: str) -> bool:
    """Whether ``dotted`` (a submodule of an installed package) exists, without importing its
    parent packages (importlib.util.find_spec on a submodule would import torch)."""
    top, _, rest = dotted.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return False
    for base in spec.submodule_search_locations:
        sub = Path(base, *rest.split("."))
        if sub.with_suffix(".py").exists() or (sub / "__init__.py").exists():
            return True
    return False


def cuda(device_type: str, backward: bool) -> str | None:
    if not cuda_available():
        return "needs CUDA (no GPU visible to torch)"
    if device_type != "cuda":
        return f"needs a CUDA device (asked for {device_type})"
    return None


def triton(device_type: str, backward: bool) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "needs Triton (pip install triton)"
    return None


#: C++ compilers torch.compile's CPU backend (Inductor) can build its kernels with, besides $CXX.
CPP_COMPILERS = ("g++", "c++", "clang++")


def cpp_compiler() -> str | None:
    """The C++ compiler Inductor would find ($CXX, else the first of CPP_COMPILERS on PATH)."""
    named = os.environ.get("CXX")
    if named:
        return shutil.which(named)
    return next((found for c in CPP_COMPILERS if (found := shutil.which(c))), None)


def cpu_vector_isa() -> str:
    """The vector instruction set torch's CPU kernels use ("AVX2", "AVX512", "DEFAULT" for none,
    ...): torch's own answer once it is imported, else what ``ATEN_CPU_CAPABILITY`` asks for,
    else "UNKNOWN"."""
    imported = sys.modules.get("torch")
    if imported is not None:
        return str(imported.backends.cpu.get_cpu_capability()).upper()
    return os.environ.get("ATEN_CPU_CAPABILITY", "").upper() or "UNKNOWN"


def flex(device_type: str, backward: bool) -> str | None:
    if not _has_module_file("torch.nn.attention.flex_attention"):
        return f"needs FlexAttention (torch >= 2.5; this is {torch_version()})"
    if device_type == "cuda":
        return None
    if device_type != "cpu":
        return f"FlexAttention paths run on CUDA or the CPU (asked for {device_type})"
    if backward:
        return "FlexAttention has no backward on CPU (forward only)"
    why = _inductor_cpu()
    return f"FlexAttention on CPU {why}" if why else None


def _inductor_cpu() -> str | None:
    """Why torch.compile (Inductor) cannot build C++ kernels on this CPU; None when it can."""
    if cpp_compiler() is None:
        return "is compiled to C++ by torch.compile: needs g++ or clang++ (or $CXX)"
    if cpu_vector_isa() == "DEFAULT":
        # Inductor's C++ kernels are written with at::vec; torch running without a vector ISA
        # (ATEN_CPU_CAPABILITY=default, or a CPU without AVX2) fails to compile them.
        return (
            "is compiled to C++ by torch.compile, whose kernels need a vector instruction set "
            "(AVX2 or better), and torch runs without one here (ATEN_CPU_CAPABILITY=default or "
            "an older CPU)"
        )
    return None


def inductor(device_type: str, backward: bool) -> str | None:
    """torch.compile's Inductor backend: C++ on the CPU, Triton on CUDA."""
    if device_type == "cpu":
        why = _inductor_cpu()
        return f"this path on the CPU {why}" if why else None
    if device_type == "cuda":
        return cuda(device_type, backward) or triton(device_type, backward)
    return f"torch.compile paths run on the CPU or CUDA (asked for {device_type})"


#: Other projects' packages that library-backed paths run: requirement name (``package:KEY``)
#: -> (distribution on the package index, lowest version tested, attnbench extra that installs
#: it).
PACKAGES: dict[str, tuple[str, str, str]] = {
    "local-attention": ("local-attention", "1.9", "local"),
    "fla-core": ("fla-core", "0.6", "fla"),
    "sageattention": ("sageattention", "1.0", "sage"),
    "xformers": ("xformers", "0.0.35", "xformers"),
}


def package_version(distribution: str) -> str | None:
    """The installed version of a distribution (None when it is not installed), without
    importing it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """'1.11.2' -> (1, 11, 2); '0.6.0rc1' -> (0, 6, 0): the numeric release only."""
    parts = []
    for piece in version.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def older(found: str, lowest: str) -> bool:
    """Whether release ``found`` is older than ``lowest`` ('1.9' equals '1.9.0')."""
    a, b = _release(found), _release(lowest)
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) < b + (0,) * (width - len(b))


def package(key: str) -> Callable[[str, bool], str | None]:
    """The check of ``PACKAGES[key]``: installed, at the lowest tested version or newer."""
    distribution, lowest, extra = PACKAGES[key]

    def check(device_type: str, backward: bool) -> str | None:
        found = package_version(distribution)
        if found is None:
            return f'needs {distribution} >= {lowest} (pip install "attnbench[{extra}]")'
        if older(found, lowest):
            return (
                f"needs {distribution} >= {lowest}, found {found} "
                f'(pip install -U "attnbench[{extra}]")'
            )
        return None

    return check


def xformers_kernels(device_type: str, backward: bool) -> str | None:
    """``package:xformers``: installed at a tested version and, on a CUDA device, its compiled
    operators loaded. xFormers' wheels are built for one torch and CUDA; under another torch the
    package still imports, but without kernels, and every call fails. That is asked only where a
    CUDA device is (importing xformers imports torch), so listing paths stays cheap elsewhere."""
    missing = package("xformers")(device_type, backward)
    if missing or device_type != "cuda" or not cuda_available():
        return missing
    import logging

    import torch

    # xFormers logs a many-line warning of its own when its kernels do not load; the reason
    # returned here says it in one line.
    logger = logging.getLogger("xformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import xformers
    except Exception as e:  # a broken install: any error on import is the reason
        first = (str(e).strip().splitlines() or [""])[0]
        return f"xformers does not import ({type(e).__name__}: {first})"
    finally:
        logger.setLevel(level)
    cpp = getattr(xformers, "_cpp_lib", None)
    gpu_build = getattr(cpp, "_built_with_cuda", True) or bool(torch.version.hip)  # ROCm: no CUDA
    if getattr(xformers, "_has_cpp_library", True) and gpu_build:
        return None
    error = getattr(cpp, "_cpp_library_load_exception", None)
    info = getattr(error, "build_info", None) or getattr(cpp, "_build_metadata", None)
    if info is None:
        built = "built for another torch or Python, or without CUDA"
    elif info.cuda_version is None:
        built = f"built for torch {info.torch_version} without CUDA"
    else:
        built = f"built for torch {info.torch_version} with CUDA {_cuda_release(info.cuda_version)}"
    return (
        f"xformers {package_version('xformers')} has no CUDA kernels here ({built}; this is "
        f"torch {torch_version()}): install the xformers build made for this torch"
    )


def _cuda_release(version: object) -> str:
    """xFormers' build record's CUDA version (1208) as a release ('12.8')."""
    if isinstance(version, int) and version >= 100:
        return f"{version // 100}.{version % 100}"
    return str(version)


#: Requirement name -> check(device type, backward) -> None when met, else why not.
CHECKS: dict[str, Callable[[str, bool], str | None]] = {
    "cuda": cuda,
    "triton": triton,
    "flex": flex,
    "inductor": inductor,
    **{f"package:{key}": package(key) for key in PACKAGES},
    "package:xformers": xformers_kernels,
}


def library_versions() -> dict[str, str | None]:
    """Every library package a path can use, with its installed version (None: not installed):
    recorded in each result's sidecar."""
    return {dist: package_version(dist) for dist, _, _ in PACKAGES.values()}


def reasons(requires: list[str] | tuple[str, ...], device_type: str, backward: bool = False) -> str:
    """Every unmet requirement's reason in one line ('' when all are met)."""
    found = (CHECKS[name](device_type, backward) for name in requires)
    return "; ".join(r for r in found if r)


@dataclass(frozen=True)
class Requirement:
    """Something a path needs from the machine; ``check`` returns None when met, else why not."""

    name: str
    check: Callable[[torch.device, bool], str | None]


def requirement(name: str) -> Requirement:
    """The :class:`Requirement` of ``CHECKS[name]``, asked with a device."""
    check = CHECKS[name]
    return Requirement(name, lambda device, backward: check(device.type, backward))


CUDA = requirement("cuda")
TRITON = requirement("triton")
FLEX = requirement("flex")
INDUCTOR = requirement("inductor")

#: Library-backed paths: the other project's package, at a tested version.
LOCAL_ATTENTION = requirement("package:local-attention")
FLA_CORE = requirement("package:fla-core")
SAGEATTENTION = requirement("package:sageattention")
XFORMERS = requirement("package:xformers")
