"""The one exception type for bad input.

Library code raises :class:`AttnbenchError` (a ``ValueError``) with a one-line message that says
what was wrong and what is accepted. The CLI turns it into that line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib


class AttnbenchError(ValueError):
    """Bad input from a user: the message is one line, what was wrong and what is accepted."""


def unknown(what: str, name: str, known: list[str] | tuple[str, ...]) -> AttnbenchError:
    """An error for an unknown name that suggests the closest known ones."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    return AttnbenchError(f"unknown {what} {name!r}{hint}; known: {', '.join(known)}")
