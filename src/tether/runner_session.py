"""`tether run --session KEY`: the command line's way into the host layer's sessions.

An app that cannot import tether (a Node or Go agent CLI, a shell script)
still gets what ``Host(app).session(key)`` gives a Python one - one copy per
key, ``--take-over`` of a running copy, a resume that ends what a dead copy
left - by starting its command with ``tether run --state-dir DIR --app APP
--session KEY``. This module checks those options before anything runs
(:func:`session_args`), holds the session for the run (``_SessionRun``: a
:class:`tether.Host` of APP, the same code an app's ``host.session(key)``
runs) and writes the report of its end (``--report FILE``/``--report-fd N``).
``tether.runner`` runs and supervises the command itself; the host layer is
imported only once a session is asked for, so a plain ``tether run`` stays
light.
"""

from __future__ import annotations

import os
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # a hint only: typing costs ~2 ms to import
    from typing import Any

from ._constants import EXIT_INTERNAL as EXIT_TETHER_FAILURE  # noqa: E402 - shared with C

# -- the host layer's session rules from the command line (--session) ---------------

MAX_KEY_BYTES = 256


class SessionArgs:
    """``--state-dir DIR --app APP --session KEY [--label TEXT] [--take-over]
    [--report FILE | --report-fd N]``, checked (:func:`session_args`)."""

    def __init__(self, state_dir: str, app: str, key: str, label: str | None = None,
                 take_over: bool = False, report: str | None = None,
                 report_fd: int | None = None) -> None:
        self.state_dir, self.app, self.key, self.label = state_dir, app, key, label
        self.take_over, self.report, self.report_fd = take_over, report, report_fd


def session_args(state_dir: str | None, app: str | None, key: str | None, label: str | None,
                 take_over: bool, report: str | None, report_fd: int | None
                 ) -> SessionArgs | str | None:
    """The session options checked before anything starts or is written: a
    :class:`SessionArgs`, None (no session asked for), or why not (one line)."""
    if key is None:
        for name, given in (("--app", app), ("--label", label), ("--take-over", take_over),
                            ("--report", report), ("--report-fd", report_fd)):
            if given not in (None, False):
                return f"{name} needs --session KEY"
        return None
    if state_dir is None or app is None:
        return "--session needs --state-dir DIR and --app APP"
    for name, text in (("--session", key), ("--app", app), ("--label", label)):
        if text is not None and (not text.strip() or "\n" in text or "\r" in text or "\0" in text):
            return f"{name} must be one non-empty line"
    if len(key.encode("utf-8", "surrogateescape")) > MAX_KEY_BYTES:
        return f"--session must be at most {MAX_KEY_BYTES} bytes"
    if not os.path.isdir(state_dir):
        return f"--state-dir {state_dir}: no such directory"
    if not os.access(state_dir, os.R_OK | os.W_OK | os.X_OK):
        return f"--state-dir {state_dir}: not readable and writable by this user"
    if report is not None and report_fd is not None:
        return "--report and --report-fd: one or the other"
    if report is not None:
        parent = os.path.dirname(os.path.abspath(report))
        if os.path.isdir(report) or (os.path.exists(report) and not os.access(report, os.W_OK)) or (
                not os.path.exists(report) and not os.access(parent, os.W_OK | os.X_OK)):
            return f"--report {report}: cannot write there"
    if report_fd is not None:
        import fcntl

        try:
            flags = fcntl.fcntl(report_fd, fcntl.F_GETFL)
        except (OSError, ValueError, OverflowError):
            return f"--report-fd {report_fd}: not an open file descriptor"
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return f"--report-fd {report_fd}: not open for writing"
    return SessionArgs(state_dir, app, key, label, take_over, report, report_fd)


def _flock_held(path: str) -> bool | None:
    """Whether some process holds an flock on ``path``, read from /proc/locks
    without taking the lock (a lock taken to look would, for an instant, make a
    starting copy believe the key held). None where that cannot be told."""
    try:
        st = os.stat(path, follow_symlinks=False)
        with open("/proc/locks") as f:
            rows = f.read().splitlines()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for row in rows:
        parts = row.split()
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, ino = parts[5].split(":")
            if (int(major, 16), int(minor, 16), int(ino)) == want:
                return True
        except ValueError:
            continue
    return False


