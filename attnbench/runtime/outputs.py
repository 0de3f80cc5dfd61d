"""Writing results safely: folders that can be made (or a one-line reason why not), and files
written whole or not at all (a temporary name, then a rename; the temporary file removed when the
write fails, e.g. on a full disk).

A write that fails raises :class:`WriteFailed`, which names the file: the OS names none when a
disk fills up in the middle of a write (``[Errno 28] No space left on device`` alone). The
temporary names are :func:`private_name`'s; those a killed process left behind are removed by
:func:`remove_stale` (the next run does it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from attnbench.core.errors import AttnbenchError


class WriteFailed(AttnbenchError, OSError):
    """A file that could not be written, said in one line that names it (the CLI's error line,
    exit code 2). Also an OSError (``errno``, ``strerror``, ``filename``), as the error it
    replaces, so a caller catching OSError still catches it."""

    def __init__(self, message: str, errno: int | None = None, strerror: str | None = None,
                 filename: str | None = None) -> None:  # fmt: skip
        OSError.__init__(self, errno, strerror, filename)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # crosses from a worker process intact
        return (WriteFailed, (self.message, self.errno, self.strerror, self.filename))


def write_failed(
    path: Path | str, e: OSError, what: str = "", existed: bool = False
) -> WriteFailed:
    """``cannot write checkpoint runs/x/O-seed0.pt: No space left on device; the one there
    before is kept``: ``e`` as one line naming ``path`` (a WriteFailed is returned as it is)."""
    if isinstance(e, WriteFailed):
        return e
    reason = os_error_words(e)
    kept = "; the one there before is kept" if existed else ""
    message = f"cannot write {what + ' ' if what else ''}{path}: {reason}{kept}"
    return WriteFailed(message, e.errno, e.strerror, str(path))


def ensure_dir(path: Path | str, what: str = "output folder", create: bool = True) -> Path:
    """Make ``path`` (and its parents) or raise an AttnbenchError saying why it cannot be made:
    a parent that is a file, a folder without write permission, a read-only or full disk.
    ``create=False`` only checks, before any work, that it could be made."""
    path = Path(path)
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                where = "is" if ancestor == path else f"is under {ancestor}, which is"
                raise AttnbenchError(f"cannot use {path} as the {what}: it {where} a file")
            if not create and not os.access(ancestor, os.W_OK | os.X_OK):
                why = unwritable(ancestor)
                raise AttnbenchError(f"cannot create the {what} {path}: {ancestor} {why}")
            break
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AttnbenchError(f"cannot create the {what} {path}: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise AttnbenchError(f"cannot write into the {what} {path}: it {unwritable(path)}")
    return path


def os_error_words(e: OSError) -> str:
    """What went wrong in ``e``, in words that name the real trouble: for a folder that could not
    be made because a file is in the way (the OS says ``File exists`` or ``Not a directory``),
    which file; for a refused write, whether the file system is read-only; else the OS's words."""
    words = e.strerror or str(e) or type(e).__name__
    if e.filename is None:
        return words
    path = Path(os.fsdecode(e.filename))
    if e.errno in (errno.EEXIST, errno.ENOTDIR):
        in_the_way = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if in_the_way is not None:
            where = "it is" if in_the_way == path else f"{in_the_way} is"
            return f"{where} a file, not a folder"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        folder = next((p for p in (path, *path.parents) if p.is_dir()), None)
        if folder is not None and unwritable(folder).startswith("is on a read-only"):
            return f"{folder} is on a read-only file system"
    return words


def unwritable(folder: Path | str) -> str:
    """Why nothing can be written into ``folder``, as the end of a sentence about it: ``is on a
    read-only file system`` (a read-only mount: no permission would help) or ``is not writable
    by this user (permission denied)``."""
    with contextlib.suppress(OSError, AttributeError):  # no statvfs on Windows
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "is on a read-only file system"
    return "is not writable by this user (permission denied)"


