"""A stand-in for Ray that runs each task in this process and records what it was asked (the
options of ``remote``, the waits, the cancellations), and tasks to run on it."""

from __future__ import annotations


class Ref:
    """A task's result, as Ray's object reference stands for it (hashable, by identity)."""

    def __init__(self, kind, value):
        self.kind, self.value = kind, value


class FakeRay:
    """Ray's calls as the runtime uses them, run in this process: ``remote`` records its options,
    ``get`` raises what the task raised."""

    def __init__(self):
        self.calls: list[tuple[dict, tuple]] = []
        self.cancelled: list[tuple[object, bool]] = []
        self.waited: list[float | None] = []

    def remote(self, **options):
        def wrap(fn):
            calls = self.calls

            class Task:
                def remote(self, *args):
                    calls.append((options, args))
                    try:
                        return Ref("value", fn(*args))
                    except Exception as e:
                        return Ref("error", e)

            return Task()

        return wrap

    def put(self, value):
        return value  # the tasks here get the value itself

    def wait(self, refs, num_returns, timeout=None):
        self.waited.append(timeout)
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.kind == "error":
            raise ref.value
        return ref.value

    def cancel(self, ref, force):
        self.cancelled.append((ref, force))


class WorkerCrashedError(Exception):
    pass


def flaky(name, attempt):
    if name == "crash-once" and attempt == 1:
        raise WorkerCrashedError("the worker died")
    if name == "always":
        raise RuntimeError(f"broken on attempt {attempt}\nsecond line")
    if name == "bad-result" and attempt == 1:
        return {"status": "failed", "reason": "sticky"}
    return {"status": "ok", "name": name, "attempt": attempt}


class StoppingRay(FakeRay):
    """While stopping (a wait with a timeout), only the tasks of ``finishing`` end in time."""

    def __init__(self, finishing):
        super().__init__()
        self.finishing = finishing

    def wait(self, refs, num_returns, timeout=None):
        if timeout is None:
            return super().wait(refs, num_returns)
        self.waited.append(timeout)
        ended = [r for r in refs if r.kind == "value" and r.value["name"] in self.finishing]
        return ended, [r for r in refs if r not in ended]
