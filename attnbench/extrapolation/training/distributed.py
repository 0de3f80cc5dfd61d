"""One training spread over the processes ``torchrun`` starts (data parallel).

``torchrun --nproc_per_node G -m attnbench run extrapolate --train-only ...`` starts G processes
with ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. Each
process draws the same full batch from the same seeded sampler (so the sampler state, and thus a
checkpoint, is the same everywhere) and computes the loss of its own contiguous share of the
batch's windows; :mod:`.train` normalises by the whole batch's masked-token count, so the summed
gradients are the single-process gradient up to float reassociation. Rank 0 alone writes
checkpoints, curves and log lines.

Evaluation is not distributed: it runs afterwards in one process (``--eval-only``).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError

#: The variables torchrun sets in every process it starts.
TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_world_size() -> int:
    """The number of processes torchrun started (1 when this process was not started by it)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise AttnbenchError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer; accepted: what torchrun "
            "sets, or unset for one process"
        ) from None


def torchrun_is_main() -> bool:
    """True unless torchrun started this process with a RANK other than 0 (known before the
    process group starts, so the other ranks are quiet from the first line)."""
    return os.environ.get("RANK", "0") == "0"


def shares(total: int, world_size: int) -> list[slice]:
    """Contiguous shares of ``total`` items over ``world_size`` ranks, the first ``total %
    world_size`` one item larger (7 over 2: [0:4], [4:7]); an empty share is refused."""
    if total < world_size:
        raise AttnbenchError(
            f"a batch of {total} windows cannot be split over {world_size} torchrun processes "
            f"(each needs at least one window); use --batch >= {world_size} or fewer processes"
        )
    base, extra = divmod(total, world_size)
    bounds = [0]
    for rank in range(world_size):
        bounds.append(bounds[-1] + base + (rank < extra))
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


@dataclass(frozen=True)
class DataParallel:
    """This process's place among torchrun's processes, and the collectives training needs."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # processes on this machine (they share its cores)
    device: torch.device  # cuda:LOCAL_RANK on GPUs, else the CPU

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the files and the log lines; the others stay quiet."""
        return self.rank == 0

    def share(self, total: int) -> slice:
        """This rank's contiguous share of ``total`` windows."""
        return shares(total, self.world_size)[self.rank]

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum ``tensor`` over the ranks, in place (every rank gets the same values)."""
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_gradients(self, model: nn.Module) -> None:
        """Sum every gradient over the ranks in one flat buffer (one collective a step)."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])  # (sum of numels,)
        self.all_reduce_sum(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def any(self, flag: bool) -> bool:
        """True when ``flag`` is true on any rank (a Ctrl-C seen by one stops them all)."""
        return bool(self.all_reduce_sum(torch.tensor([float(flag)], device=self.device)).item())

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def shutdown(self) -> None:
        """Leave the process group (once; later calls do nothing)."""
        import torch.distributed as dist

        global _CURRENT
        if dist.is_initialized():
            dist.destroy_process_group()
        _CURRENT = None


_CURRENT: DataParallel | None = None


def start(device: torch.device) -> DataParallel:
    """Join torchrun's process group (once per process): gloo on the CPU, nccl on CUDA with
    ``cuda:LOCAL_RANK``. ``device`` is the run's device; its index is replaced by LOCAL_RANK."""
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    import torch.distributed as dist

    if not dist.is_available():
        raise AttnbenchError("this torch was built without torch.distributed: torchrun cannot run")
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise AttnbenchError(
            f"WORLD_SIZE > 1 but {', '.join(missing)} not set; start the command with torchrun"
        )
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", torchrun_world_size()))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise AttnbenchError(
            f"data-parallel training under torchrun runs on cpu or cuda, not {device.type}"
        )
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    _CURRENT = DataParallel(rank, dist.get_world_size(), local_rank, local_world, device)
    return _CURRENT
