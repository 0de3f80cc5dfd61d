"""The speed gate's runs into the results history (``attnbench gate --history DIR``): every grid
the gate ran, base and current, each under the commit its sidecar names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnbench.bench.history.store import History, runs_text
from attnbench.core.errors import AttnbenchError

Say = Callable[[str], None]

#: Modification times may be kept to the second (or two, on FAT): a run written this long before
#: the gate started still counts as the gate's.
MTIME_SLACK_S = 2.0


def gate_runs(out: Path, since: float) -> list[Path]:
    """The results folders the gate wrote at or after ``since`` (a time.time()): ``out`` and its
    siblings named after it (``out-rerun``, ``out-base1``, ``out-current2``...), in name order."""
    found = [out, *sorted(out.parent.glob(f"{out.name}-*"))]
    csv = [folder / "results.csv" for folder in found]
    # a file system may keep modification times to the second
    return [p.parent for p in csv if p.is_file() and p.stat().st_mtime >= since - MTIME_SLACK_S]


def feed(history: Path, folders: list[Path], say: Say, warn: Say) -> int:
    """Add ``folders`` to the history in ``history``; a run that cannot be added (uncommitted
    changes, no commit) is a warning. Returns how many runs were added."""
    added = 0
    with History(history, create=True) as store:
        for folder in folders:
            try:
                done = store.add(folder)
            except AttnbenchError as e:
                warn(f"warning: not added to the results history: {e}")
                continue
            added += not done.already
        total = runs_text(store.runs())
        say(f"results history {history}: {runs_text(added)} of this gate added ({total} in all)")
    return added
