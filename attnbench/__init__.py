"""attnbench: correctness, speed, memory and length extrapolation of attention mechanisms.

Library entry points: :func:`attnbench.api.attention` (call any registered mechanism on
``[B, H, T, D]`` tensors), :mod:`attnbench.registry` (what exists),
:func:`attnbench.layers.make_layer` (a mechanism as an x ``[B, T, C]`` -> ``[B, T, C]`` layer).
"""

__version__ = "0.1.0"
