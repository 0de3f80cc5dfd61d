"""``attnbench gpu-check``: what a fresh GPU machine runs, in one command of under ten minutes,
without a network: the environment record, the GPU tests, then the default GPU suite.

* :mod:`~attnbench.gpucheck.environment`: the machine, versions, caches and SDPA backends, as
  ``OUT/env.json``;
* :mod:`~attnbench.gpucheck.testrun`: the tests marked ``gpu`` (pytest markers choose them, in
  stages: attnbench's kernels, then the library-backed paths), in parallel pytest processes
  with a per-test time limit, each test's outcome written to disk as it ends, so the next run
  starts where this one stopped; the JUnit XML and every worker's log kept
  (:mod:`~attnbench.gpucheck.pytest_plugin` is loaded into each worker);
* :mod:`~attnbench.gpucheck.speedstage`: the speed suites (the default GPU suite, then any
  ``gpu/`` suite asked for), each ``attnbench run speed`` continued with ``--resume`` when a
  run of this machine and code was stopped;
* :mod:`~attnbench.gpucheck.check`: the three in order, within the command's time budget.
"""
