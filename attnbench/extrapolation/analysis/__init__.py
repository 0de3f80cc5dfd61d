"""Analysis: the tables, figures and statistics of a run's rows, the long-range report and the
entropy theory."""