class _SessionRun:
    """One ``tether run --session``: a :class:`tether.Host` of APP holding the
    session KEY - its one-copy rule, take-over and resume rule, as an app's
    ``host.session(key)`` (the same code) - and the report of its end."""

    def __init__(self, args: SessionArgs, *, mechanism: str, grace: float,
                 require: str | None) -> None:
        self.args, self.mechanism, self.grace, self.require = args, mechanism, grace, require
        self.host: Any = None  # the tether.Host (imported late: the run path stays light)
        self.session: Any = None  # its Session
        self.stopped: Any = None  # the EndedWork of the stop that ended the job
        self.taken_by: Any = None  # the pid that took the key over, if one did
        self._stop_lock = threading.Lock()

    def _refuse(self, info: dict, why: str = "--take-over ends that copy; nothing was run") -> int:
        from .host import _held

        print(f"tether: {_held(self.args.app, self.args.key, info, why)}", file=sys.stderr)
        return EXIT_TETHER_FAILURE

    def open(self) -> int | None:
        """Hold the key (None) or refuse (the exit status, the line said)."""
        from pathlib import Path

        from .errors import SessionHeld
        from .host import Host, _read_info, _SessionLock

        a = self.args
        if not a.take_over:
            # Refused before the Host writes its run's records: a refusal changes nothing.
            path = str(_SessionLock(Path(a.state_dir) / "sessions", a.app, a.key).path)
            if _flock_held(path):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                    try:
                        info = _read_info(fd)
                    finally:
                        os.close(fd)
                except OSError:
                    info = {}
                return self._refuse(info)
        import logging

        # the host layer's own log lines (its announcements) are the app's; the
        # CLI says what it ended in its own lines below
        logging.getLogger("tether.host").addHandler(logging.NullHandler())
        self.host = Host(a.app, a.state_dir, self.require, mechanism=self.mechanism,
                         grace=self.grace, reap=False, audit="required", read_log=False,
                         host_job=False)
        try:
            self.session = self.host.session(a.key, take_over=a.take_over,
                                             take_over_before=_started_at())
        except SessionHeld as exc:
            self.abandon()
            return self._refuse({"pid": exc.pid, "start": exc.start, "run": exc.run},
                                "--take-over ends that copy; nothing was run" if not a.take_over
                                else "it could not be taken over; nothing was run")
        resumed = self.session.resumed
        if resumed:
            for line in _ended_lines(resumed):
                print(f"tether: {line}", file=sys.stderr)
        return None

    def abandon(self) -> None:
        if self.host is not None:
            import contextlib

            with contextlib.suppress(Exception):
                self.host.close()

    def end(self, why: str, grace: float) -> None:
        """A stop (a signal, the app gone): the session's stop, reported."""
        with self._stop_lock:
            if self.stopped is None and self.session is not None:
                self.stopped = self.session.stop(why, grace=grace)

    def finish(self, status: int) -> None:
        from .stops import SESSION_CLOSED, TAKE_OVER

        s = self.session
        try:
            if s is not None:
                taken = s._lock.lost()
                if not taken and self.stopped is None and status > 128:
                    # killed, not by us: a take-over ends the copy first and
                    # takes the key once that is done (its grace at most)
                    deadline = time.monotonic() + self.grace + 2
                    while not taken and time.monotonic() < deadline:
                        time.sleep(0.01)
                        taken = s._lock.lost()
                if taken:
                    self.taken_by = s._lock.holder().get("pid")
                self.end(TAKE_OVER if taken else SESSION_CLOSED, self.grace)
        finally:
            self.abandon()
        self._report(status)

    def _report(self, status: int) -> None:
        a = self.args
        if a.report is None and a.report_fd is None:
            return
        ended = self.stopped
        out: dict[str, Any] = {"app": a.app, "session": a.key, "label": a.label, "exit": status,
               "reason": ended.reason if ended is not None else None,
               "text": str(ended) if ended else "",
               "ended": _processes(ended) if ended is not None else [],
               "resumed": None, "taken_over_by": self.taken_by}
        resumed = self.session.resumed if self.session is not None else None
        if resumed:
            out["resumed"] = {"reason": resumed.reason, "text": str(resumed),
                              "holder": resumed.holder, "ended": _processes(resumed)}
        import json

        data = (json.dumps(out) + "\n").encode()
        try:
            if a.report_fd is not None:
                os.write(a.report_fd, data)
            else:
                tmp = f"{a.report}.tmp-{os.getpid()}"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, str(a.report))
        except OSError as exc:
            print(f"tether: cannot write the report: {exc}", file=sys.stderr)


def _started_at() -> float | None:
    """This process's start as a ``time.time()``: a take-over was asked for then."""
    from . import identity

    me = identity.own()
    if me is None:
        return None
    return time.time() - max(0.0, (identity.now_ticks() - me.start) / identity.clock_ticks())


def _processes(work) -> list[dict]:
    """Every process a stop (or resume) ended: pid, command name, runtime."""
    out = []
    for p in work.all_processes:
        name = p.identity.comm if p.identity is not None and p.identity.comm else p.label
        out.append({"pid": p.pid, "name": name, "label": p.label, "agent": p.root,
                    "runtime_s": round(p.runtime_s, 3)})
    return out


def _ended_lines(work) -> list[str]:
    """One line per process a take-over or resume ended: pid, name, how long it ran."""
    from .stops import TAKE_OVER, format_duration

    what = (f"took over {work.session}" + (f" from pid {work.holder}" if work.holder else "")
            if work.reason == TAKE_OVER else f"resumed {work.session}")
    return [f"{what}: ended pid {p['pid']} ({p['name']}), ran {format_duration(p['runtime_s'])}"
            for p in _processes(work)]
