"""Settings of the whole test run.

``pytest`` runs the tests in parallel, one worker process per core (pytest-xdist, ``-n auto`` in
the project's pytest settings). Each worker gets its share of the cores as torch threads, so two
workers on two cores do not each spin two threads. Tests that start process groups of their own
(a local Ray cluster, torchrun's workers, the stop-and-kill tests that signal whole groups) run
one after another on one worker (``--dist loadgroup`` and the ``processes`` group): two Ray
clusters or two torchrun rendezvous at once would only fight over ports and cores.
"""

from __future__ import annotations

import os

import pytest

#: (test file, a part of the test's name; "" for every test of the file) that start process
#: groups of their own.
PROCESS_GROUPS = (
    ("tests/bench/test_units.py", "test_ray_"),
    ("tests/extrapolation/test_extrapolate_units.py", "test_ray_"),
    ("tests/extrapolation/test_torchrun.py", ""),
    ("tests/runtime/test_stop_and_kill.py", ""),
)


def _worker_threads() -> int | None:
    """The torch threads of this xdist worker: its share of the usable cores (None outside
    xdist)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return None
    from attnbench.measure import machine

    return max(1, machine.usable_cores() // max(1, int(workers)))


def pytest_configure(config: pytest.Config) -> None:
    threads = _worker_threads()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if any(path == f and part in item.name for f, part in PROCESS_GROUPS):
            item.add_marker(pytest.mark.xdist_group("processes"))
