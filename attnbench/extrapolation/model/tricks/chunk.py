"""``chunk``: each window is cut into independent L-token chunks, the sanity floor (what a model
that never looks beyond L scores). Done by the evaluator; the mixer itself is plain. Stands alone
in its row."""

from __future__ import annotations

from attnbench.extrapolation.model.tricks.base import Trick

TRICK = Trick("chunk", "independent L-chunks (sanity floor)", alone=True, chunked=True)