def refuse_to_replace(
    targets: Iterable[Path | str],
    *,
    option: str,
    inputs: Iterable[Path | str] = (),
    overwrite: bool = False,
    folder: Path | str | None = None,
    instead: str = "",
) -> None:
    """The one rule of every command that writes, applied before it writes anything: refuse,
    in one line (an AttnbenchError: exit code 2 from the CLI), to write one of ``targets``

    * over one of ``inputs``, the files the command reads (``compare A B --markdown B``):
      always, ``overwrite`` or not; nothing a command writes is meant to replace what it reads;
    * over a file that is already there (results an earlier command made) unless
      ``overwrite`` (the command's ``--overwrite``): what the command itself made in this folder
      (a resumed run, a merge of the same sweep) is its caller's to allow, by passing
      ``overwrite``.

    ``option`` names where the targets come from (``--out``, ``--markdown``); ``folder``: the
    targets are files in that folder (said as ``--out X already holds a.csv, b.json``), else
    each target is the file the option names. ``instead``: the command's other ways on, said
    after ``--overwrite`` (``, or --resume to continue them``)."""
    targets, inputs = [Path(t) for t in targets], [Path(i) for i in inputs]
    for target in targets:
        for given in inputs:
            if _same_file(target, given):
                shown = target if folder is None else f"{folder} (its {target.name})"
                raise AttnbenchError(
                    f"{option} {shown} is the input {given}; writing there would replace what "
                    f"this command reads: choose another {'file' if folder is None else 'folder'}"
                )
    if overwrite:
        return
    there = [t for t in targets if t.exists() or t.is_symlink()]
    if not there:
        return
    if folder is None:
        raise AttnbenchError(
            f"{option} {there[0]} already exists; choose another file or pass --overwrite to "
            f"replace it{instead}"
        )
    names = ", ".join(_relative(t, Path(folder)) for t in there[:3])
    more = f" and {len(there) - 3} more" if len(there) > 3 else ""
    raise AttnbenchError(
        f"{option} {folder} already holds {names}{more}; choose another folder or pass "
        f"--overwrite to replace them{instead}"
    )


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (links and ``..`` followed; one that does not exist
    yet: the same absolute path)."""
    with contextlib.suppress(OSError):
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _relative(path: Path, folder: Path) -> str:
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return str(path)


def private_name(name: str) -> str:
    """``.NAME.HOST.PID.RANDOM.tmp``: a temporary name no other process, on this node or
    another one sharing the folder, can pick (shards of one run write into one folder). HOST has
    its dots as underscores, so that one host's names never match another's whose name ends
    like it (``n1.hpc.org`` and ``hpc.org``: see :func:`remove_stale`)."""
    return f".{name}.{_host()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def _host() -> str:
    return socket.gethostname().replace(".", "_")


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "w", *, what: str = "", **kwargs) -> Iterator[IO]:
    """Open a private temporary file beside ``path`` (:func:`private_name`) for writing and
    rename it to ``path`` when the block ends without an error; on an error (a full disk, Ctrl-C)
    the temporary file is removed and ``path`` is left as it was. An OSError becomes a
    :class:`WriteFailed` naming ``path`` (``what`` it is: "checkpoint", say)."""
    path = Path(path)
    tmp = path.with_name(private_name(path.name))
    try:
        try:
            with open(tmp, mode, **kwargs) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            raise write_failed(path, e, what, path.exists()) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


@contextlib.contextmanager
def atomic_path(path: Path | str, what: str = "") -> Iterator[Path]:
    """A private temporary name beside ``path``, for a writer that wants a file name rather than
    an open file (``savefig``): renamed to ``path`` when the block ends without an error; on
    an error the temporary file is removed and ``path`` is left as it was, and an OSError
    becomes a :class:`WriteFailed` naming ``path``. The writer owns the file, so there is no
    fsync here (``atomic_open`` has one)."""
    path = Path(path)
    tmp = path.with_name(private_name(path.name))
    try:
        try:
            yield tmp
            os.replace(tmp, path)
        except OSError as e:
            raise write_failed(path, e, what, path.exists()) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def save_figure(fig: Any, path: Path | str, **kwargs: Any) -> None:
    """``fig.savefig`` whole or not at all (a full disk leaves no truncated image); the format
    is ``path``'s suffix, as savefig would take it from the final name."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    with atomic_path(path, "figure") as tmp:
        fig.savefig(tmp, **kwargs)


def write_csv(frame: Any, path: Path | str, **kwargs: Any) -> None:
    """``frame.to_csv(path, **kwargs)`` (a pandas DataFrame) whole or not at all."""
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        frame.to_csv(f, **kwargs)


def write_bytes_once(path: Path | str, data: bytes | None) -> None:
    """Write ``data`` at ``path`` whole or not at all, unless the file there already holds it
    (None: nothing to write). Makes the folder."""
    path = Path(path)
    if data is None or (path.exists() and path.read_bytes() == data):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        f.write(data)


def _stale_pattern(host: str) -> re.Pattern[str]:
    """:func:`private_name`'s names made on ``host``: ``.NAME.HOST.PID.RANDOM.tmp``."""
    return re.compile(rf"\..+\.{re.escape(host)}\.(\d+)\.[0-9a-f]{{8}}\.tmp")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs. Containers that share a host name but not a
    PID namespace see each other's processes as dead: give them distinct host names."""
    if os.name == "nt":  # os.kill(pid, 0) would terminate it there: never call one stale
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale(folder: Path | str) -> list[Path]:
    """Remove the temporary files and staging folders (:func:`private_name`) in ``folder``
    that a process of this host left when it was killed (SIGKILL, a power cut, a killed
    parent): those whose process no longer runs. Another host's, and a running process's, are
    left alone (shards share folders). Returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern, removed = _stale_pattern(_host()), []
    for entry in folder.iterdir():
        found = pattern.fullmatch(entry.name)
        if found is None or int(found.group(1)) == os.getpid() or _alive(int(found.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        if not entry.exists():
            removed.append(entry)
    return removed
