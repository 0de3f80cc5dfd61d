"""What every token-mixing layer is built from, below the registry: rotary position embedding and
the check that a layer's path runs on the device of its input. Layers in ``attnbench/variants/``
import these; they never import the registry (the record of their mechanism is handed to them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism, PathSpec


class Rotary(nn.Module):
    """Rotary position embedding (Su et al., RoFormer) for ``[B, H, T, D]`` tensors.

    Rotates the pairs (x[..., i], x[..., i + D/2]) by angle ``position * position_scale *
    base^(-2i/D)``. ``position_scale < 1`` is position interpolation; a larger ``base`` is the
    NTK-aware trick. Both are evaluation-time knobs of the extrapolation suite.
    """

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        position_scale: float = 1.0,
        freq_scale: Tensor | None = None,
    ):
        super().__init__()
        if dim % 2:
            raise AttnbenchError(f"rotary embedding needs an even head dim, got {dim}")
        self.dim, self.base, self.position_scale = dim, base, position_scale
        #: A factor per frequency [D/2] (YaRN's interpolation by parts), None for 1.
        self.freq_scale = freq_scale
        self._cache: dict[tuple, tuple[Tensor, Tensor]] = {}

    def inv_freq(self, device: torch.device | str = "cpu") -> Tensor:
        """base^(-2i/D) for the D/2 pairs, float64, times ``freq_scale`` when given."""
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float64, device=device)
        inv_freq = self.base ** (-exponents / self.dim)
        if self.freq_scale is not None:
            inv_freq = inv_freq * self.freq_scale.to(device, torch.float64)
        return inv_freq

    def angles(self, positions: Tensor) -> Tensor:
        """Angles [T, D/2] for float positions [T]."""
        inv_freq = self.inv_freq(positions.device)  # (D/2,)
        return (positions.to(torch.float64) * self.position_scale)[:, None] * inv_freq[None, :]

    def _cos_sin(self, t: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        key = (t, device, dtype)
        if key not in self._cache:
            ang = self.angles(torch.arange(t))
            self._cache[key] = (ang.cos().to(device, dtype), ang.sin().to(device, dtype))
        return self._cache[key]

    def _cos_sin_at(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin at explicit positions [T] -> [T, D/2], or [B, T] -> [B, 1, T, D/2] (one
        row per window, the same for every head); not cached (they change every step)."""
        flat = self.angles(positions.reshape(-1))  # (B*T, D/2) float64
        ang = flat.view(*positions.shape, self.dim // 2)  # (T, D/2) or (B, T, D/2)
        if positions.dim() == 2:
            ang = ang[:, None]  # (B, 1, T, D/2): broadcast over the heads
        return ang.cos().to(dtype), ang.sin().to(dtype)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x [B, H, T, D] rotated at positions 0..T-1 (None), or at ``positions`` [T] or [B, T]
        (integer or float, on x's device): the randomized positions of Ruoss et al. 2023."""
        if positions is None:
            cos, sin = self._cos_sin(x.shape[-2], x.device, x.dtype)  # (T, D/2)
        else:
            cos, sin = self._cos_sin_at(positions, x.dtype)  # (T, D/2) or (B, 1, T, D/2)
        x1, x2 = x[..., : self.dim // 2], x[..., self.dim // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class DeviceCheck:
    """A layer's check, on its first input per (device, grad mode), that its path runs there."""

    def __init__(self, mech: Mechanism, path: PathSpec):
        self.mech, self.path = mech, path
        self._checked: set[tuple[str, bool]] = set()

    def __call__(self, x: Tensor) -> None:
        key = (str(x.device), torch.is_grad_enabled())
        if key not in self._checked:
            self.mech.require(self.path, device=x.device, backward=torch.is_grad_enabled())
            self._checked.add(key)
