"""Hosts of long-lived agent sessions: one job per app, a job per session.

    from tether import Host
    with Host("my-agent-app") as host:
        s = host.session("chat-42")              # ends its own leftover copy first
        agent = s.popen(["claude", "-p", ...])   # starts only inside the session's job
        s.tasks.started("b1x", "npm run build")  # or feed StreamAdapter(s.tasks)
        print(s.live_work())                     # what the agent runs in the background
        print(s.stop("user request"))            # "Stopped (user request): ended ..."

What a host promises an app's users:

* **Fail closed.** One host job per app instance; every session's job is
  nested in it, so the app's death - crash, force-kill, OOM - ends every
  session's tree. ``host.guarantee`` says what protects them. When nothing
  can, every agent launch (``session.popen``/``run``/``create_subprocess_exec``)
  raises ``JobRefused("process-tree ownership could not be established before
  agent launch: <reason>")`` and starts nothing; ``Host(allow_unprotected=True)``
  runs them as plain children instead, after one loud ``SafetyNetWarning``.
  ``require="kernel"`` refuses sessions unless a kernel-enforced mechanism
  holds them. What the app starts outside sessions (``host.job``, background
  jobs, detached launches) is not refused.
* **The reaper on start**: leftovers of the same app's earlier runs that the
  audit proves are theirs are ended; the report is ``host.reap_report``. The
  audit never loses that proof to rotation (``tether.audit``: records that
  still prove something are carried forward), within a hard size cap.
* **One copy per session key.** ``host.session(key)`` holds the key (a lock
  the kernel releases when this process dies, however it dies); a key held
  by another live run of the app raises :class:`SessionHeld` naming its pid
  and start, or with ``take_over=True`` that copy is ended (announced) and
  the key taken over. A copy left alive by an earlier run that is over is
  ended first (the resume rule: the reaper filtered to that key), and
  ``session.resumed`` says what it ended in the app's words: the labels the
  app gave, the ledger's live tasks, agent and work told apart.
* **Stops that say what they ended**: ``session.stop(reason)`` returns an
  :class:`EndedWork`; every stop announces what it will end *before* ending it
  (``Host(announce=...)`` and the ``tether.host`` logger at INFO).
* **Live work**: ``session.tasks`` (``tether.ledger``: the app's or the
  agent stream's tasks) and ``session.live_work()`` (from the job's members
  alone: each process group the agent started apart from its own). An
  optional stop (``optional=True``, e.g. an idle release) is *skipped* while
  either holds it - never capped: a skipped stop ends nothing - or, with
  ``wait=True``, *waits* up to ``task_cap`` seconds (default 30 minutes) from
  the first wait held off, then proceeds. Ambient tasks never hold. A stop
  asked for by a person is never held.
* **Background jobs** that outlive the host on purpose, CPU-capped and at low
  priority, bounded by their own timeout, recorded so the reaper leaves them
  (how: :mod:`tether.host_background`).
* **Detached launches** (an editor, a browser window) outside every job,
  recorded as detached, never reaped.
* A state directory tether refuses (a symlink, another user's, writable by
  others) or cannot create starts the host with auditing off, one
  ``AuditWarning`` and ``host.audit_error`` set - unless ``audit="required"``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import audit as _audit
from . import identity
from . import job as _job
from .ending import DEFAULT_GRACE, check_grace
from .errors import HostClosed, JobRefused, SessionHeld, TetherError
from .host_background import _LINUX, BackgroundJob, _cpu_max, _lower_priority
from .host_session import Session, _AppJob, _key, _report
from .host_session_lock import _held as _held  # (as: tether.runner imports these from here)
from .host_session_lock import _LocalLock
from .host_session_lock import _read_info as _read_info
from .host_session_lock import _SessionLock as _SessionLock
from .identity import Identity
from .ledger import Ledger
from .platform import base as _base
from .stops import APP_EXIT, RESUME, TAKE_OVER, EndedWork, Resumed

__all__ = ["Host", "Session", "BackgroundJob", "SafetyNetWarning", "AuditWarning"]

logger = logging.getLogger("tether.host")

DEFAULT_TASK_CAP = 30 * 60.0
WORK_HOLDS = ("all", "outlived", None)


class SafetyNetWarning(RuntimeWarning):
    """The host could not open a job, and the app allowed unprotected sessions."""


class AuditWarning(RuntimeWarning):
    """The host runs with its audit log off (``host.audit_error`` says why)."""


# The open sessions of this process by lock file: a key held by another Host of
# this very process (same pid, same run id) is taken over by stopping it.
_OPEN: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()


# ---------------------------------------------------------------------------
# The host


class Host:
    """One application instance that runs agent sessions; see the module doc.

    ``app``: the application's name (reaping, the resume rule and session
    keys only ever concern the same app). ``state_dir``: where the audit log
    and the session locks live (default: the user's,
    ``tether.audit.default_state_dir()``); a relative one is resolved once,
    here.
    ``require="kernel"``: sessions refuse to start unless a kernel-enforced
    mechanism holds them. ``allow_unprotected``: when no job can be had, run
    agents as plain children (one ``SafetyNetWarning``) instead of refusing
    every launch. ``announce(plan)`` is called before every stop that will
    end something, with an :class:`EndedWork` whose ``announcement()`` is the
    line to show. ``audit``: ``"auto"`` (a directory tether refuses turns the
    log off, with one ``AuditWarning``), ``"required"`` (it raises
    ``AuditDirError``) or ``"off"``. ``audit_max_bytes``,
    ``audit_keep_files``, ``audit_keep_days``: the log's retention for every
    record this host writes (see ``tether.audit``; records that still prove
    something are carried forward whatever the retention). ``work_holds``:
    which live work holds optional stops - ``"all"`` (default: every process
    group the agent started), ``"outlived"`` (only those whose tool call is
    over) or ``None`` (only the ledger's tasks). ``read_log=False`` (with
    ``reap=False``; what ``tether run --session`` uses): the log is not read
    at start; a session's resume rule reads it only when the key's last
    holder died holding it (a clean release leaves nothing to resume).
    ``host_job=False`` (what ``tether run --session`` uses, with
    ``reap=False, read_log=False``): a host of one session, whose job is the
    host's job - no job of the host's own and no ``run-start``/``run-end``
    records (the session's records carry the app and key): a run costs the
    log what a plain job does. ``host.job`` is the session's, once opened; a
    second key raises ``ValueError``.
    """

    def __init__(
        self,
        app: str,
        state_dir: str | os.PathLike[str] | None = None,
        require: str | None = None,
        *,
        mechanism: str = "auto",
        grace: float = DEFAULT_GRACE,
        task_cap: float = DEFAULT_TASK_CAP,
        announce: Callable[[EndedWork], Any] | None = None,
        reap: bool = True,
        allow_unprotected: bool = False,
        audit: str = "auto",
        audit_max_bytes: int = _audit.DEFAULT_MAX_BYTES,
        audit_keep_files: int = _audit.DEFAULT_KEEP_FILES,
        audit_keep_days: float | None = _audit.DEFAULT_KEEP_DAYS,
        work_holds: str | None = "all",
        read_log: bool = True,
        host_job: bool = True,
    ) -> None:
        if not isinstance(app, str) or not app.strip():
            raise ValueError(f"app must be a non-empty string, not {app!r}")
        if require not in (None, "kernel"):
            raise ValueError(f"require must be None or 'kernel', not {require!r}")
        if audit not in ("auto", "required", "off"):
            raise ValueError(f"audit must be 'auto', 'required' or 'off', not {audit!r}")
        if work_holds not in WORK_HOLDS:
            raise ValueError(f"work_holds must be one of {WORK_HOLDS}, not {work_holds!r}")
        self.app = app
        self.require = require
        self.mechanism = mechanism
        self.grace = check_grace(grace)
        self.task_cap = float(task_cap)
        self.announce = announce
        self.allow_unprotected = bool(allow_unprotected)
        self.work_holds = work_holds
        # resolved once, as a Job's: a relative one must not follow a later
        # chdir (the session locks and the log would split in two places)
        self.state_dir = (_audit.resolve_state_dir(state_dir) if state_dir is not None
                          else _audit.default_state_dir())
        self.run = _job.run_id()
        self.reap_report: Any = None
        self.reap_error: str | None = None
        self.audit_error: str | None = None
        self.safety_net_disabled: str | None = None
        self._sessions: dict[str, Session] = {}
        self._background: set[BackgroundJob] = set()
        self.detached: list[subprocess.Popen[Any]] = []
        self._closed = False
        self._lock = threading.RLock()
        # What the start-up reap ended, by session key (reported by the first
        # session(key)), and what was seen of it while it still ran.
        self._reaped: dict[str, list[Any]] = {}
        self._seen: dict[tuple[int, int], Identity] = {}
        self._cmdlines: dict[tuple[int, int], str] = {}
        opts = {"max_bytes": audit_max_bytes, "keep_files": audit_keep_files,
                "keep_days": audit_keep_days}
        self._audit_opts: dict[str, Any] | None = opts
        self._audit: _audit.AuditWriter | None = None
        if audit == "off":
            self._audit_opts = None
        else:
            self._open_audit(opts, required=audit == "required")
        # One read of the log (a long one costs seconds), shared by the reap
        # at start and the resume rule of every session opened later: both are
        # the reaper, the resume rule filtered to one session key. Read before
        # this host writes anything, so that nothing of it is pruned first.
        self._runs: dict[str, Any] | None = None
        self._read_stats = _audit.ReadStats()
        self._read_notes: list[str] = []  # what limited the reading (a size cap's loss, ...)
        self._resume_error: str | None = None
        self._lazy_log = not read_log and not reap
        # False: one session, whose job is the host's (opened by session(key))
        self._own_job = bool(host_job)
        if self._lazy_log and self._audit is not None:
            pass  # read by the resume rule, if ever needed
        elif self._audit is None:
            self._resume_error = self.reap_error = f"audit log off: {self.audit_error or 'asked'}"
        else:
            try:
                from .runs import read_runs

                self._runs = read_runs(self.state_dir, stats=self._read_stats,
                                       notes=self._read_notes)
                for note in self._read_notes:
                    logger.warning("tether host %r: audit log: %s", self.app, note)
            except (TetherError, OSError, ValueError) as exc:  # must not stop the app
                self._resume_error = self.reap_error = f"{type(exc).__name__}: {exc}"
                logger.warning("tether host %r: cannot read the audit log: %s", self.app,
                               self._resume_error)
        self._write("run-start")
        if reap and self._runs is not None:
            self._reap_earlier_runs()
        self._host_job: _AppJob | None = self._open_host_job() if host_job else None
        self._lock_dir = self._session_lock_dir()

    # -- plumbing ------------------------------------------------------------------
    def _open_audit(self, opts: dict[str, Any], *, required: bool) -> None:
        try:
            w = _audit.AuditWriter(self.state_dir, **opts)
        except _audit.AuditDirError as exc:
            if required:
                raise
            why = str(exc)
        else:
            if w.reason is None:
                self._audit = w
                return
            w.close()
            why = f"cannot create the audit directory: {w.reason}"
            if required:
                raise _audit.AuditDirError(why)
        self.audit_error = why
        self._audit_opts = None
        warnings.warn(f"tether host {self.app!r}: audit log OFF (no reaping of earlier runs, "
                      f"no resume across restarts): {why}", AuditWarning, stacklevel=3)

    def _write(self, event: str, **fields: Any) -> None:
        if self._audit is None or (not self._own_job and event in ("run-start", "run-end")):
            return  # (a host of one session: its session's records say it all)
        me = identity.own()
        fields.setdefault("run", self.run)
        fields.setdefault("owner", {"pid": os.getpid(), "start": me.token() if me else None})
        fields.setdefault("app", self.app)
        self._audit.write(event, **fields)

    def _job(self, name: str, **kwargs: Any) -> _AppJob:
        state_dir = self.state_dir if self._audit_opts is not None else None
        return _AppJob(name=name, app=self.app, audit_opts=self._audit_opts,
                       state_dir=state_dir, **kwargs)

    def _capture(self, plan: Any) -> None:
        """Before a reap signals anything: read what it will end while it still
        runs (process group, parent, command line: for the report only)."""
        for e in plan.ended:
            ticks, _, _boot = str(e.start or "").partition("@")
            cur = identity.read(int(e.pid))
            if cur is not None and str(cur.start) == ticks:
                self._seen[_key(cur)] = cur
                self._cmdlines[_key(cur)] = identity.cmdline(cur.pid)

    def _reap_earlier_runs(self) -> None:
        try:
            from .reaper import reap
        except ImportError as exc:  # the reaper is a separate room; say so, do not fail
            self.reap_error = f"reaper not available: {exc}"
            logger.warning("tether host %r: %s", self.app, self.reap_error)
            return

        def announce(plan: Any) -> None:
            self._capture(plan)
            by_key: dict[str, list[Any]] = {}
            for e in plan.ended:
                if e.session is not None:
                    by_key.setdefault(e.session, []).append(e)
            for key, ended in by_key.items():
                self._announce(self._resumed(RESUME, key, ended, planned=True))

        try:
            self.reap_report = reap(self.state_dir, app=self.app, grace=self.grace,
                                    exclude_runs={self.run}, runs=self._runs, announce=announce)
        except (TetherError, OSError, ValueError) as exc:  # a failed reap must not stop the app
            self.reap_error = f"{type(exc).__name__}: {exc}"
            logger.warning("tether host %r: reaping earlier runs failed: %s", self.app,
                           self.reap_error)
            return
        # The reap used the log as read above: say what that read saw.
        self.reap_report.log_stats = self._read_stats
        self.reap_report.notes[:0] = self._read_notes
        for e in self.reap_report.ended:
            if e.session is not None:
                self._reaped.setdefault(e.session, []).append(e)
        if self.reap_report.ended:
            logger.info("tether host %r: %s", self.app, str(self.reap_report).strip())

    def _open_host_job(self, name: str | None = None, grace: float | None = None,
                       **kwargs: Any) -> _AppJob:
        """The host's job (``host_job=False``: the session's, ``kwargs`` its own;
        refused under ``require="kernel"``: raised, nothing written)."""
        name = self.app if name is None else name
        grace = self.grace if grace is None else grace
        try:
            job = self._job(name, mechanism=self.mechanism, grace=grace,
                            require=self.require, **kwargs)
        except JobRefused as exc:
            self._disable(str(exc))
            if not self._own_job and self.require == "kernel":
                raise JobRefused(f"process-tree ownership could not be established: {exc}",
                                 reason=str(exc)) from exc
            return self._job(name, mechanism="none", reason=str(exc), grace=grace, **kwargs)
        if job.guarantee.disabled:
            self._disable(job.guarantee.disabled)
        return job

    def _disable(self, reason: str) -> None:
        self.safety_net_disabled = reason
        if not self.allow_unprotected:
            # Fail closed: every agent launch will say so, and start nothing.
            logger.warning("tether host %r: no process-tree ownership (%s): agent launches "
                           "will be refused (Host(allow_unprotected=True) runs them "
                           "unprotected)", self.app, reason)
            return
        # One warning, through the warnings system (logging.captureWarnings
        # routes it to logging); apps can escalate SafetyNetWarning to an error.
        warnings.warn(f"orphan-on-crash safety net DISABLED: {reason}", SafetyNetWarning,
                      stacklevel=4)

    def _session_lock_dir(self) -> Path | None:
        """Where session keys are held: ``<state_dir>/sessions``, else (auditing
        off) a private directory under the temporary directory, else under
        ``$XDG_RUNTIME_DIR/tether``, else under the default state directory.
        A directory that is not ours or that others may write
        (``$TMPDIR/tether-<uid>`` made first by another user) is refused,
        never shared: the next one is used."""
        if hasattr(os, "geteuid"):
            uid: Any = os.geteuid()
        else:
            import getpass

            uid = getpass.getuser()
        # (base, a directory that must be ours already: $XDG_RUNTIME_DIR itself)
        bases: list[tuple[Path, Path | None]] = []
        if self._audit is not None:
            bases.append((self.state_dir, None))
        bases.append((Path(tempfile.gettempdir()) / f"tether-{uid}", None))
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        if os.path.isabs(runtime):
            bases.append((Path(runtime) / "tether", Path(runtime)))
        try:
            bases.append((_audit.default_state_dir(), None))
        except (TetherError, OSError, RuntimeError):
            pass  # no home to fall back on
        why = "no directory"
        for base, parent in bases:
            try:
                if parent is not None:
                    _audit.check_dir(parent, create=False)
                _audit.check_dir(base)
                return _audit.check_dir(base / "sessions")
            except (TetherError, OSError) as exc:
                (logger.warning if isinstance(exc, _audit.AuditDirError) else logger.info)(
                    "tether host %r: not holding session keys in %s: %s", self.app, base, exc)
                why = str(exc)
        logger.warning("tether host %r: session keys are held within this process only: %s",
                       self.app, why)
        return None

    def _announce(self, plan: EndedWork) -> None:
        if not plan:
            return
        logger.info("%s", plan.announcement())
        if self.announce is not None:
            try:
                self.announce(plan)
            except Exception:  # noqa: BLE001 - an app's callback must not block a stop
                logger.exception("tether host %r: announce callback failed", self.app)

    def _forget(self, session: Session) -> None:
        with self._lock:
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]

    # -- state ------------------------------------------------------------------------
    @property
    def job(self) -> _AppJob:
        """The host job, inside which every session's job runs (``host_job=False``:
        the session's job; ``RuntimeError`` before it is opened)."""
        if self._host_job is None:
            raise RuntimeError(f"host {self.app!r} (host_job=False) has no session open yet")
        return self._host_job

    @property
    def guarantee(self) -> _base.Guarantee:
        """What protects every session's processes (``disabled`` says when nothing does)."""
        return self.job.guarantee

    @property
    def sessions(self) -> dict[str, Session]:
        """Open sessions by key."""
        with self._lock:
            return dict(self._sessions)

    @property
    def background_jobs(self) -> list[BackgroundJob]:
        return list(self._background)

    def members(self) -> list[Identity]:
        """Every live process of every session (background and detached left out)."""
        seen: dict[int, Identity] = {}
        for m in self._host_job.members() if self._host_job is not None else ():
            seen[m.pid] = m
        for s in self.sessions.values():
            for m in s.members():
                seen[m.pid] = m
        return list(seen.values())

    def __repr__(self) -> str:
        mechanism = self._host_job.mechanism if self._host_job is not None else "-"
        return f"<tether.Host {self.app!r} {mechanism} sessions={len(self._sessions)}>"

    # -- sessions ---------------------------------------------------------------------
    def session(self, key: str, *, grace: float | None = None,
                take_over: bool = False, take_over_before: float | None = None) -> Session:
        """The session ``key``: a job inside the host job.

        Returns the open one if this host already has it. Otherwise it holds
        the key - one copy per key: a key a live run of this app holds raises
        :class:`SessionHeld` (its pid and start), or with ``take_over=True``
        that copy is ended (announced) and the key taken over - then ends a
        copy of ``key`` left alive by an earlier run that is over (the resume
        rule). What it ended is ``session.resumed`` (a :class:`Resumed`).
        Raises ``JobRefused`` (``process-tree ownership could not be
        established: ...``) when the host has no safety net and
        ``require="kernel"`` was asked for. ``take_over_before`` (a
        ``time.time()``, e.g. when the take-over was asked for): only a copy
        that took the key before then is taken over; one that took it later -
        a concurrent take-over that won - raises :class:`SessionHeld`, so of
        two take-overs at the same moment exactly one runs.
        """
        if not isinstance(key, str) or not key.strip():  # ("" would be one key for every caller)
            raise ValueError(f"session key must be a non-empty string, not {key!r}")
        with self._lock:
            if self._closed:
                raise HostClosed(f"host {self.app!r} is closed")
            existing = self._sessions.get(key)
            if existing is not None and not existing.closed:
                return existing
            if not self._own_job and self._host_job is not None:
                raise ValueError(f"host {self.app!r} (host_job=False) holds one session: "
                                 f"{self._host_job.session!r}, not {key!r}")
            if self.safety_net_disabled and self.require == "kernel":
                raise JobRefused("process-tree ownership could not be established: "
                                 f"{self.safety_net_disabled}", reason=self.safety_net_disabled)
            g = self.grace if grace is None else check_grace(grace)
            lock, taken = self._hold_key(key, take_over, take_over_before)
            try:
                resumed = self._resume(key, lock.previous, taken, take_over)
                name = f"{self.app}:{key}"
                if not self._own_job:
                    job = self._host_job = self._open_host_job(name, g, session=key)
                    if self.safety_net_disabled and self.require == "kernel":
                        job.close()  # opened, but with no safety net
                        raise JobRefused("process-tree ownership could not be established: "
                                         f"{self.safety_net_disabled}",
                                         reason=self.safety_net_disabled)
                elif self.job.mechanism == "none":
                    job = self._job(name, mechanism="none", grace=g,
                                    reason=self.safety_net_disabled, session=key)
                else:
                    job = self._job(name, mechanism=self.job.mechanism, grace=g,
                                    require=self.require, parent=self.job, session=key)
            except BaseException:
                lock.release()
                raise
            s = Session(self, key, job, resumed, lock)
            self._sessions[key] = s
            if isinstance(lock, _SessionLock):
                _OPEN[str(lock.path)] = s
            return s

    def _me(self, key: str) -> dict[str, Any]:
        me = identity.own()
        return {"app": self.app, "session": key, "run": self.run, "pid": os.getpid(),
                "start": me.token() if me is not None else None, "ts": time.time()}

    def _hold_key(self, key: str, take_over: bool, before: float | None = None
                  ) -> tuple[_SessionLock | _LocalLock, Resumed | None]:
        """Hold ``key`` for this host; (the lock, what a take-over ended)."""
        if self._lock_dir is None:
            return _LocalLock(), None
        lock = _SessionLock(self._lock_dir, self.app, key)
        try:
            held = lock.acquire(self._me(key))
        except OSError as exc:  # the directory went away (a cleaned /tmp): once more, then local
            try:
                _audit.check_dir(self._lock_dir)
                held = lock.acquire(self._me(key))
            except (TetherError, OSError):
                logger.warning("tether host %r: session %r held within this process only: %s",
                               self.app, key, exc)
                return _LocalLock(), None
        if held is None:
            return lock, None
        info, ino = held
        if not take_over:
            raise _held(self.app, key, info)
        since = info.get("ts")
        if before is not None and isinstance(since, (int, float)) and since > before:
            raise _held(self.app, key, info, "it took the key after this take-over was asked "
                        "for (a concurrent take-over won)")
        mine = _OPEN.get(str(lock.path)) if info.get("pid") == os.getpid() else None
        if mine is not None and not mine.closed:
            # Another Host of this process holds it: its run is ours, so no reap
            # can tell the two apart - stop that session itself (announced).
            ended = mine.stop(TAKE_OVER)
            taken = Resumed(TAKE_OVER, key, tasks=ended.tasks, processes=ended.processes,
                            holder=os.getpid())
        else:
            taken = self._take_over(key, info)
        if not lock.break_(ino) or lock.acquire(self._me(key)) is not None:
            raise _held(self.app, key, info, "it could not be taken over (held again at once)")
        return lock, taken

    def _take_over(self, key: str, info: dict[str, Any]) -> Resumed:
        """End the copy of ``key`` that the live run named by ``info`` holds
        (and what runs that are over left of it)."""
        if self._audit is None:
            raise _held(self.app, key, info, "with the audit log off its processes cannot be "
                        "proven, so it cannot be taken over")
        from .reaper import reap
        from .runs import read_runs

        # fresh: the holder may have started after this host; a lazy host reads
        # only the files written since the holder took the key (a minute's margin)
        since = info.get("ts") if self._lazy_log else None
        runs = read_runs(self.state_dir,
                         since=since - 60 if isinstance(since, (int, float)) else None)
        holder = info.get("pid") if type(info.get("pid")) is int else None
        run = info.get("run") if isinstance(info.get("run"), str) else None

        def announce(plan: Any) -> None:
            self._capture(plan)
            self._announce(self._resumed(TAKE_OVER, key, plan.ended, runs, planned=True,
                                         holder=holder))

        rep = reap(self.state_dir, app=self.app, session=key, grace=self.grace,
                   exclude_runs={self.run}, runs=runs, announce=announce, take_over=run)
        ended = list(self._reaped.pop(key, [])) + rep.ended
        out = self._resumed(TAKE_OVER, key, ended, runs, holder=holder)
        if rep.survived:
            out.note = "some of its processes could not be ended"
        logger.warning("tether host %r: %s", self.app, out or f"took over {key!r} from pid "
                       f"{holder}: nothing of its copy was running")
        return out

    def _resume(self, key: str, previous: dict[str, Any], taken: Resumed | None,
                take_over: bool = False) -> Resumed:
        """The resume rule: end what an earlier run that is over left of
        session ``key`` - the reaper, filtered to that key."""
        if taken is not None:
            return taken  # the take-over's reap was the resume rule too
        ended = list(self._reaped.pop(key, []))  # what the start-up reap ended of this key
        if self._lazy_log and not isinstance(previous.get("run"), str):
            # Its last holder released it (or none ever held it): no copy of it
            # can be left, and the log is not read at all.
            return self._resumed(RESUME, key, ended)
        runs = self._runs
        since = previous.get("ts")
        if self._lazy_log and isinstance(since, (int, float)):
            # Its last holder died holding it: what proves its copy was written
            # after it took the key - read only the files written since (a
            # minute's margin: its run began a moment before).
            with contextlib.suppress(TetherError, OSError, ValueError):
                from .runs import read_runs

                runs = read_runs(self.state_dir, since=since - 60)
        if self._resume_error is not None:
            report = self._resumed(RESUME, key, ended)
            report.note = f"resume check failed: {self._resume_error}"
            return report
        last = previous.get("run") if isinstance(previous.get("run"), str) else None
        if last is not None and runs is not None and last not in runs and last != self.run \
                and not self._lazy_log:  # (a lazy log was read just now)
            # The key's last holder died without releasing it, and started after
            # this host read the log: read it again, or its copy is missed.
            with contextlib.suppress(TetherError, OSError, ValueError):
                from .runs import read_runs

                runs = read_runs(self.state_dir)
        from .reaper import OWNER_ALIVE, reap

        def announce(plan: Any) -> None:
            self._capture(plan)
            self._announce(self._resumed(RESUME, key, plan.ended, runs, planned=True))

        try:
            rep = reap(self.state_dir, app=self.app, session=key, grace=self.grace,
                       exclude_runs={self.run}, runs=runs, announce=announce)
        except (TetherError, OSError, ValueError) as exc:  # must not stop the session
            report = self._resumed(RESUME, key, ended)
            report.note = f"resume check failed: {type(exc).__name__}: {exc}"
            return report
        report = self._resumed(RESUME, key, ended + rep.ended, runs)
        holders = sorted({s.run for s in rep.skipped if s.reason == OWNER_ALIVE})
        if holders and take_over:
            # A live run has processes of this key though it holds no lock (a
            # tether without session locks, or another lock directory): asked
            # to, take its copy over too.
            parts = [report] + [self._take_over(key, {"run": run, "pid": _run_pid(run)})
                                for run in holders]
            return Resumed(TAKE_OVER, key, tasks=[t for r in parts for t in r.tasks],
                           processes=[q for r in parts for q in r.processes],
                           holder=_run_pid(holders[0]))
        if holders:
            # A live run has processes of this key though it holds no lock (a
            # tether without session locks, or another lock directory).
            raise SessionHeld(
                f"session {key!r} of {self.app!r} has processes of a live run "
                f"({', '.join(holders)}) that holds no session lock; take_over=True ends them",
                session=key, run=holders[0], pid=_run_pid(holders[0]))
        return report

    def _resumed(self, reason: str, key: str, ended: list[Any],
                 runs: dict[str, Any] | None = None, *, planned: bool = False,
                 holder: int | None = None) -> Resumed:
        """The reaper's ``Ended`` list as a report in the app's words."""
        runs = self._runs if runs is None else runs
        boot = identity.boot_id()
        members: list[Identity] = []
        roots: dict[tuple[int, int], str] = {}
        snaps: list[dict[str, Any]] = []
        jobs: set[tuple[str, str | None]] = set()
        for e in ended:
            ticks, _, b = str(e.start or "").partition("@")
            if not ticks.isdigit():
                continue
            k = (int(e.pid), int(ticks))
            ident = self._seen.get(k) or Identity(k[0], k[1], b or boot, comm=e.comm or "")
            members.append(ident)
            if e.recorded:
                roots[k] = e.label or e.comm or str(e.pid)
            jobs.add((e.run, e.job))
        for run_id, job in sorted(jobs, key=str):
            run_info = runs.get(run_id) if runs else None
            info = run_info.jobs.get(job) if run_info is not None and job else None
            if info is not None and info.tasks:
                snaps.extend(info.tasks)
        ledger = Ledger.restore(snaps, boot)
        agent = [members[i] for i, m in enumerate(members) if _key(m) in roots]
        for a in agent:
            ledger.not_a_task(a)
        cmdlines = {p: c for (p, _t), c in self._cmdlines.items()}
        report = _report(Resumed, reason, key, members, roots, agent, ledger,
                         lambda pid: cmdlines.get(pid, ""),
                         with_idle_tasks=bool(roots), planned=planned, holder=holder)
        assert isinstance(report, Resumed)
        return report

    # -- background and detached ------------------------------------------------------------
    def background_job(self, name: str, cpu_percent: int | None = 25,
                       timeout: float | None = None, *, grace: float | None = None) -> BackgroundJob:
        """A job that is NOT ended with the host: CPU-capped, low priority,
        bounded by ``timeout`` seconds, recorded ``background`` (never reaped).
        Never refused for want of a safety net: it is meant to outlive the app."""
        if not name or not isinstance(name, str):
            raise ValueError(f"background job name must be a non-empty string, not {name!r}")
        if cpu_percent is not None and not 1 <= int(cpu_percent) <= 100:
            raise ValueError("cpu_percent must be between 1 and 100")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        # A background job is never nested in the host job (the host's death
        # would take it along) and never in a PID namespace (it outlives its
        # owner on purpose; the transparent mechanisms keep its PIDs real).
        mech = self.mechanism if self.mechanism in ("cgroup", "subreaper", "pgroup") else "auto"
        job = self._job(f"{self.app}:bg:{name}", mechanism=mech,
                        grace=self.grace if grace is None else check_grace(grace),
                        background=True, cpu_percent=cpu_percent)
        limits: list[str] = []
        if _LINUX:
            keeper = job.trace().get("keeper_pid")
            if keeper:
                limits += _lower_priority(int(keeper))
            if cpu_percent is not None:
                limits.append(_cpu_max(job.trace().get("cgroup_path"), int(cpu_percent)))
        elif cpu_percent is not None:
            limits.append(f"cpu {cpu_percent}% (by the platform backend)")
        bg = BackgroundJob(self, name, job, cpu_percent, timeout, limits)
        self._background.add(bg)
        return bg

    def launch_detached(self, argv: Sequence[Any], *, cwd: Any = None,
                        env: dict[str, str] | None = None, stdin: Any = subprocess.DEVNULL,
                        stdout: Any = subprocess.DEVNULL,
                        stderr: Any = subprocess.DEVNULL) -> subprocess.Popen[Any]:
        """Start ``argv`` to outlive the app on purpose (an editor, a browser).

        Outside every job: a plain ``Popen`` in a new session, recorded as
        ``detached`` so no reaper ever touches it. (If the app itself runs
        inside a tether job, that outer job still holds it.) Never refused
        for want of a safety net: it is meant to outlive the app.
        """
        p = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                             stderr=stderr, start_new_session=True, close_fds=True)
        self._write("spawn", **_audit.spawn_fields(pid=p.pid, identity=identity.read(p.pid),
                                                   detached=True, in_job=False))
        self.detached.append(p)
        return p

    # -- ending ----------------------------------------------------------------------
    def close(self, reason: str = APP_EXIT) -> list[EndedWork]:
        """Stop every open session (announced), close the host job. Background
        jobs and detached launches are left running, on purpose. Idempotent.
        In a forked child of the host's process it ends nothing and releases
        no key: it lets go of the child's copies (see ``Session.close``)."""
        job = self._host_job  # (None: a host of one session that opened none)
        forked = job is not None and job._forked()
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            sessions = list(self._sessions.values())
        if forked:
            for s in sessions:
                s.job.close()  # (lets go)
            if job is not None:
                job.close()
            return []
        reports = []
        try:
            for s in sessions:
                reports.append(s.stop(reason))
        finally:
            try:
                if job is not None:
                    job.close()
            finally:
                self._write("run-end")
                if self._audit is not None:
                    self._audit.close()
        return reports

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _run_pid(run: str) -> int | None:
    head = run.split("-", 1)[0]
    return int(head) if head.isdigit() else None
