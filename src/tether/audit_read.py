"""The spawn-audit log's reader: every record back, oldest first, across
every rotated copy, in bounded memory, whatever the files hold.

Split from :mod:`tether.audit`, which keeps what a writer needs (the writer,
the file names and the line splitting both sides use; the state directory's
rules are :mod:`tether.statedir`'s, the record fields
:mod:`tether.audit_fields`'). A program that only writes the log (tether-shell,
a job) never loads this module; ``tether.audit`` still offers these names
(``audit.read_records``), importing this module on first use.

Reading. :func:`iter_records` / :func:`read_records` stream every rotated
copy oldest first, then the live file, in bounded memory (256 KiB blocks plus
at most ``max_line`` of carry). They skip and count lines that are not JSON,
non-object lines, lines longer than ``max_line`` (never held whole in memory)
and a last line without its newline (torn by a crash or still being written).
A torn fragment glued to the start of a good record is cut off and the record
kept. Records of a newer schema are yielded as they are.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .audit import (
    _LOCK_TRIES,
    _O_BINARY,
    _O_CLOEXEC,
    _O_NOFOLLOW,
    _O_NONBLOCK,
    DEFAULT_FILENAME,
    MAX_LINE,
    SCHEMA_VERSION,
    _line_blocks,
    _rotated,
    check_dir,
    file_refusal,
)

if TYPE_CHECKING:  # annotations only
    from collections.abc import Iterator
    from typing import Any

__all__ = ["ReadStats", "iter_records", "read_records", "log_files"]


class ReadStats:
    """Counts filled by :func:`read_records`."""

    __slots__ = (
        "files",  # log files read
        "lines",  # non-empty lines seen (records + skipped)
        "records",  # objects yielded
        "corrupt",  # not JSON, or JSON but not an object
        "truncated",  # last line of a file without its newline
        "too_long",  # longer than max_line, skipped unread
        "newer",  # yielded records with v > SCHEMA_VERSION
        "refused_files",  # not a regular file, not ours, writable by others, a link
        "refusals",  # "name: why" for each refused file (not a count)
    )
    files: int
    lines: int
    records: int
    corrupt: int
    truncated: int
    too_long: int
    newer: int
    refused_files: int
    refusals: list[str]

    def __init__(self, **counts: int) -> None:
        for name in self.__slots__:
            setattr(self, name, counts.pop(name, [] if name == "refusals" else 0))
        if counts:
            raise TypeError(f"unknown ReadStats fields: {sorted(counts)}")

    def refused(self, name: str, why: str) -> None:
        """Count one refused file, and say why."""
        self.refused_files += 1
        self.refusals.append(f"{name}: {why}")

    def as_dict(self) -> dict[str, Any]:
        return {name: (list(getattr(self, name)) if name == "refusals" else getattr(self, name))
                for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReadStats):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        return f"ReadStats({inner})"


def log_files(state_dir: str | os.PathLike[str], *, filename: str = DEFAULT_FILENAME) -> list[Path]:
    """The log files that exist, oldest first (rotated copies, then the live file)."""
    d = Path(state_dir)
    try:
        names = os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        return []
    files = [d / name for _, name in _rotated(names, filename)]
    if filename in names:
        files.append(d / filename)
    return files


def iter_records(
    state_dir: str | os.PathLike[str],
    *,
    filename: str = DEFAULT_FILENAME,
    max_line: int = MAX_LINE,
) -> Iterator[dict[str, Any]]:
    """Every record, oldest first, across every rotated copy; see :func:`read_records`."""
    return read_records(state_dir, filename=filename, max_line=max_line)


def read_records(
    state_dir: str | os.PathLike[str],
    *,
    filename: str = DEFAULT_FILENAME,
    max_line: int = MAX_LINE,
    stats: ReadStats | None = None,
    since: float | None = None,
) -> Iterator[dict[str, Any]]:
    """Like :func:`iter_records`, counting what it read and skipped in *stats*.
    ``since`` (a ``time.time()``): skip the rotated copies last written before
    it - none of them holds a record written since (a bounded read of what a
    run that began then wrote).

    The directory is checked now (not at the first ``next()``): an unsafe one
    raises :class:`AuditDirError`; a missing one yields nothing. All files are
    opened up front, under a shared lock when the lock file exists, so a
    rotation while reading neither hides nor repeats a file.
    """
    d = Path(state_dir)
    try:
        check_dir(d, create=False)
    except (FileNotFoundError, NotADirectoryError):
        return iter(())
    st = stats if stats is not None else ReadStats()
    fds = _open_all(d, filename, st, since)
    return _records(fds, max_line, st)


def _open_all(d: Path, filename: str, st: ReadStats, since: float | None = None) -> list[int]:
    lock = -1
    try:
        import fcntl

        try:
            lock = os.open(d / (filename + ".lock"),
                           os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW | _O_NONBLOCK)
        except OSError:
            lock = -1
        if lock >= 0 and file_refusal(os.fstat(lock), lock) is not None:
            st.refused(f"{filename}.lock", file_refusal(os.fstat(lock), lock) or "")
            os.close(lock)  # a FIFO or a hostile file: read without the shared lock
            lock = -1
        if lock >= 0:
            for _ in range(_LOCK_TRIES):
                try:
                    fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.005)
            # Not locked after ~50 ms: read anyway, a rotation may shift a file.
    except ImportError:
        pass
    fds: list[int] = []
    seen: set[tuple[int, int]] = set()
    try:
        for path in log_files(d, filename=filename):
            try:
                fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW | _O_BINARY
                             | _O_NONBLOCK)
            except FileNotFoundError:
                continue  # rotated away since the listing
            except OSError as e:
                st.refused(path.name, e.strerror or str(e))  # a symlink (ELOOP), unreadable
                continue
            fst = os.fstat(fd)
            why = file_refusal(fst, fd)
            if why is not None:
                os.close(fd)
                st.refused(path.name, why)
                continue
            if (fst.st_dev, fst.st_ino) in seen or (
                    since is not None and fst.st_mtime < since and path.name != filename):
                # Listed under two names by a rotation we could not lock out;
                # or older than what the caller asked for.
                os.close(fd)
                continue
            seen.add((fst.st_dev, fst.st_ino))
            fds.append(fd)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        if lock >= 0:
            os.close(lock)
    return fds


def _records(fds: list[int], max_line: int, st: ReadStats) -> Iterator[dict[str, Any]]:
    from .records import record_of

    def corrupt() -> None:
        st.corrupt += 1

    try:
        for i, fd in enumerate(fds):
            st.files += 1
            with open(fd, "rb", buffering=0, closefd=True) as f:
                fds[i] = -1
                for whole in _line_blocks(f.read, max_line, st):
                    for line in whole.split(b"\n"):
                        if not line.strip():
                            continue
                        st.lines += 1
                        if len(line) > max_line:
                            st.too_long += 1
                            continue
                        obj = record_of(line, corrupt)
                        if obj is not None:
                            st.records += 1
                            v = obj.get("v")
                            if type(v) is int and v > SCHEMA_VERSION:
                                st.newer += 1
                            yield obj
    finally:
        for fd in fds:
            if fd >= 0:
                os.close(fd)
