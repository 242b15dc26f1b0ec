"""The spawn-audit log: JSON Lines, one record per event, rotated by size,
kept by count and age, read back across every rotated copy.

A leaf module: standard library only (plus ``tether.errors``, and the two
leaves split from it: :mod:`tether.statedir`, where the log lives and which
directories and files are refused, and :mod:`tether.audit_fields`). Nothing
here is imported by tether unless the audit is turned on.

Files (in the state directory, default :func:`default_state_dir`)::

    audit.jsonl        the live file, appended to by every writer
    audit.jsonl.1      the previous one ... audit.jsonl.N (oldest)
    audit.jsonl.lock   flock'ed only while rotating (writers) or opening (readers)

Records. One JSON object per line; ``v`` (``SCHEMA_VERSION``), ``ts`` and
``event`` always, the rest only where known. The schema, and the builders of
a record's fields (:func:`new_run_id`, :func:`owner_fields`,
:func:`spawn_fields`), are in :mod:`tether.audit_fields`. Metadata only: no
argv unless the caller asks for it for one spawn (``record_argv=``).

Writing. :meth:`AuditWriter.write` encodes one line and hands it to ONE
``os.write`` on an ``O_APPEND | O_CLOEXEC`` descriptor. On a local regular
file (Linux ext4, xfs, btrfs, tmpfs, overlayfs) the kernel appends the whole
buffer under the inode lock, so lines of concurrent writer processes are never
torn or interleaved, whatever their length (PIPE_BUF only concerns pipes).
Network file systems (NFS) and Windows do not promise this. There is no fsync:
a process crash loses nothing (the data is in the kernel), a power loss may
lose the last records.

Rotation. Before each write the writer ``stat``s the live name. If it is
another file than the one open (someone else rotated) the writer reopens; if
the line would take it past ``max_bytes`` the writer takes a non-blocking
``flock`` on the lock file, checks again, renames ``.N -> .N+1 ... -> .2``,
live ``-> .1``, prunes copies beyond ``keep_files`` or older than
``keep_days`` and reopens.

Pruning never throws away proof. Before a copy is deleted, every record in it
that still proves a process that may be alive - a ``spawn`` whose process
(pid + start ticks + boot id) still runs, a ``job-open`` whose keeper still
runs or whose cgroup still exists, the ``run-start`` and last ``tasks`` record
of a run whose owner still runs or whose tasks' processes do
(``tether.records.still_needed``) - is appended to the live file, marked
``"carried": true`` (readers take a carried record as older than every record
that is not: it fills in, never overrides). The copy is deleted only once that
write succeeded. A rotation carries at most ``max_bytes // 2`` bytes; what
does not fit is dropped and an ``error`` record ``{"error":
"audit-carry-loss", "lost": N, "runs": [...]}`` says so (the reaper reports
it). The carry counts toward the live file's ``max_bytes``, so the log's
hard cap on total bytes is ``(keep_files + 1.5) * max_bytes`` (the half: one
carry appended by a writer's first prune before the live file rotates; plus
the lines of writers that raced a rotation) - 27.5 MiB with the defaults. A writer that cannot get the lock within ~50 ms
writes to the live file anyway (it grows a little past ``max_bytes``) rather
than wait on a stopped process. A writer that wrote just before a rotation
lands its line at the end of ``.1``: nothing is lost, nothing reordered within
a file.

Trouble. ``write`` never raises for I/O trouble (read-only or vanished
directory, ENOSPC, EACCES, ...): it returns ``False`` and reports the loss
ONCE per writer, through ``on_loss(message)`` or one stderr line
``tether: audit log disabled: <reason>``. While broken, writes are cheap
no-ops that return ``False``; every ``retry_interval`` seconds (default 5) one
write tries again (reopening the directory by path). A ``run-start`` or
``job-open`` record (:data:`KEEP_EVENTS`: the owner, the job's cookie and
keeper, which nothing else records) that could not be written is not lost: the
writer keeps it in memory (up to :data:`MAX_PENDING`) and writes it, marked
``"late": true`` with its own ``ts``, on the next write that works, or at
``close()``; while it keeps one, every write tries (no ``retry_interval``).
When a retry succeeds the writer first appends an ``error`` record
``{"error": "audit-gap", "lost": N, "runs": [...], "kept": K}`` (``lost``
records gone for good, of those runs; ``kept`` late records that follow it),
so readers (the reaper) know records are missing. An insecure directory
(symlink, other owner, group/other-writable) is not I/O trouble: the
constructor raises :class:`AuditDirError`; found later on a retry, it counts as
a loss.

Reading. The reader (:func:`iter_records`, :func:`read_records`,
:func:`log_files`, :class:`ReadStats`) lives in :mod:`tether.audit_read`
and is importable from here too, loaded on first use: a writer never loads it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from .audit_fields import EVENTS, SCHEMA_VERSION, new_run_id, owner_fields, spawn_fields
from .statedir import (
    _DIR_FD,
    _O_BINARY,
    _O_CLOEXEC,
    _O_NOFOLLOW,
    _O_NONBLOCK,
    _WINDOWS,
    AuditDirError,
    _open_dir,
    check_dir,
    default_state_dir,
    file_refusal,
    resolve_state_dir,
    state_dir_arg,
)

if TYPE_CHECKING:  # annotations only: typing and dataclasses cost start-up time
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

    from .audit_read import ReadStats, iter_records, log_files, read_records

__all__ = [
    "SCHEMA_VERSION",
    "EVENTS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_KEEP_FILES",
    "DEFAULT_KEEP_DAYS",
    "MAX_LINE",
    "AuditDirError",
    "AuditWriter",
    "ReadStats",
    "default_state_dir",
    "state_dir_arg",
    "check_dir",
    "iter_records",
    "read_records",
    "log_files",
    "new_run_id",
    "owner_fields",
    "spawn_fields",
]

#: Records a failed write keeps in memory and writes first on the next write
#: that works (or at close): they hold what proves a job's processes later
#: (the owner, the job's cookie and keeper), which nothing else records.
KEEP_EVENTS = frozenset(("run-start", "job-open"))
MAX_PENDING = 256  # kept records per writer; past that they count as lost
MAX_GAP_RUNS = 64  # run ids an audit-gap record names

from . import _constants  # noqa: E402 - shared with shell.c

DEFAULT_FILENAME = _constants.AUDIT_FILE
#: Seconds after a prune (the lock file's mtime) when the native tether-shell,
#: which never prunes, hands its start to the Python one, whose writer does.
PRUNE_EVERY = _constants.AUDIT_PRUNE_EVERY
DEFAULT_MAX_BYTES = _constants.AUDIT_MAX_BYTES

DEFAULT_KEEP_FILES = 5
DEFAULT_KEEP_DAYS = 14
# The longest line a reader accepts, and so the longest line a writer writes.
MAX_LINE = 64 * 1024

_READ_BLOCK = 256 * 1024
_LOCK_TRIES = 10  # x 5 ms: a rotation never waits long on a stopped process


# --------------------------------------------------------------------------
# writing

_WRITERS: weakref.WeakSet[AuditWriter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A fork while another thread held a writer's lock would deadlock the
    # child's first write; the child starts with fresh locks.
    for w in list(_WRITERS):
        w._lock = threading.Lock()
        w._pending = []  # the parent's to write: a copy here would write them twice


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_encoder: Callable[[Any], str] | None = None


def _encode(rec: Mapping[str, Any]) -> bytes:
    global _encoder
    if _encoder is None:
        import json

        # One encoder for all records (json.dumps with options builds a new
        # one per call). ensure_ascii: any str, lone surrogates included,
        # encodes; default=str: an odd value never costs the record.
        _encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=str).encode
    return (_encoder(rec) + "\n").encode("ascii")


class AuditWriter:
    """Appends records to ``<state_dir>/<filename>``; see the module doc.

    Thread-safe and fork-safe; several processes may write the same log.
    Raises :class:`AuditDirError` at construction for an unsafe directory;
    every later problem is reported once and turns writes into ``False``.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        filename: str = DEFAULT_FILENAME,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keep_files: int = DEFAULT_KEEP_FILES,
        keep_days: float | None = DEFAULT_KEEP_DAYS,
        on_loss: Callable[[str], Any] | None = None,
        retry_interval: float = 5.0,
        max_line: int = MAX_LINE,
    ) -> None:
        if keep_files < 1:
            raise ValueError("keep_files must be >= 1")
        if keep_days is not None and keep_days <= 0:
            raise ValueError("keep_days must be > 0 or None")
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if not filename or os.sep in filename or (os.altsep and os.altsep in filename):
            raise ValueError(f"bad audit filename {filename!r}")
        # resolved once: a reopen after a later chdir must find the same place
        self.state_dir = resolve_state_dir(state_dir)
        self.filename = filename
        self.max_bytes = int(max_bytes)
        self.keep_files = int(keep_files)
        self.keep_days = keep_days
        self.on_loss = on_loss
        self.retry_interval = float(retry_interval)
        self.max_line = int(max_line)
        self.lost = 0  # records not written since the writer was created
        self.reason: str | None = None  # why the log is broken now, or None
        self._lock = threading.Lock()
        self._dfd = -1
        self._fd = -1
        self._ino: tuple[int, int] | None = None
        self._dev_n = self._ino_n = -1
        self._retry_at = 0.0
        self._reported = False
        self._gap = 0  # records lost since the last successful write
        self._gap_runs: set[str] = set()  # the runs those lost records were of (bounded)
        # Records that hold proof (KEEP_EVENTS) a failed write could not land:
        # kept, and written first by the next write that works (or by close()).
        self._pending: list[bytes] = []
        self._torn = False  # a short write left a partial line behind
        self._closed = False
        self._pruned = False
        self._dir_ready = False
        try:
            check_dir(self.state_dir, create=True)
        except AuditDirError:
            raise
        except OSError as e:
            # Not fatal: reported on the first write, which retries.
            self.reason = _why(e, self.state_dir)
        _WRITERS.add(self)

    # -- paths relative to the directory fd (or plain paths on Windows)
    def _p(self, name: str) -> str:
        return name if _DIR_FD else os.path.join(self.state_dir, name)

    def _kw(self) -> dict[str, int]:
        return {"dir_fd": self._dfd} if _DIR_FD else {}

    @property
    def path(self) -> Path:
        return self.state_dir / self.filename

    @property
    def ok(self) -> bool:
        """False while the log is broken (after a failed write, before a retry works)."""
        return self.reason is None

    def write(self, event: str, **fields: Any) -> bool:
        """Append one record; True when it reached the file. Never raises for I/O."""
        if event not in EVENTS:
            raise ValueError(f"unknown audit event {event!r}; one of {EVENTS}")
        rec: dict[str, Any] = {"v": SCHEMA_VERSION, "ts": time.time(), "event": event}
        fields.pop("v", None)
        rec.update(fields)
        line = _encode(rec)
        if len(line) > self.max_line:
            line = self._shrink(rec, len(line))
        with self._lock:
            if (self._fd >= 0 and self.reason is None and _DIR_FD and not self._gap
                    and not self._pending):
                # Fast path: the open file is still the live one, and the line fits.
                try:
                    st = os.stat(self.filename, dir_fd=self._dfd, follow_symlinks=False)
                    if (
                        st.st_ino == self._ino_n
                        and st.st_dev == self._dev_n
                        and st.st_size + len(line) <= self.max_bytes
                    ):
                        self._write_all(line)
                        return True
                except FileNotFoundError:
                    pass  # rotated away: the slow path reopens
                except OSError as e:
                    self._fail(_why(e, self.state_dir), rec)
                    return False
            if self._closed:
                return False
            if self._fd < 0 or self.reason is not None:
                # Kept records (a job's cookie) are worth a try at every write.
                if time.monotonic() < self._retry_at and not self._pending:
                    self._lose(rec)
                    return False
            try:
                self._append(line)
            except OSError as e:
                self._fail(_why(e, self.state_dir), rec)
                return False
            except AuditDirError as e:
                self._fail(str(e), rec)
                return False
            return True

    def _lose(self, rec: dict[str, Any]) -> None:
        """A record that did not reach the file: kept for the next write that
        works when it holds proof (its job's cookie, its owner), else counted
        for the ``audit-gap`` record with its run."""
        if rec.get("event") in KEEP_EVENTS and len(self._pending) < MAX_PENDING:
            late = _encode({**rec, "late": True})
            if len(late) <= self.max_line:
                self._pending.append(late)
                return
        self.lost += 1
        self._gap += 1
        run = rec.get("run")
        if isinstance(run, str) and len(self._gap_runs) < MAX_GAP_RUNS and len(run) < 256:
            self._gap_runs.add(run)

    def _shrink(self, rec: dict[str, Any], size: int) -> bytes:
        # A line longer than a reader accepts would be lost at read time: cut
        # the opted-in argv first, and if it still does not fit keep a stub.
        argv = rec.get("argv")
        if isinstance(argv, list):
            rec = dict(rec)
            rec["argv_truncated"] = len(argv)
            keep = list(argv)
            while keep:
                keep = keep[: len(keep) // 2]
                rec["argv"] = keep
                line = _encode(rec)
                if len(line) <= self.max_line:
                    return line
            rec.pop("argv")
            line = _encode(rec)
            if len(line) <= self.max_line:
                return line
        stub = {
            "v": SCHEMA_VERSION,
            "ts": rec.get("ts"),
            "event": "error",
            "error": "record-too-long",
            "of": rec.get("event"),
            "bytes": size,
        }
        for k in ("run", "job", "session", "pid", "start"):
            if k in rec and len(_encode({k: rec[k]})) < 1024:
                stub[k] = rec[k]
        return _encode(stub)

    def _append(self, line: bytes) -> None:
        """One record, under self._lock. Raises OSError / AuditDirError."""
        if self.reason is not None or not self._dir_ready:
            self._reopen_dir()
        try:
            if _DIR_FD:
                st = os.stat(self.filename, dir_fd=self._dfd, follow_symlinks=False)
            else:
                st = os.stat(self._p(self.filename), follow_symlinks=False)
        except FileNotFoundError:
            st = None  # rotated away by another writer, or deleted
        if st is None or self._fd < 0 or (st.st_dev, st.st_ino) != self._ino:
            self._open_file()
            st = os.fstat(self._fd)
        if st.st_size and st.st_size + len(line) > self.max_bytes:
            self._rotate(len(line))
        if self._gap or self._torn or self._pending:
            gap: dict[str, Any] = {
                "v": SCHEMA_VERSION,
                "ts": time.time(),
                "event": "error",
                "error": "audit-gap",
                "lost": self._gap,
                "pid": os.getpid(),
            }
            if self._gap_runs:
                gap["runs"] = sorted(self._gap_runs)
            if self._pending:
                gap["kept"] = len(self._pending)
            # A newline first ends a partial line a short write left behind.
            self._write_all((b"\n" if self._torn else b"") + _encode(gap))
            self._gap = 0
            self._gap_runs.clear()
            self._torn = False
            while self._pending:  # the kept records, each once (a short write stops it)
                self._write_all(self._pending[0])
                self._pending.pop(0)
        if line:
            self._write_all(line)
        self.reason = None

    def _write_all(self, data: bytes) -> None:
        n = os.write(self._fd, data)
        if n != len(data):
            # Only a full disk (or a quota) cuts a regular-file append short.
            # Never write the rest: a second write could interleave.
            if n > 0:
                self._torn = True
            import errno

            raise OSError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)} (short write, {n} of {len(data)} bytes)",
                str(self.path),
            )

    def _reopen_dir(self) -> None:
        self._dir_ready = False
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._ino = None
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1
        check_dir(self.state_dir, create=True)
        if _DIR_FD:
            self._dfd = _open_dir(self.state_dir)
        self._dir_ready = True
        if not self._pruned:
            # Age and count limits also hold for a log too quiet to rotate often
            # (or left with more copies by another writer's settings).
            self._pruned = True
            lock = self._lock_file()
            try:
                if lock >= 0 or _WINDOWS:
                    self._prune()
                    _touch(lock)
            finally:
                if lock >= 0:
                    os.close(lock)

    def _open_file(self) -> None:
        flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW | _O_BINARY
                 | _O_NONBLOCK)
        fd = os.open(self._p(self.filename), flags, 0o600, **self._kw())
        try:
            st = os.fstat(fd)
            why = file_refusal(st, fd)
            if why is not None:
                raise AuditDirError(f"audit log {self.path}: {why}; refusing to write it")
            if self._fd >= 0:
                # dup2 keeps the fd number: a racing thread can never write
                # into an unrelated file that reused a closed number.
                os.dup2(fd, self._fd, inheritable=False)
                os.close(fd)
            else:
                self._fd = fd
        except BaseException:
            if fd != self._fd:
                os.close(fd)
            raise
        self._ino = (st.st_dev, st.st_ino)
        self._dev_n, self._ino_n = st.st_dev, st.st_ino

    def _rotate(self, need: int) -> None:
        """Rename live -> .1 -> .2 ... under the lock file, if still needed."""
        lock = -1
        try:
            lock = self._lock_file()
            name = self.filename
            try:
                st = os.stat(self._p(name), **self._kw(), follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if (
                st is not None
                and st.st_size
                and st.st_size + need > self.max_bytes
                and (lock >= 0 or _WINDOWS)
            ):
                # Shift every copy up by one, highest first (so nothing is
                # clobbered and the cost follows the files present), then the
                # live file to .1. What is now beyond keep_files or keep_days is
                # deleted by _prune - after what it still proves is carried.
                names = os.listdir(self._dfd if _DIR_FD else self.state_dir)
                for n, old in _rotated(names, name):
                    self._rename(old, f"{name}.{n + 1}")
                self._rename(name, f"{name}.1")
                self._prune()
                _touch(lock)
        except OSError:
            # Rotation trouble (Windows: a file open elsewhere) is not a lost
            # record: write to the live file and try again at the next write.
            pass
        finally:
            if lock >= 0:
                os.close(lock)  # closing releases the flock
        try:
            st = os.stat(self._p(self.filename), **self._kw(), follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._ino:
            self._open_file()

    def _rename(self, src: str, dst: str) -> None:
        if _DIR_FD:
            os.rename(src, dst, src_dir_fd=self._dfd, dst_dir_fd=self._dfd)
        else:
            os.replace(self._p(src), self._p(dst))

    def _lock_file(self) -> int:
        """A non-blocking flock on the lock file, or -1 (no fcntl, or busy)."""
        try:
            import fcntl
        except ImportError:
            return -1
        fd = os.open(
            self._p(self.filename + ".lock"),
            os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW | _O_NONBLOCK,
            0o600,
            **self._kw(),
        )
        if file_refusal(os.fstat(fd), fd) is not None:
            os.close(fd)  # not ours to lock on: rotate without the lock (see _rotate)
            return -1
        for _ in range(_LOCK_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                time.sleep(0.005)
        os.close(fd)
        return -1

    def _prune(self) -> None:
        """Delete rotated copies beyond keep_files or older than keep_days, once
        the records in them that still prove something are carried forward."""
        try:
            names = os.listdir(self._dfd if _DIR_FD else self.state_dir)
        except OSError:
            return
        cutoff = time.time() - self.keep_days * 86400 if self.keep_days else None
        doomed = []
        if cutoff is not None and self.filename == DEFAULT_FILENAME:
            # An older tether-shell's day files age out by the same rule.
            doomed += [name for name in names if _legacy_shell_file(name)
                       and self._mtime(name) < cutoff]
        for n, name in _rotated(names, self.filename):
            try:
                if n > self.keep_files:
                    doomed.append(name)
                elif cutoff is not None:
                    st = os.stat(self._p(name), **self._kw(), follow_symlinks=False)
                    if st.st_mtime < cutoff:
                        doomed.append(name)
            except OSError:
                pass
        if not doomed or not self._carry(doomed):
            return  # a carry that could not be written keeps its copies for the next try
        for name in doomed:
            try:
                os.unlink(self._p(name), **self._kw())
            except OSError:
                pass

    def _mtime(self, name: str) -> float:
        try:
            return os.stat(self._p(name), **self._kw(), follow_symlinks=False).st_mtime
        except OSError:
            return float("inf")

    def _carry(self, doomed: list[str]) -> bool:
        """Append to the live file, marked ``carried``, every record of the
        copies in *doomed* (oldest first) that still proves a process that may
        be alive (:func:`tether.records.still_needed`), at most ``max_bytes // 2``
        of them; past that, an ``audit-carry-loss`` error record says what was
        dropped. False when the carry could not be written."""
        from tether.records import legacy_shell_records, record_of, still_needed  # lazy: a prune's

        def legacy(name: str) -> Iterator[bytes]:  # an old day file: as the audit records it meant
            for whole in self._line_blocks_of(name):
                for line in whole.split(b"\n"):
                    rec = record_of(line) if len(line) <= self.max_line else None
                    if rec is not None and (recs := legacy_shell_records(rec)):
                        yield b"".join(_encode(r) for r in recs)

        def blocks() -> Iterator[bytes]:  # whole lines; a line over max_line is dropped
            for name in doomed:
                yield from (legacy(name) if _legacy_shell_file(name)
                            else self._line_blocks_of(name))

        needed = still_needed(blocks())
        if not needed:
            return True
        budget = self.max_bytes // 2
        out: list[bytes] = []
        used = lost = 0
        lost_runs: list[str] = []
        for rec in needed:
            rec = dict(rec)
            rec["carried"] = True
            line = _encode(rec)
            if used + len(line) > budget or len(line) > self.max_line:
                lost += 1
                run = rec.get("run")
                if isinstance(run, str) and run not in lost_runs and len(lost_runs) < 20:
                    lost_runs.append(run)
                continue
            out.append(line)
            used += len(line)
        if lost:
            out.append(_encode({"v": SCHEMA_VERSION, "ts": time.time(), "event": "error",
                                "error": "audit-carry-loss", "lost": lost, "runs": lost_runs,
                                "cap": budget, "pid": os.getpid()}))
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW | _O_BINARY
        try:
            fd = os.open(self._p(self.filename), flags, 0o600, **self._kw())
        except OSError:
            return False
        try:
            data = b"".join(out)
            # One write: concurrent writers' lines never land inside the batch.
            return os.write(fd, data) == len(data)
        except OSError:
            return False
        finally:
            os.close(fd)

    def _line_blocks_of(self, name: str) -> Iterator[bytes]:
        """The whole lines of log file *name* (see :func:`_line_blocks`); none
        when it cannot be opened or read, or must not be (:func:`file_refusal`:
        a FIFO, another user's file, one another user can write)."""
        try:
            fd = os.open(self._p(name), os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW | _O_BINARY
                         | _O_NONBLOCK, **self._kw())
        except OSError:
            return
        try:
            if file_refusal(os.fstat(fd), fd) is None:
                yield from _line_blocks(functools.partial(os.read, fd), self.max_line)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _fail(self, reason: str, rec: dict[str, Any] | None = None) -> None:
        if rec is not None:
            self._lose(rec)
        self.reason = reason
        self._retry_at = time.monotonic() + self.retry_interval
        if self._reported:
            return
        self._reported = True
        msg = f"tether: audit log disabled: {reason}"
        if self.on_loss is not None:
            try:
                self.on_loss(msg)
                return
            except Exception as exc:  # noqa: BLE001 - an app's on_loss callback must not break a write
                # the loss is still said, where it is said without a callback
                msg += f" (and the on_loss callback failed: {type(exc).__name__}: {exc})"
        try:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # no stderr to say it on
            pass  # reporting must not break the caller either

    def close(self) -> None:
        with self._lock:
            if self._pending and not self._closed:
                # One last try for the kept records (the disk may have room
                # again); what still cannot be written is lost, and said so.
                try:
                    self._append(b"")
                except (OSError, AuditDirError) as e:
                    n = len(self._pending)
                    self._pending.clear()
                    self.lost += n
                    self._gap += n
                    self._fail(_why(e, self.state_dir) if isinstance(e, OSError) else str(e))
            self._closed = True
            self._dev_n = self._ino_n = -1
            for attr in ("_fd", "_dfd"):
                fd = getattr(self, attr)
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                    setattr(self, attr, -1)

    def fileno(self) -> int:
        """The log's fd (-1 before the first write), for inheritance checks."""
        return self._fd

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing may escape a finalizer
            pass


def _touch(lock: int) -> None:
    """Mark the lock file's mtime as the time of the last prune: the native
    tether-shell, which only appends, hands a start over to this writer once
    that is older than :data:`PRUNE_EVERY` (see docs/audit.md)."""
    if lock >= 0:
        try:
            os.utime(lock)
        except OSError:
            pass


def _legacy_shell_file(name: str) -> bool:
    """``shell-YYYY-MM-DD.jsonl``: a day file of an older tether-shell."""
    return (len(name) == 22 and name.startswith("shell-") and name.endswith(".jsonl")
            and name[6:16].replace("-", "").isdigit())


def _why(e: OSError, state_dir: Path) -> str:
    text = e.strerror or str(e)
    where = os.fspath(e.filename) if isinstance(e.filename, (str, os.PathLike)) else None
    if where and not os.path.isabs(where):
        where = os.path.join(state_dir, where)  # a dir_fd-relative name
    return f"{text}: {where or state_dir}"


# --------------------------------------------------------------------------
# the files' names and lines: shared by the writer (rotation, carry) and the
# reader (tether.audit_read), so that the writer needs no reader to carry


def _rotated(names: list[str], filename: str) -> list[tuple[int, str]]:
    """(n, name) of every ``filename.<n>`` in *names*, oldest (highest n) first."""
    prefix = filename + "."
    out = []
    for name in names:
        if name.startswith(prefix):
            suffix = name[len(prefix) :]
            if suffix.isdigit() and suffix.isascii() and suffix[0] != "0":
                out.append((int(suffix), name))
    out.sort(reverse=True)
    return out


def _line_blocks(read: Callable[[int], bytes], max_line: int,
                 st: ReadStats | None = None) -> Iterator[bytes]:
    """Chunks of whole lines (each up to its last newline) from ``read``, in
    256 KiB blocks plus at most ``max_line`` of carry: a line longer than that
    is skipped unread (counted in ``st.lines``/``st.too_long``), a last line
    without its newline is never yielded (counted in ``st.truncated``)."""
    carry = b""
    skipping = False  # inside an over-long line, waiting for its newline
    while True:
        block = read(_READ_BLOCK)
        if not block:
            break
        if skipping:
            nl = block.find(b"\n")
            if nl < 0:
                continue
            skipping = False
            block = block[nl + 1 :]
        data = carry + block if carry else block
        cut = data.rfind(b"\n") + 1
        if cut:
            yield data[:cut]
        carry = data[cut:]
        if len(carry) > max_line:
            if st is not None:
                st.lines += 1
                st.too_long += 1
            carry = b""
            skipping = True
    if carry.strip() and st is not None:
        st.lines += 1
        st.truncated += 1


_READER = frozenset(("ReadStats", "log_files", "iter_records", "read_records"))


def __getattr__(name: str) -> Any:
    # The reader's names, still importable from here (``audit.read_records``):
    # tether.audit_read is loaded on first use, never by a writer alone.
    if name in _READER:
        from . import audit_read

        return getattr(audit_read, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
