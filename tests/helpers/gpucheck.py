"""Fake test workers for ``attnbench gpu-check``'s runner (:mod:`attnbench.gpucheck.testrun`):
each "runs" its chunk of node ids in-process, writing the events a real worker's plugin would."""

from __future__ import annotations

import time

from attnbench.gpucheck import testrun


def ids(n: int) -> list[str]:
    return [f"tests/kernels/test_x.py::test_k[{i}]" for i in range(n)]


class FakeWorker:
    """A worker that runs its chunk when first polled, as ``script`` says for each node id:
    an outcome, ``hang`` (started, then killed by the per-test limit), or ``busy`` (still
    running until interrupted)."""

    def __init__(self, chunk, events, junit, script) -> None:
        self.chunk, self.events, self.junit, self.script = chunk, events, junit, script
        self.code: int | None = None
        self.interrupted = False

    def _run(self) -> int | None:
        for nodeid in self.chunk:
            what = self.script.get(nodeid, "passed")
            if what == "busy" and not self.interrupted:
                return None
            began = time.time() - (1000 if what == "hang" else 0)
            testrun.append_event(self.events, {"event": "start", "nodeid": nodeid, "time": began})
            if what in ("hang", "busy"):
                return 1
            testrun.append_event(self.events, {"event": "end", "nodeid": nodeid, "outcome": what})
        return 0

    def poll(self) -> int | None:
        if self.code is None:
            self.code = self._run()
        return self.code

    def interrupt(self) -> None:
        self.interrupted = True

    def kill(self) -> None:
        self.code = -9


class FakeLauncher:
    def __init__(self, script=None) -> None:
        self.script = script or {}
        self.started: list[list[str]] = []
        self.most = 0
        self.workers: list[FakeWorker] = []

    def start(self, stage, chunk, events, junit, log):
        self.started.append(list(chunk))
        worker = FakeWorker(chunk, events, junit, self.script)
        self.workers.append(worker)
        self.most = max(self.most, sum(1 for w in self.workers if w.code is None))
        return worker
