"""Paths backed by other projects' packages: the kernels people use, in the registry beside ours.

Each module here adapts one library to the definitions of the mechanisms it implements (scale,
window, layout, padding) so that its path computes exactly the mechanism's reference and is
tested against it like any other path. The package is an optional extra (``pip install
"attnbench[local]"``); without it the path is listed with the reason it cannot run
(:data:`attnbench.core.capabilities.PACKAGES`), never an import error. A library is imported
only when its path is called.
"""
