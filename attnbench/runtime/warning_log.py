"""Warnings of torch and the kernel libraries kept out of the terminal, in a file of the run.

A first GPU run printed a screen of torch ``UserWarning``s before its first row (SDPA backends
refusing a call, TF32 notices, compile notes), and a sweep's progress lines scrolled away
between them. While a :class:`WarningLog` is active, every Python warning (``warnings.warn``,
torch's C++ ``TORCH_WARN`` included: torch turns them into Python warnings) and every record that
torch's loggers, the root logger or ``logging.lastResort`` (a library's ``logger.warning`` with
no handler of its own) would print is written to its file instead, and counted. attnbench's own
messages (the ``attnbench`` logger) still show. Python's warning filters are unchanged: a
warning shown once per place is logged once per place.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import IO, Any

#: How many distinct warnings a summary lists.
TOP_KINDS = 10
#: Loggers whose stream handler never prints: torch's structured trace (``torch.__trace``,
#: DEBUG records for tlparse, written to files only when TORCH_TRACE is set; torch.profiler and
#: torch.compile emit them by the thousand).
NEVER_PRINTED = ("torch.__trace",)


class _Swallow(logging.Filter):
    """A handler filter that hands each record to the log and stops it there."""

    def __init__(self, log: WarningLog) -> None:
        super().__init__()
        self.log = log

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "attnbench" or record.name.startswith("attnbench."):
            return True  # attnbench's own messages (through the root logger) still show
        if record.name in NEVER_PRINTED:
            return True  # left to the handler, as without the log
        self.log.record(record)
        return False


class _ToLog(logging.Handler):
    """Stands in for ``logging.lastResort`` while the log is active."""

    def __init__(self, log: WarningLog) -> None:
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log.record(record)


def _console_handlers(prefix: str = "torch") -> list[logging.Handler]:
    """The handlers that print (stream handlers, not files) on the loggers ``prefix`` and below,
    and on the root logger (a program that called ``logging.basicConfig``)."""
    loggers = [logging.getLogger()]
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and (name == prefix or name.startswith(prefix + ".")):
            loggers.append(logger)
    return [
        handler
        for logger in loggers
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
    ]


class WarningLog:
    """Context manager: warnings into ``path`` (created on the first one), counted by kind."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self.kinds: Counter[str] = Counter()
        self._file: IO[str] | None = None
        self._catch: Any = None
        self._filtered: list[logging.Handler] = []
        self._last_resort: logging.Handler | None = None
        self._swallow = _Swallow(self)
        self._last_record: logging.LogRecord | None = None

    def write(self, text: str, kind: str) -> None:
        """One warning: appended to the file, counted under ``kind``'s first line."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(text.rstrip("\n") + "\n")
        self._file.flush()
        self.count += 1
        self.kinds[kind] += 1

    def record(self, record: logging.LogRecord) -> None:
        """A log record, as one warning (once, however many handlers it reaches)."""
        if record is self._last_record:
            return
        self._last_record = record
        message = record.getMessage()
        first = (message.strip().splitlines() or [""])[0][:160]
        self.write(f"{record.levelname} {record.name}: {message}", f"{record.name}: {first}")

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        first = (str(message).strip().splitlines() or [""])[0][:160]
        self.write(text, f"{category.__name__}: {first}")

    def __enter__(self) -> WarningLog:
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.showwarning = self._show
        self._filtered = _console_handlers()
        for handler in self._filtered:
            handler.addFilter(self._swallow)
        self._last_resort = logging.lastResort
        logging.lastResort = _ToLog(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        logging.lastResort = self._last_resort
        for handler in self._filtered:
            handler.removeFilter(self._swallow)
        self._catch.__exit__(kind, value, traceback)
        if self._file is not None:
            self._file.close()
            self._file = None

    def summary(self) -> dict[str, Any]:
        """For a sidecar: the count, the file's name, the most frequent kinds."""
        return {
            "count": self.count,
            "file": self.path.name if self.count else None,
            "kinds": [{"warning": k, "count": n} for k, n in self.kinds.most_common(TOP_KINDS)],
        }
