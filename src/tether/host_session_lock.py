"""The host layer's session-key locks: one live copy of a session key.

``Host.session(key)`` (and ``tether run --session``, through a Host) holds
its key with an ``flock`` on a small file named after (app, key) in a
``sessions`` directory; the file says who holds it (run, pid, start, when).
The kernel drops the lock when the holder dies, however it dies, so a
crashed app never leaves a key held, and no daemon keeps the table. The
locking itself - ``flock`` or, on Windows, a byte-range lock; a take-over's
unlink under a directory lock; a retry when the file changed under us - is
kept here, apart from the host's policy (who may take a key over, what a
resume ends), which stays in :mod:`tether.host`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import identity
from .errors import SessionHeld

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _flock(fd: int) -> bool:
    """A non-blocking exclusive lock on ``fd``; False when another holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: a byte-range lock, released with the process
        import msvcrt

        try:
            os.lseek(fd, 1 << 20, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]  # msvcrt's stub is win32-only; mypy checks as Linux
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _read_info(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        info = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


class _SessionLock:
    """One session key held by this process: an ``flock`` on a small file
    named after (app, key) that says who holds it. The kernel drops the lock
    when the holder dies, however it dies. A take-over unlinks the held file
    and locks a fresh one; the old holder sees its file gone (:meth:`lost`)
    at its next launch. Unlinks happen under a directory lock, and a lock
    taken on a file that was unlinked meanwhile is retried, so two holders
    never both believe they hold a key.
    """

    def __init__(self, directory: Path, app: str, key: str) -> None:
        digest = hashlib.sha256(f"{app}\0{key}".encode()).hexdigest()[:32]
        self.path = directory / f"{digest}.lock"
        self._dirlock = directory / ".lock"
        self.fd = -1
        self.ino: tuple[int, int] | None = None
        self.previous: dict[str, Any] = {}  # who held it last without releasing it (a crash)

    def acquire(self, me: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, int]] | None:
        """None once held; else (what the holder wrote, the held file's inode)."""
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, 0o600)
            try:
                st = os.fstat(fd)
                if not _flock(fd):
                    return _read_info(fd), (st.st_dev, st.st_ino)
                try:
                    cur = os.stat(self.path, follow_symlinks=False)
                except FileNotFoundError:
                    cur = None
                if cur is None or (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino):
                    continue  # released or taken over between open and lock: once more
                self.previous = _read_info(fd)
                data = json.dumps(me).encode()
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, data)
                self.fd, fd = fd, -1
                self.ino = (st.st_dev, st.st_ino)
                return None
            finally:
                if fd >= 0:
                    os.close(fd)
        raise OSError(f"session lock {self.path} kept changing")

    def holder(self) -> dict[str, Any]:
        """What the file now named says of its holder ({} if nothing)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
        except OSError:
            return {}
        try:
            return _read_info(fd)
        finally:
            os.close(fd)

    def lost(self) -> bool:
        """Whether the key was taken over (our file is no longer the one named)."""
        if self.fd < 0:
            return True
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ino

    @contextlib.contextmanager
    def _unlinking(self) -> Iterator[bool]:
        try:
            import fcntl
        except ImportError:
            yield False  # Windows: an open file cannot be unlinked; nothing is
            return
        fd = os.open(self._dirlock, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, 0o600)
        try:
            for _ in range(200):  # held for a few system calls at a time; 1 s at most
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.005)
            else:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)  # a clean release leaves no "previous holder"
        except OSError:
            pass
        with self._unlinking() as ok:
            if ok and not self.lost():
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            os.close(self.fd)
            self.fd = -1

    def break_(self, ino: tuple[int, int]) -> bool:
        """Unlink the held file if it is still the one seen held (``ino``)."""
        with self._unlinking() as ok:
            if not ok:
                return False
            try:
                st = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                return True
            if (st.st_dev, st.st_ino) != ino:
                return True  # changed already: acquire() will see who holds it now
            os.unlink(self.path)
            return True


class _LocalLock:
    """The lock when no directory can hold session locks: this process only."""

    previous: dict[str, Any] = {}

    def lost(self) -> bool:
        return False

    def release(self) -> None:
        pass


def _held(app: str, key: str, info: dict[str, Any], why: str = "") -> SessionHeld:
    """The SessionHeld for a key whose lock file says ``info``."""
    pid = info.get("pid") if type(info.get("pid")) is int else None
    start = info.get("start") if isinstance(info.get("start"), str) else None
    when = ""
    ticks = start.partition("@")[0] if start else ""
    if ticks.isdigit():
        age = max(0.0, (identity.now_ticks() - int(ticks)) / identity.clock_ticks())
        when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() - age))}"
    who = f"pid {pid}{when}" if pid is not None else "an unknown process"
    msg = (f"session {key!r} of {app!r} is held by a live run ({who}); "
           + (why or "host.session(key, take_over=True) ends that copy and takes the key over"))
    return SessionHeld(msg, session=key, run=info.get("run") if isinstance(info.get("run"), str)
                       else None, start=start, pid=pid)
