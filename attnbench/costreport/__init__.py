"""``attnbench report``: accuracy beyond the training length against what it costs (issue 36).

The extrapolation experiment (``run extrapolate``) says how well a row predicts at length n; the
speed experiment (``run speed``) says how long one attention call of a registry path takes at n
and how much memory it holds. This package joins the two:

- :mod:`~attnbench.costreport.mapping`: the table that says which registry path (mechanism,
  path, parameters) computes each extrapolation row's attention, with a one-line reason;
- :mod:`~attnbench.costreport.tables`: the two folders read and checked (one-line errors);
- :mod:`~attnbench.costreport.join`: accuracy over seeds (mean and 95 % t-interval) beside the
  cost per token at the same n, the Pareto front, the shape mismatches and every row that could
  not be joined, with why;
- :mod:`~attnbench.costreport.figure` and :mod:`~attnbench.costreport.write`: the figure, the
  joined CSV and ``report.md``.
"""

from __future__ import annotations
