"""The extrapolation experiment as it runs: its settings and presets (:mod:`.config`), what a run
reads and decides before any work (:mod:`.plan`), the run itself (:mod:`.run`: trainings, then
evaluations, then results), its units, and the ``run entropy`` command."""
